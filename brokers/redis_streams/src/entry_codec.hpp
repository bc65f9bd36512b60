#pragma once

// Messages as stream entries (the encoding documented in idem/redis_stream_broker.hpp), entry
// ids, and the shapes of the stream commands' replies.

#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/broker.hpp"
#include "idem/redis_wire/reply.hpp"

namespace idem::redis_streams {

/// Field names of the encoding.
inline constexpr std::string_view kMessageIdField = "message_id";
inline constexpr std::string_view kContentTypeField = "content_type";
inline constexpr std::string_view kOrderingKeyField = kOrderingKeyHeader;
inline constexpr std::string_view kBodyField = "body";
inline constexpr std::string_view kHeaderPrefix = "h:";

/// Appends the field/value arguments of XADD for a message (after `XADD key [MAXLEN ~ N] *`).
void append_fields(const OutgoingMessage& message, std::vector<std::string>& args);

/// The same for a delivery being copied elsewhere (a dead letter): its id only if it had one.
void append_fields(const Delivery& delivery, std::vector<std::string>& args);

/// Fills the message parts of `out` (message_id, has_message_id, content_type, ordering_key,
/// headers, body) from an entry's flat field list [f1, v1, f2, v2, ...]; an error for a list that
/// is not pairs of strings. An ordering_key field that is no valid_ordering_key is ignored.
std::expected<void, std::string> decode_fields(const std::vector<redis_detail::Reply>& fields, Delivery& out);

/// A stream entry id "MS-SEQ".
struct EntryId {
  std::uint64_t ms = 0;
  std::uint64_t seq = 0;
  auto operator<=>(const EntryId&) const = default;
};

/// Parses "MS-SEQ" (both parts required, as the server writes ids).
std::optional<EntryId> parse_entry_id(std::string_view text);

/// The greatest id below `id` ("5-0" -> "4-18446744073709551615"; "0-0" has none): reading a
/// consumer's pending list after it gives exactly the entries from `id` on.
std::optional<std::string> previous_id(std::string_view id);

/// One entry of a reply: its id and its fields, or nullopt when the entry was deleted from the
/// stream while still pending (a pending-list read or a claim returns the id alone then).
struct RawEntry {
  std::string id;
  std::optional<std::vector<redis_detail::Reply>> fields;
};

/// The entries of an XRANGE-shaped array [[id, [f, v, ...] | nil], ...].
std::expected<std::vector<RawEntry>, std::string> parse_entries(const redis_detail::Reply& reply);

/// The entries of one stream in an XREADGROUP reply [[stream, entries]] (nil: none arrived).
std::expected<std::vector<RawEntry>, std::string> parse_read_reply(const redis_detail::Reply& reply);

/// An XAUTOCLAIM reply: [next cursor, entries, ids deleted from the stream] (Redis 7; 6.2 has no
/// third element).
struct ClaimReply {
  std::string cursor;
  std::vector<RawEntry> entries;
  std::vector<std::string> deleted;
};
std::expected<ClaimReply, std::string> parse_claim_reply(const redis_detail::Reply& reply);

/// The delivery counts of an extended XPENDING reply [[id, consumer, idle ms, count], ...],
/// in its order.
std::expected<std::vector<std::pair<std::string, std::uint32_t>>, std::string> parse_pending_counts(
    const redis_detail::Reply& reply);

}  // namespace idem::redis_streams
