#pragma once

// How messages map onto Kafka records and back: the id, content type and ordering key travel as
// headers (the id may be the key instead; the ordering key is the key too), the rest of the
// headers as they are. No librdkafka here: unit-tested.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/broker.hpp"
#include "idem/kafka_broker.hpp"

namespace idem::kafka_detail {

/// The header carrying the content type, written by the sink and read by the source.
inline constexpr std::string_view kContentTypeHeader = "content_type";

/// A record's headers for an outgoing message: `id_header` (when it has an id), content_type
/// (when set), ordering_key (when set), then its own headers, except any of those three names (a
/// message passed on by idem again would carry two ids otherwise). OutgoingMessage::ordering_key
/// is the only way to give an ordering key: a header of its own named ordering_key is dropped
/// even when the message has none, since the record key would then not be that key.
std::vector<std::pair<std::string_view, std::string_view>> outgoing_headers(const OutgoingMessage& m, std::string_view id_header);

/// The record key of an outgoing message: its ordering key (so that the messages of one key land
/// in one partition, in order), else its message id (the copies of one message then land in one
/// partition), else none (the partitioner spreads such records).
std::optional<std::string_view> record_key(const OutgoingMessage& m);

/// A record as read, before it is a Delivery. A header's value may be null (nullopt).
struct IncomingRecord {
  std::optional<std::string_view> key;
  std::vector<std::pair<std::string_view, std::optional<std::string_view>>> headers;
  std::string_view value;
};

/// The Delivery's id, content type, ordering key, headers and body, from a record: the id is the
/// first `id_header` header with a value (or, with KafkaIdFrom::key, the key), content_type the
/// first content_type header; the other headers keep their order (a null value reads as empty).
/// The ordering key is the first ordering_key header with a value (taken out of the headers like
/// the id); without one, the record key, as foreign producers (Debezium: the aggregate's id) key
/// records by what they order, unless the key is the id (KafkaIdFrom::key) or equals the id read
/// from the header (idem's sink keys a message without an ordering key by its id). A value that
/// is no valid_ordering_key is ignored: the delivery then has no ordering key.
void decode_record(const IncomingRecord& record, std::string_view id_header, KafkaIdFrom id_from, Delivery& out);

/// Where a dead letter came from.
struct DeadLetterOrigin {
  std::string topic;
  std::int32_t partition = 0;
  std::int64_t offset = 0;
};

/// The dead-letter copy's headers: the id (when it has one), content type and ordering key as
/// the sink writes them, the original's other headers except our own x-idem-* ones (a message
/// dead-lettered before and replayed carries old ones), then x-idem-reason, x-idem-detail,
/// x-idem-last-error, x-idem-attempts, x-idem-source (the topic), x-idem-partition and
/// x-idem-offset.
std::vector<std::pair<std::string, std::string>> dead_letter_headers(const Delivery& d, const DeadLetterReason& why,
                                                                     std::string_view id_header, const DeadLetterOrigin& origin);

}  // namespace idem::kafka_detail
