// The broker conformance suite (testing/broker_conformance) on Kafka: librdkafka's mock cluster
// (idem-kafka-mock, started by this test), a fresh topic, dead-letter topic and group per test.
// The restart suite is not run: the mock keeps nothing across a restart of its process.

#include <gtest/gtest.h>

#include <stdexcept>

#include "idem/kafka_broker.hpp"
#include "idem/testing/broker_conformance.hpp"
#include "kafka_test_support.hpp"

namespace idem {
namespace {

using kafka_test::MockCluster;

class TopicUnderTest final : public testing::BrokerUnderTest {
 public:
  TopicUnderTest()
      : cluster_(MockCluster::shared()),
        topic_(kafka_test::unique_name("conformance")),
        group_(kafka_test::unique_name("conformance-group")) {
    cluster_.create_topic(topic_, 3);
    cluster_.create_topic(topic_ + ".dead-letter", 1);
  }

  std::unique_ptr<MessageSink> sink() override {
    auto sink = open_kafka_sink("kafka://" + cluster_.bootstrap() + "/" + topic_, {});
    if (!sink) throw std::runtime_error("open sink: " + sink.error().message);
    return std::move(*sink);
  }

  std::unique_ptr<MessageSource> source(const SourceSettings& settings) override {
    // The mock's rebalances wait session.timeout.ms - 1 s: keep it short. Commits go out after
    // every ack (commit_interval_ms=0): the mock refuses commits while a group is joining, so
    // a source closed just after another left could not commit its last acks at close.
    auto source = open_kafka_source("kafka://" + cluster_.bootstrap() + "/" + topic_ + "?group=" + group_ +
                                        "&session_timeout_ms=6000&heartbeat_interval_ms=500&commit_interval_ms=0"
                                        "&revoke_timeout_ms=2000&requeue_delay_ms=50",
                                    settings);
    if (!source) throw std::runtime_error("open source: " + source.error().message);
    return std::move(*source);
  }

  std::vector<testing::DeadLetter> take_dead_letters() override {
    const std::string dlt = topic_ + ".dead-letter";
    std::vector<testing::DeadLetter> out;
    for (auto& r : kafka_test::read_topic(cluster_.bootstrap(), dlt, {{0, dead_letters_taken_}})) {
      dead_letters_taken_ = std::max(dead_letters_taken_, r.offset + 1);
      out.push_back(testing::DeadLetter{r.headers["message_id"], r.value, r.headers["x-idem-reason"], r.headers["x-idem-last-error"]});
    }
    return out;
  }

  std::size_t outstanding() override { return kafka_test::uncommitted(cluster_.bootstrap(), topic_, group_); }

  void restart_broker() override { throw std::runtime_error("the mock cluster keeps nothing across a restart"); }

  // The mock completes a rebalance session.timeout.ms - 1 s (5 s here) after a member joined.
  std::chrono::milliseconds settle_time() override { return std::chrono::milliseconds(8000); }

 private:
  MockCluster& cluster_;
  std::string topic_;
  std::string group_;
  std::int64_t dead_letters_taken_ = 0;
};

using testing::BrokerConformance;

INSTANTIATE_TEST_SUITE_P(Kafka, BrokerConformance,
                         ::testing::Values(testing::BrokerFactory{"kafka", [] { return std::make_unique<TopicUnderTest>(); }}),
                         testing::BrokerConformance::name_of);

}  // namespace
}  // namespace idem
