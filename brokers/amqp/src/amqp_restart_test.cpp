// Broker restarts: the shared RabbitMQ node is stopped and started again (servers.sh
// stop-rabbitmq / start-rabbitmq), so this program runs alone (RUN_SERIAL in CMake).

#include "idem/amqp_broker.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <thread>

#include "amqp_test_support.hpp"

namespace idem::amqptest {
namespace {

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

OutgoingMessage message(std::string id) {
  OutgoingMessage m;
  m.message_id = std::move(id);
  m.content_type = "text/plain";
  m.body = "body of " + m.message_id;
  return m;
}

// Starts the node again if a test stopped it and failed before it could.
struct NodeBack {
  bool stopped = false;
  ~NodeBack() {
    if (stopped) servers("start-rabbitmq");
  }
};

TEST(AmqpRestart, ReceiveRecoversOldDeliveriesAreStaleAndTheirMessagesComeBack) {
  TestQueue q("restart");
  auto sink = open_sink(q.sink_url());
  std::vector<OutgoingMessage> before;
  for (int i = 0; i < 5; ++i) before.push_back(message("before-" + std::to_string(i)));
  for (const auto& r : sink->publish(before)) ASSERT_TRUE(r) << r.error().message;

  SourceSettings settings = test_settings();
  settings.connect_timeout = 2s;  // attempts against a stopped node fail fast anyway
  auto source = open_source(q.source_url(), settings);
  auto held = receive_n(*source, 5);
  ASSERT_EQ(held.size(), 5u);

  NodeBack node;
  ASSERT_EQ(servers("stop-rabbitmq"), 0);
  node.stopped = true;

  // Acks on a socket whose peer is gone, before anything read the close: a send fails
  // (ECONNRESET, or EPIPE once the reset was seen). That must be an error, not SIGPIPE
  // (librabbitmq sends with MSG_NOSIGNAL): with SIGPIPE's default action this process would die.
  std::signal(SIGPIPE, SIG_DFL);
  auto first = source->ack(std::span(held).first(1));
  auto second = source->ack(std::span(held).subspan(1, 1));
  ASSERT_TRUE(!first || !second) << "one of two sends to a closed socket fails";
  const auto& failed = !first ? first.error() : second.error();
  EXPECT_EQ(failed.code, BrokerErrc::unavailable) << failed.message;

  // While the broker is down: receive and ping say unavailable (retryable), again and again,
  // and a publish is unavailable and was not sent.
  bool saw_unavailable = false;
  for (int i = 0; i < 5; ++i) {
    auto got = source->receive(10, 300ms);
    if (!got) {
      EXPECT_EQ(got.error().code, BrokerErrc::unavailable) << got.error().message;
      EXPECT_TRUE(got.error().retryable());
      EXPECT_EQ(got.error().message.find(server_password()), std::string::npos);
      saw_unavailable = true;
    } else {
      EXPECT_TRUE(got->empty());
    }
  }
  EXPECT_TRUE(saw_unavailable);
  auto ping = source->ping();
  ASSERT_FALSE(ping);
  EXPECT_EQ(ping.error().code, BrokerErrc::unavailable);
  auto down = sink->publish(std::vector<OutgoingMessage>{message("during")});
  ASSERT_FALSE(down[0]);
  EXPECT_EQ(down[0].error().code, BrokerErrc::unavailable) << down[0].error().message;
  EXPECT_FALSE(down[0].error().in_doubt) << "nothing was written: the connection was found dead first";
  auto stale = source->ack(held);
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error().code, BrokerErrc::stale);

  ASSERT_EQ(servers("start-rabbitmq"), 0);
  node.stopped = false;

  // The source reconnects by itself; the held messages come back (persistent, durable queue).
  auto back = receive_n(*source, 5, 60s);
  ASSERT_EQ(back.size(), 5u);
  for (const auto& d : back) {
    EXPECT_TRUE(d.redelivered) << d.message_id;
    EXPECT_NE(d.connection, held[0].connection);
  }
  EXPECT_GE(source->reconnects(), 1u);
  EXPECT_EQ(source->ack(held).error().code, BrokerErrc::stale) << "still stale: nothing acked twice";
  ASSERT_TRUE(source->ack(back));
  EXPECT_TRUE(source->ping());

  // The sink opens a new connection on its next publish.
  for (const auto& r : sink->publish(std::vector<OutgoingMessage>{message("after")})) ASSERT_TRUE(r) << r.error().message;
  auto after = receive_n(*source, 1);
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].message_id, "after");
  ASSERT_TRUE(source->ack(after));
}

}  // namespace

using ::idem::testing::BrokerRestartConformance;
INSTANTIATE_TEST_SUITE_P(Amqp, BrokerRestartConformance, ::testing::Values(conformance_factory()), BrokerRestartConformance::name_of);

}  // namespace idem::amqptest
