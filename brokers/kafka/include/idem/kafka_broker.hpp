#pragma once

// The Kafka broker module: a MessageSource on a consumer group, committing offsets only past
// messages whose outcome is durable, and a MessageSink on an idempotent producer
// (idem/broker.hpp). librdkafka stays private: rdkafka.h is included only under src/.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/broker.hpp"

namespace idem {

/// What a kafka:// URL is for: the query parameters each takes differ.
enum class KafkaUrlRole : std::uint8_t {
  source,  ///< `?group=...`: consume the topic in a consumer group
  sink,    ///< publish to the topic
};

/// Where a source finds a message's id (SPEC §10: the producer's id, never partition/offset).
enum class KafkaIdFrom : std::uint8_t {
  header,  ///< the header named by `id_header` (default `message_id`)
  key,     ///< the record's key
};

/// A kafka:// URL, parsed:
///   kafka://[USER[:PASSWORD]@]HOST[:PORT][,HOST[:PORT]...]/TOPIC[?PARAMETERS]
/// User, password, topic and parameter values are percent-decoded. The port defaults to 9092.
struct KafkaUrl {
  /// host:port pairs, as librdkafka's bootstrap.servers takes them.
  std::vector<std::pair<std::string, int>> brokers;
  /// The topic consumed (source) or published to by default (sink).
  std::string topic;

  /// Source: the consumer group (`group=`, required).
  std::string group;
  /// Source: where dead_letter() produces the copy (`dead_letter_topic=`; default
  /// "<topic>.dead-letter"). It must exist: the source never creates topics.
  std::string dead_letter_topic;
  /// Source: where the id is read (`id_from=header|key`, default header).
  KafkaIdFrom id_from = KafkaIdFrom::header;
  /// Source: `start=earliest|latest`, where a group with no committed offset starts (librdkafka's
  /// auto.offset.reset); earliest by default, so that what was published before the first
  /// consumer came up is not skipped.
  bool start_at_earliest = true;
  /// Source: `session_timeout_ms=`, `heartbeat_interval_ms=` (the group's liveness: a consumer
  /// silent for the session timeout is dropped and its partitions go to the others).
  std::chrono::milliseconds session_timeout{45000};
  std::chrono::milliseconds heartbeat_interval{3000};
  /// Source: `commit_interval_ms=`: done offsets are committed (asynchronously) at most this
  /// often; 0 commits after every ack that moves a partition's done prefix. Revocation and
  /// closing commit synchronously whatever this says.
  std::chrono::milliseconds commit_interval{1000};
  /// Source: `revoke_timeout_ms=`: a partition taken away by a rebalance stops handing out
  /// messages at once; its deliveries still running may be acked for this long before the
  /// partition is let go (their offsets then stay uncommitted and the next owner delivers them
  /// again).
  std::chrono::milliseconds revoke_timeout{5000};
  /// Source: `requeue_delay_ms=`: how long a requeued delivery waits before it is delivered
  /// again (Kafka has no per-message requeue: it is retried in place by this source).
  std::chrono::milliseconds requeue_delay{1000};

  /// `id_header=`: the header holding the message id (sink: written; source: read unless
  /// id_from=key). Default "message_id".
  std::string id_header = "message_id";
  /// `client_id=`: librdkafka's client.id, shown in the brokers' logs and quotas. Default: the
  /// source's consumer name, or "idem" for a sink.
  std::string client_id;

  /// `security_protocol=plaintext|ssl|sasl_plaintext|sasl_ssl`. Default: plaintext, or
  /// sasl_ssl when credentials are given (a password is never sent in the clear unless asked).
  std::string security_protocol = "plaintext";
  /// `sasl_mechanism=PLAIN|SCRAM-SHA-256|SCRAM-SHA-512` (default PLAIN with credentials).
  std::string sasl_mechanism;
  /// `sasl_username=`, `sasl_password=`, or USER:PASSWORD@ in the URL (not both).
  std::string sasl_username;
  std::string sasl_password;
  /// `ssl_ca_location=`, `ssl_certificate_location=`, `ssl_key_location=` (PEM files),
  /// `ssl_key_password=` (for an encrypted key).
  std::string ssl_ca_location;
  std::string ssl_certificate_location;
  std::string ssl_key_location;
  std::string ssl_key_password;

