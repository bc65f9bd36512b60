// The broker conformance suite (testing/include/idem/testing/broker_conformance.hpp): every
// broker module runs it against a real server. Effects are counted by the handler itself, so a
// message that ran twice, or never, fails the test whatever the broker reported.

#include "idem/testing/broker_conformance.hpp"

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "idem/consume_loop.hpp"
#include "idem/consumer.hpp"
#include "idem/memory_store.hpp"

namespace idem::testing {
namespace {

using namespace std::chrono_literals;
using Steady = std::chrono::steady_clock;

OutgoingMessage message(std::string id, std::string body) {
  OutgoingMessage m;
  m.message_id = std::move(id);
  m.content_type = "application/json";
  m.body = std::move(body);
  return m;
}

// Publishes everything, in batches, retrying what the broker could not take yet; fails the
// test if a message is refused for good.
void publish_all(MessageSink& sink, const std::vector<OutgoingMessage>& messages) {
  constexpr std::size_t kBatch = 500;
  for (std::size_t at = 0; at < messages.size(); at += kBatch) {
    std::vector<OutgoingMessage> batch(messages.begin() + static_cast<std::ptrdiff_t>(at),
                                       messages.begin() + static_cast<std::ptrdiff_t>(std::min(at + kBatch, messages.size())));
    for (int round = 0; !batch.empty(); ++round) {
      ASSERT_LT(round, 50) << "the broker kept refusing a publish";
      auto results = sink.publish(batch);
      ASSERT_EQ(results.size(), batch.size());
      std::vector<OutgoingMessage> again;
      for (std::size_t i = 0; i < batch.size(); ++i) {
        if (results[i]) continue;
        ASSERT_TRUE(results[i].error().retryable()) << results[i].error().message;
        again.push_back(batch[i]);  // in doubt or not: publishing twice is what consumers dedupe
      }
      if (!again.empty()) std::this_thread::sleep_for(200ms);
      batch = std::move(again);
    }
  }
}

// The effects a handler had, per message id.
class Effects {
 public:
  void add(const std::string& id) {
    const std::lock_guard lock(mutex_);
    ++counts_[id];
  }
  std::size_t distinct() const {
    const std::lock_guard lock(mutex_);
    return counts_.size();
  }
  std::map<std::string, int> counts() const {
    const std::lock_guard lock(mutex_);
    return counts_;
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::string, int> counts_;
};

SourceSettings settings_for(std::string consumer) {
  SourceSettings s;
  s.prefetch = 64;
  s.consumer = std::move(consumer);
  s.claim_idle = 1s;  // streams: a dead consumer's entries are taken over after a second
  s.connect_timeout = 5s;
  s.reconnect_min = 50ms;
  s.reconnect_max = 1s;
  return s;
}

ConsumeLoopOptions loop_options() {
  ConsumeLoopOptions o;
  o.workers = 4;
  o.max_in_flight = 64;
  o.retry_min = 5ms;
  o.retry_max = 100ms;
  o.idle_wait = 200ms;
  o.drain_timeout = 10s;
  o.max_attempts = 3;
  o.max_message_bytes = 64 * 1024;
  return o;
}

// Consumers of one broker under test, each a ConsumeLoop on its own source and thread, all
// running process_once on one shared store (the replicas of one consumer).
class Consumers {
 public:
  Consumers(BrokerUnderTest& broker, std::size_t count, std::function<bool(const Delivery&)> fails = {})
      : consumer_(*Consumer::create(store_, {.name = "conformance"})), fails_(std::move(fails)) {
    for (std::size_t i = 0; i < count; ++i) {
      sources_.push_back(broker.source(settings_for("conformance-" + std::to_string(i))));
    }
    for (auto& source : sources_) {
      loops_.push_back(std::make_unique<ConsumeLoop>(
          *source,
          [this](const Delivery& d, const DeliveryAttempt&) {
            return disposition_of(consumer_.process_once(d.message_id, d.body, [&]() -> std::expected<std::string, std::string> {
              if (fails_ && fails_(d)) return std::unexpected("refused by the test: " + d.message_id);
              effects_.add(d.message_id);
              return "done";
            }));
          },
          loop_options()));
    }
    for (auto& loop : loops_) {
      threads_.emplace_back([this, l = loop.get()] {
        auto result = l->run();
        if (!result) {
          const std::lock_guard lock(errors_mutex_);
          errors_.push_back(result.error().message);
        }
      });
    }
  }
  ~Consumers() { stop(); }

