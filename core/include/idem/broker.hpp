#pragma once

// What idem needs of a message broker (SPEC §10, §11): a source that delivers messages at least
// once and takes acknowledgements, and a sink that publishes with the broker's confirmation.
// Each broker is a module of its own (brokers/amqp, brokers/redis_streams) implementing these
// interfaces; its C library never reaches a public header. The consume loop
// (idem/consume_loop.hpp), idem-consume and idem-relay know only these interfaces.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/clock.hpp"
#include "idem/result.hpp"

namespace idem {

/// Why a broker call failed.
enum class BrokerErrc : std::uint8_t {
  unavailable,  ///< cannot reach the broker, or the connection broke: try again (the source reconnects)
  timeout,      ///< no answer in time; a publish may or may not have been taken (in_doubt)
  refused,      ///< the broker refused us: wrong credentials, no access to the vhost/queue/stream, a
                ///< queue declared with other arguments; an operator must act, retrying will not help
  rejected,     ///< the broker refused this one message (a negative publisher confirm, over its
                ///< size limit); other messages may go
  stale,        ///< an ack/requeue/dead-letter for a delivery of a connection that has since been
                ///< replaced: the broker redelivers that message, nothing was done
  invalid,      ///< bad arguments (a malformed URL, an option out of range)
  internal,     ///< a bug or an unexpected answer
};

/// "unavailable", "timeout", ...
std::string_view to_string(BrokerErrc code);

/// A failed broker call: what happened, and what the caller may do about it.
struct BrokerError {
  BrokerErrc code = BrokerErrc::internal;
  std::string message;  ///< never holds a password: URLs in it went through redact_url
  /// True when the call may have taken effect although it failed (a publish whose confirm was
  /// lost with the connection): publishing again may duplicate, never lose.
  bool in_doubt = false;

  /// Whether the same call may succeed if tried again later.
  bool retryable() const { return code == BrokerErrc::unavailable || code == BrokerErrc::timeout; }
};

/// A broker call's value or its error.
template <class T>
using BrokerResult = std::expected<T, BrokerError>;

/// Headers of a message, in the producer's order; names as the producer wrote them.
using MessageHeaders = std::vector<std::pair<std::string, std::string>>;

/// The header (broker message header, stream field, SQS message attribute) that carries a
/// message's ordering key on every broker, beside what the broker itself groups by.
inline constexpr std::string_view kOrderingKeyHeader = "ordering_key";
/// The longest ordering key: SQS's bound on a MessageGroupId.
inline constexpr std::size_t kMaxOrderingKey = 128;

/// Whether `key` can be an ordering key: 1-128 visible ASCII characters (what an SQS FIFO
/// MessageGroupId, a Kafka key, a header and an HTTP header value all carry unchanged).
bool valid_ordering_key(std::string_view key);

/// A message as a producer publishes it.
struct OutgoingMessage {
  /// The consumers' dedupe key (SPEC §10): stable across every publish of the same message.
  std::string message_id;
  std::string content_type;
  MessageHeaders headers;
  std::string body;
  /// Where it goes, if not the sink's default: an AMQP routing key, or a stream name.
  std::string destination;
  /// The ordering key (an aggregate id, such as a payment id; empty: none; 1-128 visible ASCII
  /// characters, valid_ordering_key): messages of one key are kept in order where the broker
  /// keeps order by it. The Kafka record key (so it picks the partition), the SQS FIFO
  /// MessageGroupId, and the `ordering_key` header on every broker (docs/consumers.md).
  std::string ordering_key;
};

/// One delivery of a message. Give it back to the source that made it (ack, requeue,
/// dead_letter); the broker's handle in it is meaningless elsewhere.
struct Delivery {
  /// The producer's id (AMQP `message_id`, the stream field `message_id`); empty when the
  /// message has none (has_message_id says which: an empty id is not the same as none).
  std::string message_id;
  bool has_message_id = false;
  std::string content_type;
  MessageHeaders headers;
  std::string body;
  /// The broker says it delivered this message before (AMQP `redelivered`; a stream entry
  /// delivered more than once).
  bool redelivered = false;
  /// How many times the broker delivered it, this time included, as far as the broker knows
  /// (stream: XPENDING's count; AMQP quorum queues: x-delivery-count + 1; otherwise 1, or 2
  /// when redelivered).
  std::uint32_t delivery_count = 1;
  /// The broker's name for this delivery, for logs only (AMQP delivery tag, stream entry id):
  /// never a dedupe key.
  std::string broker_ref;
  /// The source's own handle: delivery tag or entry sequence, and the connection it came on.
  std::uint64_t handle = 0;
  std::uint64_t connection = 0;
  /// The message's ordering key, empty when it has none: the `ordering_key` header, else what
  /// the broker groups by (the Kafka record key, the SQS MessageGroupId). ConsumeLoop's
  /// `ordering = key` runs one message of a key at a time, in delivery order.
  std::string ordering_key;
};

/// Why a message is dead-lettered, as written beside it in the dead-letter queue or stream.
struct DeadLetterReason {
  std::string reason;      ///< one word: missing_id, invalid_id, too_large, poison, rejected, conflict, ...
  std::string detail;      ///< a sentence for the operator
  std::string last_error;  ///< the last handler error, when there was one
  std::uint32_t attempts = 0;
};

/// How a source consumes, whatever the broker. Where it consumes from (queue, stream, group,
/// dead-letter names) is in its URL.
struct SourceSettings {
  /// The most deliveries held unacknowledged at once (AMQP basic.qos prefetch; the stream
  /// reads' COUNT bound). 1-65535.
  std::size_t prefetch = 64;
  /// This consumer's name within its group (stream consumer name; AMQP consumer tag). Empty:
  /// "HOSTNAME-PID", distinct for every process.
  std::string consumer;
  /// Streams: an entry pending with another consumer for longer than this is taken over
  /// (XAUTOCLAIM), since that consumer is presumed dead. Longer than the slowest handler.
  Millis claim_idle = std::chrono::seconds(60);
  /// Connecting, and each call's answer, gives up after this.
  Millis connect_timeout = std::chrono::seconds(5);
  /// A lost connection is opened again after a delay that doubles from `reconnect_min` up to
  /// `reconnect_max`, with jitter.
  Millis reconnect_min = std::chrono::milliseconds(100);
  Millis reconnect_max = std::chrono::seconds(10);
};

/// How a sink publishes, whatever the broker.
struct SinkSettings {
  Millis connect_timeout = std::chrono::seconds(5);
  /// How long a publish waits for the broker's confirmation before it is in doubt.
  Millis confirm_timeout = std::chrono::seconds(10);
};

/// Where messages come from: a queue (AMQP) or a consumer group on a stream.
///
/// One thread uses a source: receive, ack, requeue, dead_letter and ping are called from it.
/// wake() may be called from any thread. Deliveries are acknowledged manually only: until ack
/// or dead_letter, the broker redelivers a message if this consumer goes away.
class MessageSource {
 public:
  virtual ~MessageSource() = default;

