#pragma once

// librdkafka handles as idem uses them: the configuration every client shares (brokers,
// client id, security, timeouts), what error_cb reports, and the check that a cluster answers
// and has a topic. Private to the module.

#include <librdkafka/rdkafka.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "errors.hpp"
#include "idem/kafka_broker.hpp"

namespace idem::kafka_detail {

struct HandleDeleter {
  void operator()(rd_kafka_t* rk) const { rd_kafka_destroy(rk); }
};
/// An rd_kafka_t, destroyed with it (a consumer must be closed first: KafkaSource does).
using Handle = std::unique_ptr<rd_kafka_t, HandleDeleter>;

struct ConfDeleter {
  void operator()(rd_kafka_conf_t* conf) const { rd_kafka_conf_destroy(conf); }
};
using Conf = std::unique_ptr<rd_kafka_conf_t, ConfDeleter>;

/// What librdkafka reported through error_cb, kept for the next call to report, and told to
/// on_warning. error_cb runs where the handle's queue is served (rd_kafka_poll, or
/// rd_kafka_consumer_poll once the main queue is forwarded), so on the caller's thread.
struct ClientEvents {
  std::string where;  ///< the redacted URL
  std::string user;   ///< the SASL user, for login messages
  std::vector<std::string> secrets;  ///< the URL's passwords, scrubbed from librdkafka's words
  std::function<void(std::string_view)> on_warning;
  /// The object that owns the handle (rd_kafka_conf_set_opaque gives every callback this
  /// struct; the source's rebalance and commit callbacks find themselves through it).
  void* owner = nullptr;
  /// The last authentication or TLS failure: refused until the next success clears it.
  std::optional<Failure> refusal;
  /// A fatal error: the handle can do nothing more.
  std::optional<Failure> fatal;
  /// Every broker connection went down (cleared by the caller once the cluster answers again).
  std::optional<Failure> outage;
  /// How many times every broker connection went down.
  std::uint64_t outages = 0;
};

/// The configuration every client shares, from the URL: bootstrap.servers, client.id,
/// security.protocol, SASL and TLS, connection and reconnection timeouts, error_cb reporting to
/// `events` (which must outlive the handle), librdkafka's own logging silenced (its errors
/// reach the caller as BrokerErrors and on_warning lines instead). A property librdkafka
/// refuses is BrokerErrc::invalid (a password's value is never quoted).
BrokerResult<Conf> base_conf(const KafkaUrl& url, const std::string& client_id, Millis connect_timeout, Millis reconnect_min,
                             Millis reconnect_max, ClientEvents& events);

/// Sets one property; invalid with librdkafka's reason when it refuses.
BrokerResult<Done> set(rd_kafka_conf_t* conf, const std::string& name, const std::string& value, const std::string& where);

/// rd_kafka_new, which takes the configuration on success.
BrokerResult<Handle> create(rd_kafka_type_t type, Conf conf, const std::string& where);

/// Checks that the cluster answers within `timeout` and, unless `topic` is empty, that it has
/// the topic (refused when not). `serve` serves the handle's queue so that error_cb has
/// reported why a cluster did not answer (a refused login is refused, not unavailable).
BrokerResult<Done> check_cluster(rd_kafka_t* rk, const std::string& topic, Millis timeout, ClientEvents& events,
                                 const std::function<void()>& serve, const std::string& doing);

/// The text with every occurrence of the URL's passwords replaced by "***" (librdkafka's
/// messages do not echo them; this is the second line of defence).
std::string scrub(std::string text, const std::vector<std::string>& secrets);
/// The URL's passwords.
std::vector<std::string> secrets_of(const KafkaUrl& url);

/// "HOSTNAME-PID": distinct for every process.
std::string default_client_name();

}  // namespace idem::kafka_detail