  // Waits until `done` holds; false after `limit`.
  bool wait_for(const std::function<bool()>& done, Steady::duration limit = 60s) {
    const auto deadline = Steady::now() + limit;
    while (!done()) {
      if (Steady::now() > deadline) return false;
      std::this_thread::sleep_for(20ms);
    }
    return true;
  }

  // Waits until `done` holds and the broker has nothing outstanding, both while the consumers
  // still run. Counts alone cannot tell when a run is over: a broker may hand a message to a
  // second consumer after a rebalance (Kafka), which counts it again as a duplicate.
  bool wait_until_drained(BrokerUnderTest& broker, const std::function<bool()>& done, Steady::duration limit = 60s) {
    return wait_for([&] { return done() && broker.outstanding() == 0; }, limit);
  }

  void stop() {
    for (auto& loop : loops_) loop->stop();
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
    loops_.clear();
    sources_.clear();
    const std::lock_guard lock(errors_mutex_);
    for (const auto& e : errors_) ADD_FAILURE() << "a consume loop ended with: " << e;
    errors_.clear();
  }

  std::uint64_t settled() const {
    std::uint64_t n = 0;
    for (const auto& loop : loops_) {
      n += loop->stats().processed + loop->stats().duplicates + loop->stats().dead_lettered;
    }
    return n;
  }
  std::uint64_t stat(std::atomic<std::uint64_t> ConsumeStats::*field) const {
    std::uint64_t n = 0;
    for (const auto& loop : loops_) n += (loop->stats().*field).load();
    return n;
  }

  Effects& effects() { return effects_; }
  MemoryStore& store() { return store_; }
  Consumer& consumer() { return consumer_; }