  /// Waits up to `wait` for deliveries and returns up to `max` of them (none when the wait ran
  /// out or wake() was called). `max` 0 takes none and returns at once, having served the
  /// connection (heartbeats): the consume loop calls it so while it is full. Reconnects a lost connection first, with backoff; deliveries
  /// of the lost connection become stale, and the broker redelivers them. Errors: refused
  /// (an operator must act), or unavailable while the broker cannot be reached.
  virtual BrokerResult<std::vector<Delivery>> receive(std::size_t max, Millis wait) = 0;

  /// Ends a receive() that is waiting, now or the next time it starts waiting. Any thread.
  virtual void wake() = 0;

  /// Tells the broker these deliveries are done with: it will not deliver them again. A
  /// delivery of a replaced connection is not acked (BrokerErrc::stale for the whole call
  /// only when none could be); the broker redelivers it.
  virtual BrokerResult<Done> ack(std::span<const Delivery> deliveries) = 0;

  /// Hands a delivery back: the broker delivers it again later, to this or another consumer.
  virtual BrokerResult<Done> requeue(const Delivery& delivery) = 0;

  /// Copies the message, with its id, headers and `why`, to the dead-letter queue or stream and,
  /// once the broker has it (publisher confirm, XADD's reply), acks it. At least once: a crash in
  /// between leaves the message in both, and the dead letter's id says so.
  virtual BrokerResult<Done> dead_letter(const Delivery& delivery, const DeadLetterReason& why) = 0;

  /// Checks that the broker answers, for readiness probes.
  virtual BrokerResult<Done> ping() = 0;

  /// The source for logs and metrics: its URL with any password hidden.
  virtual std::string name() const = 0;

  /// How many connections were replaced since the source was opened (the reconnects metric).
  virtual std::uint64_t reconnects() const = 0;
};

/// Where messages go: an AMQP exchange, or a stream.
///
/// One thread uses a sink at a time.
class MessageSink {
 public:
  virtual ~MessageSink() = default;

  /// Publishes the messages, persistent, and waits for the broker to confirm each. One result
  /// per message, in order: ok once the broker has it durably, or why not (rejected: this
  /// message will not go; retryable: try it again; in_doubt: it may have gone).
  virtual std::vector<BrokerResult<Done>> publish(std::span<const OutgoingMessage> messages) = 0;

  /// Checks that the broker answers, for readiness probes.
  virtual BrokerResult<Done> ping() = 0;

  /// The sink for logs and metrics: its URL with any password hidden.
  virtual std::string name() const = 0;
};

}  // namespace idem
