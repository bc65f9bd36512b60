// The broker conformance suite (testing/broker_conformance) on SQS: fauxqs (testing/sqs_emulator,
// started by this test), a fresh queue and dead-letter queue per test. The restart suite is not
// run: fauxqs keeps nothing across a restart of its process.

#include <gtest/gtest.h>

#include <stdexcept>

#include "idem/sqs_broker.hpp"
#include "idem/testing/broker_conformance.hpp"
#include "sqs_test_support.hpp"

namespace idem {
namespace {

using sqs_test::Api;
using sqs_test::Emulator;

class QueueUnderTest final : public testing::BrokerUnderTest {
 public:
  QueueUnderTest() : api_(Emulator::shared()), queue_(sqs_test::unique_name("conformance")) {
    api_.create_queue(queue_);
    api_.create_queue(queue_ + "-dead-letter");
  }

  std::unique_ptr<MessageSink> sink() override {
    auto sink = open_sqs_sink(api_.url(queue_), {});
    if (!sink) throw std::runtime_error("open sink: " + sink.error().message);
    return std::move(*sink);
  }

  std::unique_ptr<MessageSource> source(const SourceSettings& settings) override {
    // A short visibility timeout: what a test leaves held comes back soon, and the heartbeat
    // extends what the consumers hold many times over a run. Short polls: a consumer closed
    // while polling leaves fauxqs waiting out its poll.
    auto source = open_sqs_source(api_.url(queue_, "&visibility_timeout=4&wait_seconds=2"), settings);
    if (!source) throw std::runtime_error("open source: " + source.error().message);
    return std::move(*source);
  }

  std::vector<testing::DeadLetter> take_dead_letters() override {
    std::vector<testing::DeadLetter> out;
    for (auto& m : api_.take_all(queue_ + "-dead-letter")) {
      auto text = [&](const char* name) {
        auto it = m.attributes.find(name);
        return it == m.attributes.end() ? std::string() : it->second.value;
      };
      out.push_back(testing::DeadLetter{text("message_id"), m.body, text("x-idem-reason"), text("x-idem-last-error")});
    }
    return out;
  }

  std::size_t outstanding() override { return api_.outstanding(queue_); }

  void restart_broker() override { throw std::runtime_error("fauxqs keeps nothing across a restart"); }

 private:
  Api api_;
  std::string queue_;
};

using testing::BrokerConformance;

INSTANTIATE_TEST_SUITE_P(Sqs, BrokerConformance,
                         ::testing::Values(testing::BrokerFactory{"sqs", [] { return std::make_unique<QueueUnderTest>(); }}),
                         testing::BrokerConformance::name_of);

}  // namespace
}  // namespace idem