 private:
  MemoryStore store_;
  Consumer consumer_;
  std::function<bool(const Delivery&)> fails_;
  Effects effects_;
  std::vector<std::unique_ptr<MessageSource>> sources_;
  std::vector<std::unique_ptr<ConsumeLoop>> loops_;
  std::vector<std::thread> threads_;
  std::mutex errors_mutex_;
  std::vector<std::string> errors_;
};

void expect_each_once(const Effects& effects, std::size_t ids, const std::string& prefix) {
  const auto counts = effects.counts();
  EXPECT_EQ(counts.size(), ids) << "messages whose effect never happened (or unknown ids ran)";
  int twice = 0;
  for (const auto& [id, n] : counts) {
    if (n != 1) {
      ++twice;
      if (twice <= 10) ADD_FAILURE() << id << " ran " << n << " times";
    }
    EXPECT_EQ(id.rfind(prefix, 0), 0u) << "an id this test never published ran: " << id;
  }
  EXPECT_EQ(twice, 0) << "messages that ran more than once";
}

std::string id_of(const std::string& prefix, int i) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%06d", i);
  return prefix + buf;
}

// Waits until the broker reports nothing outstanding (acks reach it asynchronously).
void expect_drained(BrokerUnderTest& broker) {
  std::size_t left = 0;
  for (int i = 0; i < 100; ++i) {
    left = broker.outstanding();
    if (left == 0) return;
    std::this_thread::sleep_for(100ms);
  }
  ADD_FAILURE() << left << " messages left unacknowledged or unread";
}

TEST_P(BrokerConformance, TheSameIdPublishedTwiceHasOneEffect) {
  auto broker = GetParam().make();
  auto sink = broker->sink();
  std::vector<OutgoingMessage> messages;
  for (int i = 0; i < 100; ++i) {
    messages.push_back(message(id_of("twice-", i), "{\"n\":" + std::to_string(i) + "}"));
    messages.push_back(message(id_of("twice-", i), "{\"n\":" + std::to_string(i) + "}"));
  }
  publish_all(*sink, messages);
  {
    Consumers consumers(*broker, 1);
    ASSERT_TRUE(consumers.wait_for([&] { return consumers.settled() >= 200; })) << consumers.settled() << " of 200 settled";
    EXPECT_EQ(consumers.stat(&ConsumeStats::processed), 100u);
    EXPECT_EQ(consumers.stat(&ConsumeStats::duplicates), 100u);
    consumers.stop();
    expect_each_once(consumers.effects(), 100, "twice-");
  }
  expect_drained(*broker);
}

// The storm of the brokers issue: 10,000 ids, each published 1-3 times (shuffled, so copies
// of one id often run concurrently on different consumers), three competing consumers.
TEST_P(BrokerConformance, ThreeCompetingConsumersRunEachOfTenThousandIdsOnce) {
  auto broker = GetParam().make();
  auto sink = broker->sink();
  constexpr int kIds = 10'000;
  std::vector<OutgoingMessage> messages;
  std::mt19937 random(20261201);
  for (int i = 0; i < kIds; ++i) {
    const int copies = 1 + static_cast<int>(random() % 3);
    for (int c = 0; c < copies; ++c) messages.push_back(message(id_of("storm-", i), "{\"payment\":" + std::to_string(i) + "}"));
  }
  std::shuffle(messages.begin(), messages.end(), random);
  Consumers consumers(*broker, 3);
  publish_all(*sink, messages);
  ASSERT_TRUE(consumers.wait_until_drained(
      *broker, [&] { return consumers.effects().distinct() >= kIds && consumers.settled() >= messages.size(); }, 180s))
      << consumers.settled() << " of " << messages.size() << " settled, " << consumers.effects().distinct() << " of " << kIds
      << " ids ran, " << broker->outstanding() << " outstanding";
  EXPECT_EQ(consumers.stat(&ConsumeStats::processed), static_cast<std::uint64_t>(kIds));
  EXPECT_EQ(consumers.stat(&ConsumeStats::dead_lettered), 0u);
  consumers.stop();
  expect_each_once(consumers.effects(), kIds, "storm-");
  expect_drained(*broker);
}

// A consumer dies holding deliveries: some ran and were recorded but never acked, some never
// ran. The broker gives them all to the next consumer: the recorded ones are duplicates, the
// others run, each exactly once.
TEST_P(BrokerConformance, TheUnackedDeliveriesOfADeadConsumerComeBackAndRunOnce) {
  auto broker = GetParam().make();
  auto sink = broker->sink();
  std::vector<OutgoingMessage> messages;
  for (int i = 0; i < 40; ++i) messages.push_back(message(id_of("dies-", i), "x"));
  publish_all(*sink, messages);

  MemoryStore store;
  auto consumer = Consumer::create(store, {.name = "conformance"});
  ASSERT_TRUE(consumer);
  Effects effects;
  {
    auto dying = broker->source(settings_for("dying"));
    std::vector<Delivery> held;
    const auto deadline = Steady::now() + 30s;
    while (held.size() < 20 && Steady::now() < deadline) {
      auto got = dying->receive(20 - held.size(), 500ms);
      ASSERT_TRUE(got) << got.error().message;
      for (auto& d : *got) held.push_back(std::move(d));
    }
    ASSERT_EQ(held.size(), 20u);
    // Ten of them run and are recorded; then the consumer is gone without a single ack.
    for (std::size_t i = 0; i < 10; ++i) {
      auto outcome = consumer->process_once(held[i].message_id, held[i].body, [&]() -> std::expected<std::string, std::string> {
        effects.add(held[i].message_id);
        return "done";
      });
      ASSERT_TRUE(outcome);
      ASSERT_EQ(outcome->status, MessageStatus::processed);
    }
  }  // the dying source closes its connection here, as a killed process's would be closed

  ConsumeLoop* loop_ptr = nullptr;
  auto next = broker->source(settings_for("next"));
  ConsumeLoop loop(*next, [&](const Delivery& d, const DeliveryAttempt&) {
    return disposition_of(consumer->process_once(d.message_id, d.body, [&]() -> std::expected<std::string, std::string> {
      effects.add(d.message_id);
      return "done";
    }));
  }, loop_options());
  loop_ptr = &loop;
  BrokerResult<Done> result;
  std::thread runner([&] { result = loop.run(); });
  // Generous: the dead consumer's partitions come back after the broker's rebalance, which took
  // over a minute once under ASan with every core busy (the loop ends as soon as all 40 settle).
  const auto deadline = Steady::now() + 150s;
  auto settled = [&] { return loop_ptr->stats().processed + loop_ptr->stats().duplicates; };
  while (settled() < 40 && Steady::now() < deadline) std::this_thread::sleep_for(20ms);
  loop.stop();
  runner.join();
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_EQ(loop.stats().processed.load(), 30u);
  EXPECT_EQ(loop.stats().duplicates.load(), 10u);
  next.reset();
  expect_each_once(effects, 40, "dies-");
  expect_drained(*broker);
}

TEST_P(BrokerConformance, APoisonMessageIsDeadLetteredWithItsLastErrorAndTheRestGoOn) {
  auto broker = GetParam().make();
  auto sink = broker->sink();
  std::vector<OutgoingMessage> messages;
  for (int i = 0; i < 20; ++i) messages.push_back(message(id_of("poison-", i), "x"));
  {
    Consumers consumers(*broker, 2, [](const Delivery& d) { return d.message_id == "poison-000007"; });
    std::this_thread::sleep_for(broker->settle_time());
    publish_all(*sink, messages);
    ASSERT_TRUE(consumers.wait_until_drained(*broker, [&] {
      return consumers.settled() >= 20 && consumers.stat(&ConsumeStats::dead_lettered) >= 1;
    })) << consumers.settled() << " settled, " << broker->outstanding() << " outstanding";
    EXPECT_EQ(consumers.stat(&ConsumeStats::dead_lettered), 1u);
    consumers.stop();
    auto counts = consumers.effects().counts();
    EXPECT_EQ(counts.size(), 19u);
    EXPECT_EQ(counts.count("poison-000007"), 0u);
  }
  const auto dead = broker->take_dead_letters();
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].message_id, "poison-000007");
  EXPECT_EQ(dead[0].reason, "poison");
  EXPECT_EQ(dead[0].body, "x");
  EXPECT_EQ(dead[0].last_error, "refused by the test: poison-000007");
  expect_drained(*broker);
}

