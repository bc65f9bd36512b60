#pragma once

// What the live RabbitMQ tests share: the server from the environment (IDEM_TEST_AMQP_URL, set
// by scripts/lib/servers.sh; missing -> every test fails under CI=true and skips loudly
// otherwise), unique queue names removed after each test, a raw librabbitmq connection for the
// tests' own checks (independent of the code under test), and the node's restart commands.

#include <amqp.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "idem/amqp_broker.hpp"
#include "idem/testing/broker_conformance.hpp"

namespace idem::amqptest {

/// IDEM_TEST_AMQP_URL (amqp://idem:...@127.0.0.1:PORT/%2f); throws (failing the test) if unset.
std::string server_url();
/// IDEM_TEST_AMQP_PASSWORD: the raw password of that URL, which no output may contain.
std::string server_password();
/// `server_url()` with `query` appended ("queue=x&declare=false").
std::string url_with(const std::string& query);
/// A name no other test or test process uses: "idem-test-<what>-<pid>-<salt>-<n>".
std::string unique_name(const std::string& what);

/// A message as RabbitMQ holds it, read back with basic.get.
struct RawMessage {
  std::optional<std::string> message_id;
  std::string content_type;
  std::uint8_t delivery_mode = 0;
  std::map<std::string, std::string> string_headers;    ///< longstr/bytes headers
  std::map<std::string, std::int64_t> integer_headers;  ///< integer headers
  std::string body;
  bool redelivered = false;
};

/// A blocking librabbitmq connection for the tests' own setup and checks; throws on errors.
class RawAmqp {
 public:
  explicit RawAmqp(const std::string& url = server_url());
  ~RawAmqp();
  RawAmqp(const RawAmqp&) = delete;
  RawAmqp& operator=(const RawAmqp&) = delete;

  /// A durable queue; `quorum` makes it a quorum queue (x-queue-type).
  void declare_queue(const std::string& name, bool quorum = false);
  void declare_exchange(const std::string& name, const std::string& type = "direct");
  void bind(const std::string& queue, const std::string& exchange, const std::string& key);
  /// Deletes, ignoring "not found".
  void delete_queue(const std::string& name);
  void delete_exchange(const std::string& name);
  /// Messages ready in the queue (not those delivered and unacknowledged).
  std::uint32_t ready(const std::string& queue);
  /// Takes one message (basic.get, acked), if there is one.
  std::optional<RawMessage> get(const std::string& queue);
  /// Publishes to the default exchange with a headers table of every kind (tests of rendering).
  void publish_with_typed_headers(const std::string& queue, const std::string& body);

 private:
  void check(const char* what);
  void reopen();
  amqp_connection_state_t conn_ = nullptr;
};

/// A queue, its dead-letter exchange and queue, named for one test and deleted after it.
struct TestQueue {
  explicit TestQueue(const std::string& what);
  ~TestQueue();
  TestQueue(const TestQueue&) = delete;
  TestQueue& operator=(const TestQueue&) = delete;

  /// amqp://...?queue=Q&dead_letter_exchange=X&dead_letter_queue=D (+ `extra`, "&k=v").
  std::string source_url(const std::string& extra = "") const;
  /// amqp://...?routing_key=Q (+ `extra`): a sink to this queue through the default exchange.
  std::string sink_url(const std::string& extra = "") const;

  std::string queue, dead_letter_exchange, dead_letter_queue;
  std::vector<std::string> more_queues, more_exchanges;  ///< deleted too
};

/// Opens a source / sink or throws with the error.
std::unique_ptr<MessageSource> open_source(const std::string& url, SourceSettings settings = {});
std::unique_ptr<MessageSink> open_sink(const std::string& url, SinkSettings settings = {});

/// Settings for tests: fast reconnects, generous connect timeouts (a shared 2-core machine).
SourceSettings test_settings(std::size_t prefetch = 64);

/// Receives until `count` deliveries arrived or `limit` passed.
std::vector<Delivery> receive_n(MessageSource& source, std::size_t count, std::chrono::milliseconds limit = std::chrono::seconds(20));

/// servers.sh COMMAND $IDEM_TEST_SERVERS_DIR [ARGS]: stop-rabbitmq, start-rabbitmq, rabbitmqctl.
int servers(const std::string& command, const std::string& args = "");
/// Closes, on the broker's side, the connections whose client-given name contains `name_part`
/// (rabbitmqctl close_connection): the broker ending a connection, for this test's only.
/// Returns how many were closed.
int close_connections_named(const std::string& name_part);

/// A TCP proxy to the test broker whose connections can be cut (both sides closed at once) or
/// frozen (nothing forwarded or accepted, sockets left open): a network that fails at a chosen
/// moment, without touching the shared broker.
class Proxy {
 public:
  Proxy();
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;
  /// `url` (an amqp:// URL of the test broker, with any query) through the proxy.
  std::string via(const std::string& url) const;
  /// Closes every connection open now; new ones are accepted as before.
  void cut();
  void freeze();
  void thaw();

 private:
  void loop();
  int listen_fd_ = -1;
  int port_ = 0;
  int target_port_ = 0;
  std::atomic<bool> stop_{false}, frozen_{false}, cut_{false};
  std::thread thread_;
};

/// The broker conformance suite's view of a fresh queue (testing/broker_conformance.hpp).
testing::BrokerFactory conformance_factory();

}  // namespace idem::amqptest