  /// librdkafka's bootstrap.servers: "host1:9092,host2:9092" ([v6]:port for IPv6).
  std::string bootstrap_servers() const;
};

/// Parses a kafka:// URL for `role`. Unknown or misplaced parameters, bad escapes, ports,
/// topic names Kafka would refuse, numbers out of range: BrokerErrc::invalid, the message naming
/// what is wrong in one line (the URL in it goes through redact_kafka_url).
BrokerResult<KafkaUrl> parse_kafka_url(std::string_view url, KafkaUrlRole role);

/// The URL with its secrets hidden: what redact_url hides (the USER:PASSWORD@ password), and
/// the values of `sasl_password=` and `ssl_key_password=`. What name() returns and every error
/// message quotes.
std::string redact_kafka_url(std::string_view url);

/// What a Kafka source tells besides its results; optional.
struct KafkaEvents {
  /// A line for the log, on the thread that uses the source: librdkafka's warnings and errors
  /// (a broker unreachable, an authentication failure), a partition revoked with deliveries
  /// still running, a commit that failed.
  std::function<void(std::string_view line)> on_warning;
};

/// Opens a source on `kafka://HOSTS/TOPIC?group=GROUP`: checks that the cluster answers and
/// that the topic and the dead-letter topic exist (refused otherwise), then subscribes. Joining
/// the group happens in the first receives; the group's coordinator assigns partitions
/// (the range assignor; source.cpp says why not cooperative-sticky yet).
///
/// The dedupe key is the `id_header` header (or, with id_from=key, the record key); a record
/// without one is delivered with has_message_id false. The `content_type` header becomes
/// Delivery::content_type, the `ordering_key` header Delivery::ordering_key (else the record key,
/// unless id_from=key or the key is the message id: record_headers.hpp), the other headers
/// Delivery::headers. Delivery::connection identifies
/// the partition's assignment (a partition assigned again gets a new one), handle is the
/// offset, broker_ref is "TOPIC/PARTITION/OFFSET".
///
/// Commits: offsets are never committed automatically. ack() marks deliveries done; what is
/// committed for a partition is its first offset not done (the contiguous done prefix), so an
/// offset is never committed past a message still running, waiting to be retried, or not yet
/// dead-lettered. A crash redelivers everything after the last commit: the done ones come back
/// as duplicates, which the consumer's records absorb.
///
/// requeue() delivers the message again from this source after `requeue_delay` (later messages
/// of its partition go on meanwhile). dead_letter() produces the copy to the dead-letter topic
/// with the headers x-idem-reason, x-idem-detail, x-idem-last-error, x-idem-attempts,
/// x-idem-source (the topic), x-idem-partition and x-idem-offset, and counts the message done
/// once the copy's delivery is confirmed. delivery_count is counted by this source (Kafka keeps
/// no per-message count): 1, or more for a message requeued here.
///
/// A partition revoked by a rebalance hands out nothing more at once; ack, requeue and
/// dead_letter of its deliveries work until they are all settled or `revoke_timeout` passed,
/// then what is done is committed synchronously and the partition is let go: later calls for
/// its deliveries are BrokerErrc::stale (the next owner delivers them again).
///
/// librdkafka reconnects by itself: receive() reports a lost cluster (every broker connection
/// down) once as unavailable, a refused login or a topic that vanished as refused; reconnects()
/// counts lost clusters and assignments lost to a session timeout.
BrokerResult<std::unique_ptr<MessageSource>> open_kafka_source(std::string_view url, const SourceSettings& settings = {},
                                                               KafkaEvents events = {});

/// Opens a sink on `kafka://HOSTS/TOPIC`: an idempotent producer (enable.idempotence, acks=all),
/// checked against the cluster (the topic must exist). A record's key is the message's ordering
/// key, so that the messages of one key land in one partition, in order; without one, its message
/// id (no key when the id is empty too). Its headers are the `id_header` (when it has an id),
/// `content_type`, `ordering_key` (when it has one), then its own headers (one of its own named
/// ordering_key is dropped: OutgoingMessage::ordering_key wins). A message whose ordering key is
/// not a valid_ordering_key is rejected, unsent.
/// OutgoingMessage::destination, when set, names another topic. A publish waits for every
/// message's delivery report: ok once the cluster has it (all in-sync replicas); no report
/// within `confirm_timeout` is BrokerErrc::timeout, in doubt.
BrokerResult<std::unique_ptr<MessageSink>> open_kafka_sink(std::string_view url, const SinkSettings& settings = {});

}  // namespace idem
