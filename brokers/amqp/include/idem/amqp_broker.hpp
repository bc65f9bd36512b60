#pragma once

// The RabbitMQ (AMQP 0-9-1) broker module: a MessageSource consuming a queue with manual acks and
// a dead-letter queue, and a MessageSink publishing with publisher confirms (idem/broker.hpp).
// librabbitmq stays private: amqp.h is included only under src/.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "idem/broker.hpp"

namespace idem {

/// What an amqp:// URL is for: the query parameters each takes differ.
enum class AmqpUrlRole : std::uint8_t {
  source,  ///< `?queue=...`: consume a queue
  sink,    ///< `?exchange=...&routing_key=...`: publish to an exchange
};

/// An amqp:// or amqps:// URL, parsed:
///   amqp[s]://[USER[:PASSWORD]@]HOST[:PORT][/VHOST][?PARAMETERS]
/// User, password and vhost are percent-decoded (`%2f` is "/"); an empty path is vhost "/".
/// amqps:// is TLS (see `tls`).
struct AmqpUrl {
  std::string host = "localhost";
  int port = 5672;
  /// guest/guest only when the URL has no userinfo at all; `amqp://u@host` has an empty password.
  std::string user = "guest";
  std::string password = "guest";
  std::string vhost = "/";

  /// Source: the queue consumed (`queue=`, required).
  std::string queue;
  /// Source: where dead_letter() publishes the copy (`dead_letter_exchange=`), with the source
  /// queue's name as routing key.
  std::string dead_letter_exchange = "idem.dead-letter";
  /// Source: the queue bound to it for that routing key (`dead_letter_queue=`; default
  /// "<queue>.dead-letter"); only declared and bound, never read by the source.
  std::string dead_letter_queue;

  /// Sink: the exchange published to (`exchange=`); empty is the default exchange, where the
  /// routing key is a queue's name.
  std::string exchange;
  /// Sink: the routing key of a message without a `destination` (`routing_key=`).
  std::string routing_key;

  /// `declare=true|false`: on each connect, declare (durable) what is missing. Source: the queue,
  /// the dead-letter exchange (direct) and queue, and their binding. Sink: the exchange (direct),
  /// or with the default exchange the routing key's queue. Existing ones are left as they are
  /// (passive declare first), so a queue created with other arguments (quorum, TTL) is kept.
  bool declare = true;
  /// Source: `single_active_consumer=true` declares the queue (when it does not exist yet) with
  /// `x-single-active-consumer`: RabbitMQ then delivers to one consumer at a time and hands over
  /// to the next when it goes, so the queue's order holds with several consumers running (what
  /// ordering = "key" needs on RabbitMQ; docs/consumers.md). An existing queue keeps its
  /// arguments: declare it so yourself.
  bool single_active_consumer = false;
  /// `heartbeat=SECONDS` proposed to the broker (0: none); a connection that stays silent for
  /// twice as long is taken as lost.
  std::chrono::seconds heartbeat{30};

  /// amqps://: TLS (1.2 or later) to the broker, port 5671 by default. The broker's certificate
  /// is always verified, chain and host name (the URL's host: a DNS name or an IP address in its
  /// subjectAltName), against `cacertfile=PATH` or else the system's trust store.
  bool tls = false;
  std::string ca_file;    ///< `cacertfile=`: PEM CA certificates to trust instead of the system's
  std::string cert_file;  ///< `certfile=`: a client certificate (PEM) for mutual TLS; needs keyfile
  /// `keyfile=`: its private key (PEM), read under read_private_file's rules (mode 0600 or 0640).
  std::string key_file;
  /// `passphrasefile=`: for an encrypted key, a file whose first line is its passphrase (the same
  /// rules); a passphrase itself never goes in a URL.
  std::string key_passphrase_file;
};

/// Parses an amqp:// or amqps:// URL for `role`. Unknown or misplaced parameters, bad escapes, ports, names
/// longer than AMQP's 255 bytes: BrokerErrc::invalid, the message naming what is wrong (the URL in
/// it goes through redact_url).
BrokerResult<AmqpUrl> parse_amqp_url(std::string_view url, AmqpUrlRole role);

/// Opens a source on `amqp://...?queue=NAME`: connects, declares (declare=true), sets
/// basic.qos to `settings.prefetch` and starts consuming with manual acks. Fails at once when the
/// broker cannot be reached or refuses (so a wrong URL is seen at start-up); once open, the
/// source reconnects by itself.
///
/// A Delivery's `handle` is its delivery tag and `connection` the id of the connection it came
/// on (unique in the process); `broker_ref` is the tag as text. Message ids longer than AMQP's
/// 255-byte `message_id` property travel in the `x-idem-message-id` header, set by
/// open_amqp_sink, and are read back from it. The `ordering_key` header (as text, whatever its
/// type) is Delivery::ordering_key, taken out of the headers as that one is; a value that is no
/// valid_ordering_key is ignored.
///
/// ack() sends one basic.ack with `multiple` for the deliveries that are exactly the oldest ones
/// held, single acks for the rest. dead_letter() publishes the copy (body, id, content type,
/// ordering key, the headers as text, persistent) with x-idem-reason, x-idem-detail,
/// x-idem-last-error, x-idem-attempts (an integer) and x-idem-source (the queue) on a second
/// connection in confirm mode, and acks the original only once the broker confirmed the copy; a
/// copy no queue takes is `refused` and the original stays.
///
/// The connections are served only inside calls: call receive() (with max 0 when there is no
/// room for deliveries: it waits for nothing, returns nothing, and keeps the connections alive)
/// or ping() at least every half heartbeat, or the broker closes them as silent.
BrokerResult<std::unique_ptr<MessageSource>> open_amqp_source(std::string_view url, const SourceSettings& settings = {});

/// Opens a sink on `amqp://...?exchange=E&routing_key=K`: a connection with one channel in
/// confirm mode. Messages are persistent (delivery_mode 2) and mandatory: one no queue takes
/// comes back and is `rejected`. Fails at once when the broker cannot be reached or refuses;
/// once open, a lost connection is opened again by the next publish. A message's ordering key
/// goes in the `ordering_key` header (a header of its own of that name is dropped: the ordering
/// key wins); one that is no valid_ordering_key is `rejected`, unsent.
///
/// A body larger than one frame (128 KiB) is sent alone, after the confirms of the messages
/// before it: one over RabbitMQ's max_message_size makes the broker close the channel, and so
/// fails by itself (`rejected`); the rest of the batch goes on on a new channel, and bodies over
/// the limit learned are rejected unsent from then on.
///
/// Between publishes nothing reads the connection: each publish first reads what came meanwhile
/// and opens a new connection if the broker closed this one (an idle sink is closed after two
/// heartbeat intervals; ping() keeps it alive). A broker that blocks publishers (a memory or
/// disk alarm, connection.blocked) fails a publish at once as `unavailable`; one that stops
/// reading during a publish holds the call until it reads again (librabbitmq 0.11 sends without
/// a deadline once a frame has begun).
BrokerResult<std::unique_ptr<MessageSink>> open_amqp_sink(std::string_view url, const SinkSettings& settings = {});

}  // namespace idem