TEST_P(BrokerConformance, MissingInvalidAndOversizedMessagesAreDeadLetteredAndNeverRun) {
  auto broker = GetParam().make();
  auto sink = broker->sink();
  std::vector<OutgoingMessage> messages;
  messages.push_back(message("", "no id"));                                // none at all
  messages.push_back(message("has a space", "an id breaking the rules"));  // not visible ASCII
  messages.push_back(message(std::string(257, 'k'), "too long an id"));
  messages.push_back(message("big-one", std::string(64 * 1024 + 1, 'b')));
  messages.push_back(message("fine-one", "fine"));
  publish_all(*sink, messages);
  {
    Consumers consumers(*broker, 1);
    ASSERT_TRUE(consumers.wait_for([&] { return consumers.settled() >= 5; })) << consumers.settled();
    consumers.stop();
    const auto counts = consumers.effects().counts();
    EXPECT_EQ(counts.size(), 1u);
    EXPECT_EQ(counts.count("fine-one"), 1u);
  }
  std::map<std::string, std::string> reason_by_body;
  for (const auto& d : broker->take_dead_letters()) {
    reason_by_body[d.body.size() > 100 ? "<big>" : d.body] = d.reason;
  }
  EXPECT_EQ(reason_by_body["no id"], "missing_id");
  EXPECT_EQ(reason_by_body["an id breaking the rules"], "invalid_id");
  EXPECT_EQ(reason_by_body["too long an id"], "invalid_id");
  EXPECT_EQ(reason_by_body["<big>"], "too_large");
  EXPECT_EQ(reason_by_body.size(), 4u);
  expect_drained(*broker);
}

// The broker restarts while consumers run and producers publish: every message published
// (before, during, after) runs exactly once, and nothing is left behind.
TEST_P(BrokerRestartConformance, ABrokerRestartMidStreamLosesNothingAndRunsNothingTwice) {
  auto broker = GetParam().make();
  constexpr int kBefore = 1000;
  constexpr int kAfter = 1000;
  {
    auto sink = broker->sink();
    std::vector<OutgoingMessage> messages;
    for (int i = 0; i < kBefore; ++i) messages.push_back(message(id_of("restart-", i), "before"));
    publish_all(*sink, messages);
  }
  Consumers consumers(*broker, 2);
  ASSERT_TRUE(consumers.wait_for([&] { return consumers.effects().distinct() >= kBefore / 4; }));
  broker->restart_broker();
  {
    auto sink = broker->sink();
    std::vector<OutgoingMessage> messages;
    for (int i = kBefore; i < kBefore + kAfter; ++i) messages.push_back(message(id_of("restart-", i), "after"));
    publish_all(*sink, messages);
  }
  ASSERT_TRUE(consumers.wait_for([&] { return consumers.effects().distinct() >= kBefore + kAfter; }, 120s))
      << consumers.effects().distinct() << " of " << (kBefore + kAfter) << " ran";
  // Give redeliveries of deliveries whose acks the restart lost time to arrive and be settled.
  std::this_thread::sleep_for(2s);
  consumers.stop();
  expect_each_once(consumers.effects(), kBefore + kAfter, "restart-");
  expect_drained(*broker);
}

}  // namespace
}  // namespace idem::testing

GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BrokerConformance);
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(BrokerRestartConformance);
