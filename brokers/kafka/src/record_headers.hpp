#pragma once

// How messages map onto Kafka records and back: the id and content type travel as headers (or
// the id as the key), the rest of the headers as they are. No librdkafka here: unit-tested.

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
/// (when set), then its own headers, except any of those two names (a message passed on by
/// idem again would carry two ids otherwise).
std::vector<std::pair<std::string_view, std::string_view>> outgoing_headers(const OutgoingMessage& m, std::string_view id_header);

/// A record as read, before it is a Delivery. A header's value may be null (nullopt).
struct IncomingRecord {
  std::optional<std::string_view> key;
  std::vector<std::pair<std::string_view, std::optional<std::string_view>>> headers;
  std::string_view value;
};

/// The Delivery's id, content type, headers and body, from a record: the id is the first
/// `id_header` header with a value (or, with KafkaIdFrom::key, the key), content_type the first
/// content_type header; the other headers keep their order (a null value reads as empty).
void decode_record(const IncomingRecord& record, std::string_view id_header, KafkaIdFrom id_from, Delivery& out);

/// Where a dead letter came from.
struct DeadLetterOrigin {
  std::string topic;
  std::int32_t partition = 0;
  std::int64_t offset = 0;
};

/// The dead-letter copy's headers: the id (when it has one) and content type as the sink
/// writes them, the original's other headers except our own x-idem-* ones (a message
/// dead-lettered before and replayed carries old ones), then x-idem-reason, x-idem-detail,
/// x-idem-last-error, x-idem-attempts, x-idem-source (the topic), x-idem-partition and
/// x-idem-offset.
std::vector<std::pair<std::string, std::string>> dead_letter_headers(const Delivery& d, const DeadLetterReason& why,
                                                                     std::string_view id_header, const DeadLetterOrigin& origin);

}  // namespace idem::kafka_detail
