#pragma once

// Redis Streams as a broker (SPEC §10, §11): a MessageSource on a consumer group of a stream and
// a MessageSink appending to a stream, on a standalone Redis 7 (or the Redis Cluster node that
// holds the stream's slot: this module does not route cluster slots). hiredis stays private.
//
// URLs
//   source: redis+stream://[[USER]:PASS@]HOST[:PORT]/STREAM?group=GROUP[&db=N][&dead_letter=STREAM]
//           [&start=0|$]
//   sink:   redis+stream://[[USER]:PASS@]HOST[:PORT]/STREAM[?maxlen=N][&db=N]
// The port defaults to 6379. User, password, stream and parameter values are percent-decoded;
// a lone userinfo (`redis+stream://PASS@host/s`) is the default user's password, as redis-cli
// reads it. The userinfo ends at the URL's last '@' (as redact_url reads it), so an '@' in a
// stream or group name is written %40. Unknown parameters are refused, by name.
//   group        the consumer group (sources: required)
//   dead_letter  where dead_letter() copies a message; default "STREAM:dead-letter"
//   start        where the group starts if this source creates it (XGROUP CREATE ... MKSTREAM):
//                "0" (the default) delivers what was published before the first consumer came
//                up, so nothing published early is lost; "$" skips it and starts with what comes
//                next. An existing group keeps its position either way.
//   maxlen       sinks: trims the stream (or a message's destination stream) to about N entries
//                on each append (XADD MAXLEN ~ N).
//                Trimming drops the oldest entries whether or not a group has delivered them.
//   db           the database to SELECT (default 0)
//
// Entry encoding: one stream entry per message, its fields (binary-safe Redis strings) in order:
//   message_id    the producer's id; absent when OutgoingMessage::message_id is empty, which a
//                 source delivers as has_message_id = false
//   content_type  absent when empty
//   ordering_key  OutgoingMessage::ordering_key, absent when empty; a header of that name is not
//                 written (h:ordering_key would come back as a second value). Reading, one that
//                 is no valid_ordering_key is ignored (the delivery has none)
//   h:NAME        one field per header, value as it is, in the producer's order, repeats kept
//   body          always present (an entry needs at least one field)
// One field per header rather than one JSON object: field names and values are byte strings to
// Redis, so any name or value (NUL, CR/LF, non-UTF-8) round-trips unescaped, order and repeated
// names survive (a JSON object keeps neither), and the entries stay readable in redis-cli and
// writable by producers in any language. Reading, the first message_id / content_type /
// ordering_key / body field counts; any other field without the "h:" prefix (a foreign producer's, or a dead
// letter's reason fields) is delivered as a header of its own name, so nothing written is lost.
//
// Dead letters are entries of the dead-letter stream: the message's fields as above, then
// reason, detail, last_error, attempts, source_stream and source_id (the original entry id).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "idem/broker.hpp"

namespace idem {

/// Which end a redis+stream:// URL is for: they accept different parameters.
enum class RedisStreamRole : std::uint8_t { source, sink };

/// A parsed redis+stream:// URL.
struct RedisStreamUrl {
  std::string host;
  int port = 6379;
  std::string user;      ///< ACL user for AUTH; empty: the default user
  std::string password;  ///< empty: no AUTH
  int db = 0;
  std::string stream;
  std::string group;                    ///< sources
  std::string dead_letter;              ///< sources; "STREAM:dead-letter" unless given
  std::string start = "0";              ///< sources: "0" or "$" (see above)
  std::optional<std::uint64_t> maxlen;  ///< sinks: approximate trimming, when set
};

/// Parses a source's or a sink's URL; `invalid` says what is wrong, never quoting the password.
BrokerResult<RedisStreamUrl> parse_redis_stream_url(std::string_view url, RedisStreamRole role);

/// What a stream source reports besides its results. Optional.
struct RedisStreamEvents {
  /// A line for the log, on the thread that uses the source: pending entries that were deleted
  /// from the stream before they were acked (trimmed by MAXLEN, XDEL), acked so that they do not
  /// stay pending forever; a consumer group created again after it vanished.
  std::function<void(std::string_view line)> on_warning;
};

/// Opens a source: connects, creates the group if it does not exist, and returns it. Its consumer
/// name is SourceSettings::consumer, or "HOSTNAME-PID". A receive returns at most min(max,
/// prefetch) deliveries. Delivery::broker_ref is the entry id (what ack, requeue and dead_letter
/// act on; ids stay valid across reconnects, so nothing goes stale); delivery_count is XPENDING's
/// count for entries read again or claimed, 1 for new ones; handle numbers this source's
/// deliveries and connection identifies the source (a delivery of another is refused). On its
/// first receive it redelivers what is still pending for its consumer name (a restart under the
/// same name); then new entries, and every claim_idle/2 it takes over entries pending longer than
/// claim_idle with other consumers (XAUTOCLAIM). requeue() hands an entry back to this consumer's
/// own pending list, redelivered on the next receive; if this consumer goes away first, another
/// takes it over once it has been idle for claim_idle. An entry delivered by a read whose reply
/// was lost with the connection is taken over the same way. Errors: invalid (URL, settings),
/// refused (login, ACL, not a stream, a cluster node not holding the stream), unavailable.
BrokerResult<std::unique_ptr<MessageSource>> open_redis_stream_source(std::string_view url,
                                                                      const SourceSettings& settings,
                                                                      RedisStreamEvents events = {});

/// Opens a sink: connects and returns it. Each publish pipelines one XADD per message and reads
/// every reply. A reply is the broker's confirmation: the entry is appended, as durable as the
/// server's persistence makes it (appendonly, with appendfsync always or everysec). A connection
/// that broke mid-batch leaves the unanswered messages unavailable and in doubt, and is opened
/// again on the next publish. OutgoingMessage::destination, when set, names another stream. A
/// message whose ordering key is no valid_ordering_key is rejected, unsent.
BrokerResult<std::unique_ptr<MessageSink>> open_redis_stream_sink(std::string_view url, const SinkSettings& settings);

}  // namespace idem
