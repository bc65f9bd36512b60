#include "idem/consume_loop.hpp"

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <set>

#include "idem/memory_store.hpp"

namespace idem {
namespace {

using namespace std::chrono_literals;

// An in-memory broker queue for the loop's unit tests (the real brokers have their own tests
// and the broker conformance suite): deliveries held until acked, requeued or dead-lettered;
// close() gives every held one back, as a broker does when a consumer's connection goes.
class FakeSource final : public MessageSource {
 public:
  void publish(std::string id, std::string body, bool with_id = true, std::string ordering_key = "") {
    Delivery d;
    d.message_id = std::move(id);
    d.has_message_id = with_id;
    d.body = std::move(body);
    d.ordering_key = std::move(ordering_key);
    const std::lock_guard lock(mutex_);
    d.handle = ++next_handle_;
    queue_.push_back(std::move(d));
    cv_.notify_all();
  }

  BrokerResult<std::vector<Delivery>> receive(std::size_t max, Millis wait) override {
    std::unique_lock lock(mutex_);
    if (refuse_) return std::unexpected(BrokerError{BrokerErrc::refused, "login refused", false});
    cv_.wait_for(lock, wait, [&] { return !queue_.empty() || woken_; });
    woken_ = false;
    std::vector<Delivery> out;
    while (!queue_.empty() && out.size() < max) {
      Delivery d = std::move(queue_.front());
      queue_.pop_front();
      d.connection = connection_;
      held_[d.handle] = d;
      out.push_back(std::move(d));
    }
    max_held_ = std::max(max_held_, held_.size());
    return out;
  }

  void wake() override {
    const std::lock_guard lock(mutex_);
    woken_ = true;
    cv_.notify_all();
  }

  BrokerResult<Done> ack(std::span<const Delivery> deliveries) override {
    const std::lock_guard lock(mutex_);
    for (const Delivery& d : deliveries) {
      if (d.connection != connection_) continue;
      EXPECT_EQ(held_.erase(d.handle), 1u) << "acked a delivery not held: " << d.message_id;
      ++acks_;
    }
    return Done{};
  }

  BrokerResult<Done> requeue(const Delivery& d) override {
    const std::lock_guard lock(mutex_);
    if (d.connection != connection_) return std::unexpected(BrokerError{BrokerErrc::stale, "stale", false});
    auto it = held_.find(d.handle);
    if (it == held_.end()) return std::unexpected(BrokerError{BrokerErrc::internal, "not held", false});
    Delivery back = std::move(it->second);
    held_.erase(it);
    back.redelivered = true;
    ++back.delivery_count;
    queue_.push_front(std::move(back));
    ++requeues_;
    return Done{};
  }

  BrokerResult<Done> dead_letter(const Delivery& d, const DeadLetterReason& why) override {
    const std::lock_guard lock(mutex_);
    if (d.connection != connection_) return std::unexpected(BrokerError{BrokerErrc::stale, "stale", false});
    if (fail_dead_letters_ > 0) {
      --fail_dead_letters_;
      return std::unexpected(BrokerError{BrokerErrc::unavailable, "dead-letter queue unreachable", true});
    }
    EXPECT_EQ(held_.erase(d.handle), 1u);
    dead_.emplace_back(d, why);
    return Done{};
  }

  BrokerResult<Done> ping() override { return Done{}; }
  std::string name() const override { return "fake"; }
  std::uint64_t reconnects() const override { return 0; }

  // The consumer's connection went: every held delivery comes back, redelivered.
  void close() {
    const std::lock_guard lock(mutex_);
    ++connection_;
    for (auto& [handle, d] : held_) {
      d.redelivered = true;
      ++d.delivery_count;
      d.connection = connection_;
      queue_.push_back(d);
    }
    held_.clear();
    cv_.notify_all();
  }

  std::size_t pending() const {
    const std::lock_guard lock(mutex_);
    return queue_.size() + held_.size();
  }

  std::size_t acks() const {
    const std::lock_guard lock(mutex_);
    return acks_;
  }

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Delivery> queue_;
  std::map<std::uint64_t, Delivery> held_;
  std::vector<std::pair<Delivery, DeadLetterReason>> dead_;
  std::uint64_t next_handle_ = 0;
  std::uint64_t connection_ = 1;
  std::size_t max_held_ = 0;
  std::size_t acks_ = 0;
  std::size_t requeues_ = 0;
  int fail_dead_letters_ = 0;
  bool woken_ = false;
  bool refuse_ = false;
};

// Counts each message id's effects, under a lock.
struct Effects {
  std::mutex mutex;
  std::map<std::string, int> by_id;
  void add(const std::string& id) {
    const std::lock_guard lock(mutex);
    ++by_id[id];
  }
  int of(const std::string& id) {
    const std::lock_guard lock(mutex);
    return by_id.count(id) ? by_id[id] : 0;
  }
};

ConsumeLoopOptions fast_options() {
  ConsumeLoopOptions o;
  o.workers = 4;
  o.max_in_flight = 16;
  o.retry_min = 1ms;
  o.retry_max = 5ms;
  o.idle_wait = 50ms;
  o.drain_timeout = 5s;
  return o;
}

// Runs the loop on its own thread until `done` holds (or 20 s), then stops it.
template <class Until>
BrokerResult<Done> run_until(ConsumeLoop& loop, Until done) {
  BrokerResult<Done> result;
  std::thread runner([&] { result = loop.run(); });
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while (!done() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  EXPECT_TRUE(done()) << "the loop did not get there within 20 s";
  loop.stop();
  runner.join();
  return result;
}

// A processor running process_once on `consumer`, with `effect` as the handler.
DeliveryProcessor process_once_with(Consumer& consumer, std::function<std::expected<std::string, std::string>(const Delivery&)> effect) {
  return [&consumer, effect](const Delivery& d, const DeliveryAttempt&) {
    return disposition_of(consumer.process_once(d.message_id, d.body, [&] { return effect(d); }));
  };
}

TEST(ConsumeLoop, EveryMessageOnceAndEverythingAcked) {
  FakeSource source;
  MemoryStore store;
  auto consumer = Consumer::create(store, {.name = "loop-test"});
  ASSERT_TRUE(consumer);
  Effects effects;
  for (int i = 0; i < 300; ++i) {
    const std::string id = "m-" + std::to_string(i);
    for (int copy = 0; copy <= i % 3; ++copy) source.publish(id, "body " + id);
  }
  ConsumeLoop loop(source, process_once_with(*consumer, [&](const Delivery& d) -> std::expected<std::string, std::string> {
                     effects.add(d.message_id);
                     return "ok";
                   }),
                   fast_options());
  ASSERT_TRUE(run_until(loop, [&] { return source.pending() == 0; }));
  EXPECT_EQ(source.pending(), 0u);
  for (int i = 0; i < 300; ++i) EXPECT_EQ(effects.of("m-" + std::to_string(i)), 1) << i;
  EXPECT_EQ(loop.stats().processed.load(), 300u);
  EXPECT_EQ(loop.stats().duplicates.load(), 300u);  // 0 + 1 + 2 extra copies per three ids
  EXPECT_EQ(loop.stats().in_flight.load(), 0);
  EXPECT_LE(source.max_held_, 16u);
  EXPECT_TRUE(loop.drained());
}

// The receiving thread, waiting for room in a full window, is woken by batches of finished tasks
// (here 3: max_in_flight / 8) rather than by each one. Handlers stuck on most of the window must
// not hold back the acks of the few that finished until the wait's timeout: with idle_wait far
// beyond the test's patience, 22 stuck handlers and 2 quick messages fill the window of 24, and
// the 2 are acked while the others still run.
TEST(ConsumeLoop, StuckHandlersHoldBackNoOtherMessagesAckInAFullWindow) {
  FakeSource source;
  for (int i = 0; i < 22; ++i) source.publish("stuck-" + std::to_string(i), "body");
  for (int i = 0; i < 2; ++i) source.publish("quick-" + std::to_string(i), "body");
  std::mutex m;
  std::condition_variable cv;
  bool release = false;
  ConsumeLoopOptions options = fast_options();
  options.workers = 23;
  options.max_in_flight = 24;
  options.idle_wait = 60s;
  ConsumeLoop loop(source,
                   [&](const Delivery& d, const DeliveryAttempt&) {
                     if (d.message_id.starts_with("stuck-")) {
                       std::unique_lock lock(m);
                       cv.wait(lock, [&] { return release; });
                     }
                     return MessageDisposition::ack_it("processed");
                   },
                   options);
  BrokerResult<Done> result;
  std::thread runner([&] { result = loop.run(); });
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  auto acks = [&] {
    const std::lock_guard lock(source.mutex_);
    return source.acks_;
  };
  while (acks() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(acks(), 2u) << "the quick messages' acks waited for the stuck handlers";
  {
    const std::lock_guard lock(m);
    release = true;
  }
  cv.notify_all();
  while (acks() < 24 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(acks(), 24u);
  loop.stop();
  runner.join();
  EXPECT_TRUE(result);
  EXPECT_EQ(source.pending(), 0u);
}

TEST(ConsumeLoop, WhatMustNeverRunIsDeadLetteredWithItsReason) {
  FakeSource source;
  MemoryStore store;
  auto consumer = Consumer::create(store, {.name = "loop-test"});
  ASSERT_TRUE(consumer);
  Effects effects;
  auto options = fast_options();
  options.max_message_bytes = 100;
  source.publish("", "no id at all", /*with_id=*/false);
  source.publish("", "an empty id");
  source.publish("has space", "an id breaking the rules");
  source.publish("big", std::string(101, 'x'));
  source.publish("fine", "a good one");
  ConsumeLoop loop(source, process_once_with(*consumer, [&](const Delivery& d) -> std::expected<std::string, std::string> {
                     effects.add(d.message_id);
                     return "ok";
                   }),
                   options);
  ASSERT_TRUE(run_until(loop, [&] { return source.pending() == 0; }));
  ASSERT_EQ(source.dead_.size(), 4u);
  std::map<std::string, std::string> reasons;
  for (const auto& [d, why] : source.dead_) reasons[d.body] = why.reason;
  EXPECT_EQ(reasons["no id at all"], "missing_id");
  EXPECT_EQ(reasons["an empty id"], "invalid_id");
  EXPECT_EQ(reasons["an id breaking the rules"], "invalid_id");
  EXPECT_EQ(reasons[std::string(101, 'x')], "too_large");
  EXPECT_EQ(effects.of("fine"), 1);
  EXPECT_EQ(effects.by_id.size(), 1u);  // none of the others ran
  EXPECT_EQ(loop.stats().dead_lettered.load(), 4u);
  EXPECT_EQ(loop.stats().dead_letters_by_reason().at("invalid_id"), 2u);
}

TEST(ConsumeLoop, APoisonMessageIsDeadLetteredAfterMaxAttemptsWithItsLastError) {
  FakeSource source;
  MemoryStore store;
  auto consumer = Consumer::create(store, {.name = "loop-test"});
  ASSERT_TRUE(consumer);
  std::atomic<int> tries{0};
  Effects effects;
  auto options = fast_options();
  options.max_attempts = 4;
  source.publish("poison", "always fails");
  source.publish("good", "works");
  ConsumeLoop loop(source, process_once_with(*consumer, [&](const Delivery& d) -> std::expected<std::string, std::string> {
                     if (d.message_id == "poison") return std::unexpected("boom " + std::to_string(++tries));
                     effects.add(d.message_id);
                     return "ok";
                   }),
                   options);
  ASSERT_TRUE(run_until(loop, [&] { return source.pending() == 0; }));
  EXPECT_EQ(tries.load(), 4);
  ASSERT_EQ(source.dead_.size(), 1u);
  EXPECT_EQ(source.dead_[0].second.reason, "poison");
  EXPECT_EQ(source.dead_[0].second.last_error, "boom 4");
  EXPECT_EQ(source.dead_[0].second.attempts, 4u);
  EXPECT_NE(source.dead_[0].second.detail.find("boom 4"), std::string::npos);
  EXPECT_EQ(effects.of("good"), 1);
  EXPECT_EQ(loop.stats().retried.load(), 3u);
}

TEST(ConsumeLoop, TheBrokersEarlierDeliveriesCountTowardThePoisonLimit) {
  FakeSource source;
  MemoryStore store;
  auto consumer = Consumer::create(store, {.name = "loop-test"});
  ASSERT_TRUE(consumer);
  std::atomic<int> tries{0};
  auto options = fast_options();
  options.max_attempts = 3;
  source.publish("crashes-consumers", "x");
  source.queue_.front().delivery_count = 4;  // delivered thrice before, each consumer died
  source.publish("failing", "y");
  source.queue_.back().delivery_count = 2;
  ConsumeLoop loop(source, process_once_with(*consumer, [&](const Delivery&) -> std::expected<std::string, std::string> {
                     ++tries;
                     return std::unexpected("no");
                   }),
                   options);
  ASSERT_TRUE(run_until(loop, [&] { return source.pending() == 0; }));
  ASSERT_EQ(source.dead_.size(), 2u);
  EXPECT_EQ(tries.load(), 2);  // "failing": tries 2 and 3 here; "crashes-consumers" never ran
  for (const auto& [d, why] : source.dead_) EXPECT_EQ(why.reason, "poison") << d.message_id;
}

TEST(ConsumeLoop, RedeliveriesAfterTheConnectionWentRunNothingTwice) {
  FakeSource source;
  MemoryStore store;
  auto consumer = Consumer::create(store, {.name = "loop-test"});
  ASSERT_TRUE(consumer);
  Effects effects;
  std::atomic<int> ran{0};
  for (int i = 0; i < 200; ++i) source.publish("m-" + std::to_string(i), "b");
  ConsumeLoop loop(source, process_once_with(*consumer, [&](const Delivery& d) -> std::expected<std::string, std::string> {
                     effects.add(d.message_id);
                     // Halfway, the broker connection goes with deliveries held: acks of those
                     // are stale, the broker gives them all back.
                     if (++ran == 100) source.close();
                     return "ok";
                   }),
                   fast_options());
  ASSERT_TRUE(run_until(loop, [&] { return source.pending() == 0; }));
  for (int i = 0; i < 200; ++i) EXPECT_EQ(effects.of("m-" + std::to_string(i)), 1) << i;
  EXPECT_GT(loop.stats().duplicates.load(), 0u);

}

TEST(ConsumeLoop, ADeadLetterThatCannotBeWrittenIsWrittenLaterWithoutRunningAgain) {
  FakeSource source;
  MemoryStore store;
  auto consumer = Consumer::create(store, {.name = "loop-test"});
  ASSERT_TRUE(consumer);
  std::atomic<int> ran{0};
  source.fail_dead_letters_ = 3;
  source.publish("conflict", "first payload");
  ConsumeLoop loop(source, [&](const Delivery&, const DeliveryAttempt&) {
    ++ran;
    return MessageDisposition::dead_letter_it("rejected", "the handler answered 400");
  }, fast_options());
  ASSERT_TRUE(run_until(loop, [&] { return source.pending() == 0; }));
  EXPECT_EQ(ran.load(), 1);
  ASSERT_EQ(source.dead_.size(), 1u);
  EXPECT_EQ(source.dead_[0].second.reason, "rejected");
  EXPECT_GE(loop.stats().broker_errors.load(), 3u);
}

TEST(ConsumeLoop, ARetryAfterIsHonoured) {
  FakeSource source;
  std::vector<std::chrono::steady_clock::time_point> at;
  std::mutex m;
  source.publish("later", "x");
  ConsumeLoop loop(source, [&](const Delivery&, const DeliveryAttempt& attempt) {
    {
      const std::lock_guard lock(m);
      at.push_back(std::chrono::steady_clock::now());
    }
    if (attempt.number == 1) return MessageDisposition::retry_it("busy", "429", true, 300ms);
    return MessageDisposition::ack_it("processed");
  }, [] {
    auto o = fast_options();
    o.retry_max = 1s;
    return o;
  }());
  ASSERT_TRUE(run_until(loop, [&] { return source.pending() == 0; }));
  ASSERT_EQ(at.size(), 2u);
  EXPECT_GE(at[1] - at[0], 300ms);
}

TEST(ConsumeLoop, StopRequeuesWhatWaitsAndFinishesWhatRuns) {
  FakeSource source;
  std::atomic<int> started{0};
  std::atomic<int> finished{0};
  for (int i = 0; i < 6; ++i) source.publish("m-" + std::to_string(i), "b");
  auto options = fast_options();
  options.workers = 2;
  ConsumeLoop loop(source, [&](const Delivery&, const DeliveryAttempt&) {
    ++started;
    std::this_thread::sleep_for(300ms);
    ++finished;
    return MessageDisposition::ack_it("processed");
  }, options);
  BrokerResult<Done> result;
  std::thread runner([&] { result = loop.run(); });
  while (started.load() < 2) std::this_thread::sleep_for(1ms);
  loop.stop();
  runner.join();
  ASSERT_TRUE(result);
  EXPECT_TRUE(loop.drained());
  EXPECT_EQ(started.load(), finished.load());  // what ran, finished and was acked
  EXPECT_EQ(source.acks_, static_cast<std::size_t>(finished.load()));
  EXPECT_EQ(source.held_.size(), 0u);          // nothing left held: the rest went back
  EXPECT_EQ(source.queue_.size() + source.acks_, 6u);
}

// ---- ordering = key ------------------------------------------------------------------------------

// What ran, per key: (message id, start, end) in start order, and the most that ran at once.
struct KeyRuns {
  std::mutex mutex;
  std::map<std::string, std::vector<std::string>> order;  // key -> ids in the order they ran
  std::map<std::string, int> running;                     // key -> running now
  int overlaps = 0;   // a key's second delivery started while its first ran
  int at_once = 0, most_at_once = 0;
  void start(const Delivery& d) {
    const std::lock_guard lock(mutex);
    if (++running[d.ordering_key] > 1) ++overlaps;
    order[d.ordering_key].push_back(d.message_id);
    most_at_once = std::max(most_at_once, ++at_once);
  }
  void end(const Delivery& d) {
    const std::lock_guard lock(mutex);
    --running[d.ordering_key];
    --at_once;
  }
};

TEST(ConsumeLoop, OrderingByKeyRunsAKeysDeliveriesOneAtATimeInOrderAndKeysSideBySide) {
  FakeSource source;
  constexpr int kKeys = 6, kPerKey = 12;
  for (int i = 0; i < kPerKey; ++i) {
    for (int k = 0; k < kKeys; ++k) source.publish("k" + std::to_string(k) + "-" + std::to_string(i), "b", true, "k" + std::to_string(k));
  }
  KeyRuns runs;
  auto options = fast_options();
  options.ordering = ConsumeOrdering::key;
  ConsumeLoop loop(source, [&](const Delivery& d, const DeliveryAttempt&) {
    runs.start(d);
    std::this_thread::sleep_for(2ms);
    runs.end(d);
    return MessageDisposition::ack_it("processed");
  }, options);
  ASSERT_TRUE(run_until(loop, [&] { return source.acks() == static_cast<std::size_t>(kKeys * kPerKey); }));
  EXPECT_EQ(runs.overlaps, 0);
  EXPECT_GT(runs.most_at_once, 1) << "different keys should run side by side";
  for (int k = 0; k < kKeys; ++k) {
    const std::string key = "k" + std::to_string(k);
    ASSERT_EQ(runs.order[key].size(), static_cast<std::size_t>(kPerKey)) << key;
    for (int i = 0; i < kPerKey; ++i) EXPECT_EQ(runs.order[key][static_cast<std::size_t>(i)], key + "-" + std::to_string(i));
  }
  EXPECT_EQ(loop.stats().waiting_for_key.load(), 0);
}

TEST(ConsumeLoop, WithoutOrderingAKeysDeliveriesRunSideBySide) {
  FakeSource source;
  for (int i = 0; i < 8; ++i) source.publish("m-" + std::to_string(i), "b", true, "same");
  KeyRuns runs;
  ConsumeLoop loop(source, [&](const Delivery& d, const DeliveryAttempt&) {
    runs.start(d);
    std::this_thread::sleep_for(20ms);
    runs.end(d);
    return MessageDisposition::ack_it("processed");
  }, fast_options());
  ASSERT_TRUE(run_until(loop, [&] { return source.acks() == 8u; }));
  EXPECT_GT(runs.overlaps, 0);
}

TEST(ConsumeLoop, OrderingByKeyHoldsAKeyBehindARetryAndLetsItGoOnAfterADeadLetter) {
  FakeSource source;
  source.publish("a-1", "fails twice", true, "a");
  source.publish("a-2", "poison", true, "a");
  source.publish("a-3", "ok", true, "a");
  source.publish("b-1", "ok", true, "b");
  std::mutex mutex;
  std::vector<std::string> ran;  // successful runs, in order
  std::atomic<int> a1_tries{0};
  auto options = fast_options();
  options.ordering = ConsumeOrdering::key;
  options.max_attempts = 3;
  options.retry_min = 30ms;
  options.retry_max = 30ms;
  ConsumeLoop loop(source, [&](const Delivery& d, const DeliveryAttempt&) {
    if (d.message_id == "a-1" && ++a1_tries <= 2) return MessageDisposition::retry_it("handler_failed", "boom", true);
    if (d.message_id == "a-2") return MessageDisposition::retry_it("handler_failed", "always", true);
    const std::lock_guard lock(mutex);
    ran.push_back(d.message_id);
    return MessageDisposition::ack_it("processed");
  }, options);
  ASSERT_TRUE(run_until(loop, [&] { return source.pending() == 0; }));
  // b-1 did not wait for key a; a-2 was dead-lettered after its tries, and only then a-3 ran.
  ASSERT_EQ(ran.size(), 3u);
  EXPECT_EQ(ran[0], "b-1");
  EXPECT_EQ(ran[1], "a-1");
  EXPECT_EQ(ran[2], "a-3");
  ASSERT_EQ(source.dead_.size(), 1u);
  EXPECT_EQ(source.dead_[0].first.message_id, "a-2");
  EXPECT_EQ(source.dead_[0].second.reason, "poison");
}

// With holds: what the processor ran and what it refused, for the hold tests.
struct HoldRig {
  MemoryStore store;
  StoreKeyHolds holds{store, "orders"};
  std::mutex mutex;
  std::vector<std::string> ran;  // successful runs, in order
  std::atomic<bool> broken{true};  // "poison" bodies fail while broken

  ConsumeLoopOptions options() {
    auto o = fast_options();
    o.ordering = ConsumeOrdering::key;
    o.holds = &holds;
    o.max_attempts = 2;
    return o;
  }
  DeliveryProcessor processor() {
    return [this](const Delivery& d, const DeliveryAttempt&) {
      if (d.body == "poison" && broken) return MessageDisposition::retry_it("handler_failed", "the ledger is down", true);
      const std::lock_guard lock(mutex);
      ran.push_back(d.message_id);
      return MessageDisposition::ack_it("processed");
    };
  }
  std::vector<std::string> ran_of(char key) {
    const std::lock_guard lock(mutex);
    std::vector<std::string> of;
    for (const auto& id : ran) {
      if (id[0] == key) of.push_back(id);
    }
    return of;
  }
  // The operator's replay: the dead letters given back to the queue in their order, then
  // forgotten by the dead-letter queue.
  static void replay(FakeSource& source) {
    std::vector<std::pair<Delivery, DeadLetterReason>> dead;
    {
      const std::lock_guard lock(source.mutex_);
      dead.swap(source.dead_);
    }
    for (auto& [d, why] : dead) source.publish(d.message_id, d.body, true, d.ordering_key);
  }
  std::vector<std::string> parked(std::string_view key) {
    auto p = holds.parked(key);
    EXPECT_TRUE(p.has_value());
    return p ? *p : std::vector<std::string>{};
  }
};

TEST(ConsumeLoop, WithHoldsADeadLetterParksItsKeysLaterDeliveriesUntilTheyAreReplayedInOrder) {
  HoldRig rig;
  FakeSource source;
  source.publish("a-1", "ok", true, "a");
  source.publish("a-2", "poison", true, "a");
  source.publish("a-3", "ok", true, "a");
  source.publish("b-1", "ok", true, "b");
  source.publish("a-4", "ok", true, "a");
  source.publish("b-2", "ok", true, "b");
  {
    ConsumeLoop loop(source, rig.processor(), rig.options());
    ASSERT_TRUE(run_until(loop, [&] { return source.pending() == 0; }));
    EXPECT_EQ(loop.stats().dead_letters_by_reason().at("held"), 2u);
  }
  // Key b went on; key a ran up to its dead letter, and the rest waits behind it, in order.
  EXPECT_EQ(rig.ran_of('b'), (std::vector<std::string>{"b-1", "b-2"}));
  EXPECT_EQ(rig.ran_of('a'), (std::vector<std::string>{"a-1"}));
  ASSERT_EQ(source.dead_.size(), 3u);
  EXPECT_EQ(source.dead_[0].first.message_id, "a-2");
  EXPECT_EQ(source.dead_[0].second.reason, "poison");
  EXPECT_EQ(source.dead_[1].first.message_id, "a-3");
  EXPECT_EQ(source.dead_[1].second.reason, "held");
  EXPECT_NE(source.dead_[1].second.detail.find("held behind message a-2"), std::string::npos);
  EXPECT_EQ(source.dead_[2].first.message_id, "a-4");
  EXPECT_EQ(rig.parked("a"), (std::vector<std::string>{"a-2", "a-3", "a-4"}));
  EXPECT_TRUE(rig.parked("b").empty());

  // A new message of the held key, on another consumer of the same name: parked too.
  source.publish("a-5", "ok", true, "a");
  {
    ConsumeLoop loop(source, rig.processor(), rig.options());
    ASSERT_TRUE(run_until(loop, [&] { return source.pending() == 0; }));
  }
  EXPECT_EQ(rig.parked("a"), (std::vector<std::string>{"a-2", "a-3", "a-4", "a-5"}));

  // Fixed, replayed in order: each runs in turn, the hold ends, and the key flows again.
  rig.broken = false;
  HoldRig::replay(source);
  source.publish("a-6", "ok", true, "a");
  {
    ConsumeLoop loop(source, rig.processor(), rig.options());
    ASSERT_TRUE(run_until(loop, [&] { return source.pending() == 0; }));
  }
  EXPECT_EQ(rig.ran_of('a'), (std::vector<std::string>{"a-1", "a-2", "a-3", "a-4", "a-5", "a-6"}));
  EXPECT_TRUE(source.dead_.empty());
  EXPECT_TRUE(rig.parked("a").empty());
}

TEST(ConsumeLoop, WithHoldsAReplayOutOfOrderRunsNothingOutOfTurnAndADroppedFirstLetsTheNextRun) {
  HoldRig rig;
  FakeSource source;
  source.publish("a-1", "poison", true, "a");
  source.publish("a-2", "ok", true, "a");
  source.publish("a-3", "ok", true, "a");
  {
    ConsumeLoop loop(source, rig.processor(), rig.options());
    ASSERT_TRUE(run_until(loop, [&] { return source.pending() == 0; }));
  }
  ASSERT_EQ(rig.parked("a"), (std::vector<std::string>{"a-1", "a-2", "a-3"}));

  // a-3 replayed alone: not its turn, parked again; the hold is unchanged.
  {
    const std::lock_guard lock(source.mutex_);
    source.dead_.clear();
  }
  source.publish("a-3", "ok", true, "a");
  {
    ConsumeLoop loop(source, rig.processor(), rig.options());
    ASSERT_TRUE(run_until(loop, [&] { return source.pending() == 0; }));
  }
  EXPECT_TRUE(rig.ran_of('a').empty());
  ASSERT_EQ(source.dead_.size(), 1u);
  EXPECT_EQ(source.dead_[0].second.reason, "held");
  EXPECT_EQ(rig.parked("a"), (std::vector<std::string>{"a-1", "a-2", "a-3"}));

  // The operator drops a-1 (its effect is not wanted, or was done by hand), then replays the rest.
  ASSERT_TRUE(rig.holds.unpark_first("a", "a-1"));
  {
    const std::lock_guard lock(source.mutex_);
    source.dead_.clear();
  }
  source.publish("a-2", "ok", true, "a");
  source.publish("a-3", "ok", true, "a");
  {
    ConsumeLoop loop(source, rig.processor(), rig.options());
    ASSERT_TRUE(run_until(loop, [&] { return source.pending() == 0; }));
  }
  EXPECT_EQ(rig.ran_of('a'), (std::vector<std::string>{"a-2", "a-3"}));
  EXPECT_TRUE(rig.parked("a").empty());
}

TEST(ConsumeLoop, WithHoldsAMessageRefusedBeforeItRunsHoldsItsKeyInItsTurn) {
  HoldRig rig;
  FakeSource source;
  auto options = rig.options();
  options.max_message_bytes = 8;
  source.publish("a-1", "ok", true, "a");
  source.publish("a-2", std::string(64, 'x'), true, "a");  // too large
  source.publish("a-3", "ok", true, "a");
  {
    ConsumeLoop loop(source, rig.processor(), options);
    ASSERT_TRUE(run_until(loop, [&] { return source.pending() == 0; }));
  }
  EXPECT_EQ(rig.ran_of('a'), (std::vector<std::string>{"a-1"}));
  ASSERT_EQ(source.dead_.size(), 2u);
  EXPECT_EQ(source.dead_[0].second.reason, "too_large");
  EXPECT_EQ(source.dead_[1].second.reason, "held");
  EXPECT_EQ(rig.parked("a"), (std::vector<std::string>{"a-2", "a-3"}));
}

TEST(ConsumeLoop, OrderingByKeyStopRequeuesAKeysWaitingDeliveriesInOrder) {
  FakeSource source;
  for (int i = 0; i < 5; ++i) source.publish("a-" + std::to_string(i), "b", true, "a");
  std::atomic<int> started{0};
  auto options = fast_options();
  options.ordering = ConsumeOrdering::key;
  ConsumeLoop loop(source, [&](const Delivery&, const DeliveryAttempt&) {
    ++started;
    std::this_thread::sleep_for(200ms);
    return MessageDisposition::ack_it("processed");
  }, options);
  BrokerResult<Done> result;
  std::thread runner([&] { result = loop.run(); });
  while (started.load() < 1) std::this_thread::sleep_for(1ms);
  loop.stop();
  runner.join();
  ASSERT_TRUE(result);
  EXPECT_TRUE(loop.drained());
  EXPECT_EQ(started.load(), 1);
  EXPECT_EQ(source.acks_, 1u);
  EXPECT_EQ(source.held_.size(), 0u);
  // The four that waited went back; the fake source puts each requeued one at the front, so the
  // last requeued is first: they were requeued in order a-1 .. a-4.
  ASSERT_EQ(source.queue_.size(), 4u);
  EXPECT_EQ(source.queue_.front().message_id, "a-4");
  EXPECT_EQ(source.queue_.back().message_id, "a-1");
}

TEST(ConsumeLoop, OrderingByKeyDoesNotRunALostConnectionsLaterDeliveriesAfterAnUnprocessedOne) {
  // a-1 is to be dead-lettered, but its connection is gone by then (stale): it comes again, so
  // a-2 and a-3, held behind it on the same connection, must not run now.
  FakeSource source;
  source.publish("a-1", "bad", true, "a");
  source.publish("a-2", "ok", true, "a");
  source.publish("a-3", "ok", true, "a");
  std::mutex mutex;
  std::vector<std::string> ran;
  std::atomic<bool> closed{false};
  auto options = fast_options();
  options.ordering = ConsumeOrdering::key;
  ConsumeLoop loop(source, [&](const Delivery& d, const DeliveryAttempt&) {
    if (d.message_id == "a-1" && !closed.exchange(true)) {
      source.close();  // the connection goes while a-1 runs
      return MessageDisposition::dead_letter_it("rejected", "refused");
    }
    const std::lock_guard lock(mutex);
    ran.push_back(d.message_id);
    return MessageDisposition::ack_it("processed");
  }, options);
  ASSERT_TRUE(run_until(loop, [&] {
    const std::lock_guard lock(mutex);
    return ran.size() >= 3;
  }));
  // The redelivered a-1 (now processed) comes before a-2 and a-3.
  ASSERT_GE(ran.size(), 3u);
  EXPECT_EQ(ran[0], "a-1");
  EXPECT_EQ(ran[1], "a-2");
  EXPECT_EQ(ran[2], "a-3");
}

// ---- the batched form (a Consumer and an effect) ------------------------------------------------

// A memory store that counts its calls, single and batched.
class CountingStore final : public Store {
 public:
  MemoryStore inner;
  std::atomic<int> claims{0}, claim_batches{0}, claim_items{0}, completes{0}, complete_batches{0}, complete_items{0},
      releases{0};

  void claim(ClaimRequest r, Callback<ClaimResult> done) override {
    ++claims;
    inner.claim(std::move(r), std::move(done));
  }
  void claim_many(std::vector<ClaimRequest> r, BatchCallback<ClaimResult> done) override {
    ++claim_batches;
    claim_items += static_cast<int>(r.size());
    inner.claim_many(std::move(r), std::move(done));
  }
  void complete(CompleteRequest r, Callback<FenceStatus> done) override {
    ++completes;
    inner.complete(std::move(r), std::move(done));
  }
  void complete_many(std::vector<CompleteRequest> r, BatchCallback<FenceStatus> done) override {
    ++complete_batches;
    complete_items += static_cast<int>(r.size());
    if (failing_completions.load() > 0) {
      --failing_completions;  // the store is down: nothing written
      BatchResults<FenceStatus> down;
      for (std::size_t i = 0; i < r.size(); ++i) down.push_back(std::unexpected(StoreError{StoreErrc::unavailable, "down", true}));
      done(std::move(down));
      return;
    }
    inner.complete_many(std::move(r), std::move(done));
  }
  std::atomic<int> failing_completions{0};  // complete_many calls answered "unavailable", first
  void fail(FailRequest r, Callback<FenceStatus> done) override { inner.fail(std::move(r), std::move(done)); }
  void release(Fence f, Callback<FenceStatus> done) override {
    ++releases;
    inner.release(std::move(f), std::move(done));
  }
  void abandon(AbandonRequest r, Callback<FenceStatus> done) override { inner.abandon(std::move(r), std::move(done)); }
  void get(RecordId id, Callback<std::optional<Record>> done) override { inner.get(std::move(id), std::move(done)); }
  void purge_expired(TimePoint now, std::size_t limit, Callback<std::size_t> done) override {
    inner.purge_expired(now, limit, std::move(done));
  }
  void ping(Callback<Done> done) override { inner.ping(std::move(done)); }
};

Consumer batch_consumer(Store& store) {
  auto c = Consumer::create(store, {.name = "ledger"});
  EXPECT_TRUE(c) << (c ? "" : c.error());
  return std::move(*c);
}

TEST(ConsumeLoop, TheBatchedFormClaimsAReceiveWithOneCallAndSharesCompletions) {
  CountingStore store;
  Consumer consumer = batch_consumer(store);
  FakeSource source;
  constexpr int kMessages = 64;
  for (int i = 0; i < kMessages; ++i) source.publish("m-" + std::to_string(i), "body");
  Effects effects;
  auto options = fast_options();
  options.max_in_flight = 64;
  ConsumeLoop loop(source, consumer, [&](const Delivery& d, const DeliveryAttempt&) -> std::expected<std::string, MessageDisposition> {
    effects.add(d.message_id);
    return "done";
  }, options);
  ASSERT_TRUE(run_until(loop, [&] { return source.acks() == static_cast<std::size_t>(kMessages); }));
  for (int i = 0; i < kMessages; ++i) EXPECT_EQ(effects.of("m-" + std::to_string(i)), 1);
  EXPECT_EQ(store.claims.load(), 0) << "every delivery was claimed with its receive's batch";
  EXPECT_EQ(store.claim_items.load(), kMessages);
  EXPECT_LE(store.claim_batches.load(), 4);
  EXPECT_EQ(store.completes.load(), 0);
  EXPECT_EQ(store.complete_items.load(), kMessages);
  EXPECT_LT(store.complete_batches.load(), kMessages) << "completions finishing together share a call";
  EXPECT_EQ(loop.stats().processed.load(), static_cast<std::uint64_t>(kMessages));
  // Delivered again: duplicates, acked without running.
  for (int i = 0; i < 8; ++i) source.publish("m-" + std::to_string(i), "body");
  ConsumeLoop again(source, consumer, [&](const Delivery& d, const DeliveryAttempt&) -> std::expected<std::string, MessageDisposition> {
    effects.add(d.message_id);
    return "done";
  }, options);
  ASSERT_TRUE(run_until(again, [&] { return source.acks() == static_cast<std::size_t>(kMessages + 8); }));
  EXPECT_EQ(again.stats().duplicates.load(), 8u);
  EXPECT_EQ(effects.of("m-0"), 1);
}

// Cheap effects are taken up to 16 at once by one worker; when one of them hangs, the rest of its
// share must not wait for it: the receiving thread gives them back to the other workers.
TEST(ConsumeLoop, AStalledCheapEffectHoldsUpNoneOfTheMessagesTakenWithIt) {
  CountingStore store;
  Consumer consumer = batch_consumer(store);
  FakeSource source;
  constexpr int kWarmUp = 200;  // cheap effects, so that the loop takes them in shares
  for (int i = 0; i < kWarmUp; ++i) source.publish("warm-" + std::to_string(i), "body");
  std::mutex mutex;
  std::condition_variable released_cv;
  bool released = false;
  std::atomic<bool> stalled{false};
  auto options = fast_options();
  options.max_in_flight = 64;
  ConsumeLoop loop(source, consumer, [&](const Delivery& d, const DeliveryAttempt&) -> std::expected<std::string, MessageDisposition> {
    if (d.message_id == "stall") {
      stalled = true;
      std::unique_lock lock(mutex);
      released_cv.wait_for(lock, 20s, [&] { return released; });
    }
    return "done";
  }, options);
  BrokerResult<Done> result;
  std::thread runner([&] { result = loop.run(); });
  const auto wait_for = [](auto done) {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!done() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(2ms);
    return done();
  };
  EXPECT_TRUE(wait_for([&] { return source.acks() == static_cast<std::size_t>(kWarmUp); }));
  // One receive: the stalling message first, so that the worker taking it takes a share with it.
  constexpr int kAfter = 31;
  source.publish("stall", "body");
  for (int i = 0; i < kAfter; ++i) source.publish("after-" + std::to_string(i), "body");
  EXPECT_TRUE(wait_for([&] { return stalled.load(); }));
  EXPECT_TRUE(wait_for([&] { return source.acks() == static_cast<std::size_t>(kWarmUp + kAfter); }))
      << "messages taken with the stalled one waited for it";
  EXPECT_EQ(source.acks(), static_cast<std::size_t>(kWarmUp + kAfter)) << "the stalled one is not acked before it ends";
  {
    const std::lock_guard lock(mutex);
    released = true;
  }
  released_cv.notify_all();
  EXPECT_TRUE(wait_for([&] { return source.acks() == static_cast<std::size_t>(kWarmUp + kAfter + 1); }));
  loop.stop();
  runner.join();
  EXPECT_TRUE(result.has_value());
  EXPECT_EQ(loop.stats().processed.load(), static_cast<std::uint64_t>(kWarmUp + kAfter + 1));
}

TEST(ConsumeLoop, TheBatchedFormWritesACompletionTheStoreDidNotTakeAgainAndNeverRunsTheEffectTwice) {
  CountingStore store;
  store.failing_completions = 3;  // the store goes away just after the effects ran
  Consumer consumer = batch_consumer(store);
  FakeSource source;
  constexpr int kMessages = 16;
  for (int i = 0; i < kMessages; ++i) source.publish("m-" + std::to_string(i), "body");
  Effects effects;
  auto options = fast_options();
  options.max_in_flight = kMessages;
  ConsumeLoop loop(source, consumer, [&](const Delivery& d, const DeliveryAttempt&) -> std::expected<std::string, MessageDisposition> {
    effects.add(d.message_id);
    return "done";
  }, options);
  ASSERT_TRUE(run_until(loop, [&] { return source.acks() == static_cast<std::size_t>(kMessages); }));
  for (int i = 0; i < kMessages; ++i) EXPECT_EQ(effects.of("m-" + std::to_string(i)), 1) << i;
  EXPECT_EQ(store.failing_completions.load(), 0);
  // Not claimed again: the retries wrote the completions they kept, with their claims' fences.
  EXPECT_EQ(store.claims.load(), 0);
  EXPECT_EQ(store.claim_items.load(), kMessages);
  EXPECT_GE(loop.stats().retried.load(), 1u);
  EXPECT_EQ(loop.stats().processed.load(), static_cast<std::uint64_t>(kMessages));
  // Every record is complete: delivered again, each is a duplicate.
  for (int i = 0; i < kMessages; ++i) source.publish("m-" + std::to_string(i), "body");
  ConsumeLoop again(source, consumer, [&](const Delivery& d, const DeliveryAttempt&) -> std::expected<std::string, MessageDisposition> {
    effects.add(d.message_id);
    return "done";
  }, options);
  ASSERT_TRUE(run_until(again, [&] { return source.acks() == static_cast<std::size_t>(2 * kMessages); }));
  EXPECT_EQ(again.stats().duplicates.load(), static_cast<std::uint64_t>(kMessages));
}

TEST(ConsumeLoop, TheBatchedFormRunsAnIdTwiceInOneReceiveOnce) {
  CountingStore store;
  Consumer consumer = batch_consumer(store);
  FakeSource source;
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 5; ++i) source.publish("m-" + std::to_string(i), "body");
  }
  Effects effects;
  ConsumeLoop loop(source, consumer, [&](const Delivery& d, const DeliveryAttempt&) -> std::expected<std::string, MessageDisposition> {
    effects.add(d.message_id);
    std::this_thread::sleep_for(2ms);
    return "done";
  }, fast_options());
  ASSERT_TRUE(run_until(loop, [&] { return source.acks() == 15u; }));
  for (int i = 0; i < 5; ++i) EXPECT_EQ(effects.of("m-" + std::to_string(i)), 1);
}

TEST(ConsumeLoop, TheBatchedFormRetriesAFailedEffectAndDeadLettersARejectedOne) {
  CountingStore store;
  Consumer consumer = batch_consumer(store);
  FakeSource source;
  source.publish("flaky", "b");
  source.publish("bad", "b");
  source.publish("fine", "b");
  std::atomic<int> flaky_tries{0};
  Effects effects;
  ConsumeLoop loop(source, consumer, [&](const Delivery& d, const DeliveryAttempt&) -> std::expected<std::string, MessageDisposition> {
    if (d.message_id == "flaky" && ++flaky_tries < 3) {
      return std::unexpected(MessageDisposition::retry_it("handler_failed", "try again", true));
    }
    if (d.message_id == "bad") return std::unexpected(MessageDisposition::dead_letter_it("rejected", "HTTP 422"));
    effects.add(d.message_id);
    return "done";
  }, fast_options());
  ASSERT_TRUE(run_until(loop, [&] { return source.pending() == 0; }));
  EXPECT_EQ(effects.of("flaky"), 1);
  EXPECT_EQ(effects.of("fine"), 1);
  EXPECT_EQ(flaky_tries.load(), 3);
  ASSERT_EQ(source.dead_.size(), 1u);
  EXPECT_EQ(source.dead_[0].second.reason, "rejected");
  EXPECT_GE(store.claims.load(), 2) << "a retry claims on its own";
  // The failed tries' claims were forgotten: the rejected message's record is gone, so it runs
  // when replayed.
  auto record = BlockingStore(store).get({"consumer ledger", "bad"});
  ASSERT_TRUE(record);
  EXPECT_FALSE(record->has_value());
}

TEST(ConsumeLoop, TheBatchedFormForgetsTheClaimsOfWhatItHandsBackOnStop) {
  CountingStore store;
  Consumer consumer = batch_consumer(store);
  FakeSource source;
  for (int i = 0; i < 6; ++i) source.publish("m-" + std::to_string(i), "b");
  auto options = fast_options();
  options.workers = 1;
  std::atomic<int> started{0};
  ConsumeLoop loop(source, consumer, [&](const Delivery&, const DeliveryAttempt&) -> std::expected<std::string, MessageDisposition> {
    ++started;
    std::this_thread::sleep_for(100ms);
    return "done";
  }, options);
  ASSERT_TRUE(run_until(loop, [&] { return started.load() >= 1; }));
  ASSERT_TRUE(loop.drained());
  // What did not run went back to the broker with its claim forgotten: no record in progress.
  ListQuery query;
  query.state = RecordState::in_progress;
  auto in_progress = wait_for<std::vector<Record>>([&](auto cb) { store.inner.list(query, std::move(cb)); });
  ASSERT_TRUE(in_progress);
  EXPECT_TRUE(in_progress->empty()) << in_progress->size() << " claims left behind";
  EXPECT_GE(store.releases.load(), 1);
}

TEST(ConsumeLoop, TheBatchProcessorGetsAReceiveTogetherAndRetriesAlone) {
  FakeSource source;
  constexpr int kMessages = 40;
  for (int i = 0; i < kMessages; ++i) source.publish("m-" + std::to_string(i), i == 5 ? "flaky" : i == 9 ? "bad" : "ok");
  std::mutex mutex;
  std::vector<std::size_t> sizes;
  Effects effects;
  std::atomic<int> flaky_tries{0};
  auto options = fast_options();
  options.max_in_flight = 64;
  ConsumeLoop loop(source, [&](const std::vector<BatchItem>& items) {
    {
      const std::lock_guard lock(mutex);
      sizes.push_back(items.size());
    }
    std::vector<MessageDisposition> out;
    for (const BatchItem& item : items) {
      if (item.delivery.body == "flaky" && ++flaky_tries < 3) {
        out.push_back(MessageDisposition::retry_it("handler_failed", "not yet", true));
      } else if (item.delivery.body == "bad") {
        out.push_back(MessageDisposition::dead_letter_it("rejected", "no such account"));
      } else {
        effects.add(item.delivery.message_id);
        out.push_back(MessageDisposition::ack_it("processed"));
      }
    }
    return out;
  }, options);
  ASSERT_TRUE(run_until(loop, [&] { return source.pending() == 0; }));
  for (int i = 0; i < kMessages; ++i) {
    if (i != 9) {
      EXPECT_EQ(effects.of("m-" + std::to_string(i)), 1) << i;
    }
  }
  ASSERT_EQ(source.dead_.size(), 1u);
  EXPECT_EQ(source.dead_[0].first.message_id, "m-9");
  const std::lock_guard lock(mutex);
  ASSERT_FALSE(sizes.empty());
  EXPECT_GT(*std::max_element(sizes.begin(), sizes.end()), 1u) << "a receive's deliveries come together";
  EXPECT_EQ(std::count(sizes.begin(), sizes.end(), 1u), 2) << "the two retries of m-5 come alone";
}

TEST(ConsumeLoop, TheBatchProcessorKeepsAKeysOrderAndAnswerCountsAreChecked) {
  FakeSource source;
  for (int i = 0; i < 6; ++i) source.publish("a-" + std::to_string(i), "ok", true, "a");
  source.publish("b-0", "ok", true, "b");
  KeyRuns runs;
  auto options = fast_options();
  options.ordering = ConsumeOrdering::key;
  std::atomic<bool> short_answer{true};
  ConsumeLoop loop(source, [&](const std::vector<BatchItem>& items) {
    std::vector<MessageDisposition> out;
    for (const BatchItem& item : items) {
      runs.start(item.delivery);
      runs.end(item.delivery);
      out.push_back(MessageDisposition::ack_it("processed"));
    }
    if (short_answer.exchange(false)) out.pop_back();  // a processor answering too few: every item retried
    return out;
  }, options);
  ASSERT_TRUE(run_until(loop, [&] { return source.acks() == 7u; }));
  EXPECT_EQ(runs.overlaps, 0);
  // Each key's first successful run is in delivery order (the short answer's items ran again).
  std::vector<std::string> firsts;
  for (const auto& id : runs.order["a"]) {
    if (std::find(firsts.begin(), firsts.end(), id) == firsts.end()) firsts.push_back(id);
  }
  ASSERT_EQ(firsts.size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(firsts[static_cast<std::size_t>(i)], "a-" + std::to_string(i));
}

TEST(ConsumeLoop, RefusedAtTheStartIsReturned) {
  FakeSource source;
  source.refuse_ = true;
  ConsumeLoop loop(source, [](const Delivery&, const DeliveryAttempt&) { return MessageDisposition::ack_it(); },
                   fast_options());
  auto result = loop.run();
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code, BrokerErrc::refused);
  EXPECT_FALSE(loop.ready());
}

TEST(ConsumeLoop, OutcomesMapToDispositions) {
  using S = MessageStatus;
  using A = MessageDisposition::Action;
  auto of = [](S s) { return disposition_of(MessageOutcome{s, "", "why"}); };
  EXPECT_EQ(of(S::processed).action, A::ack);
  EXPECT_EQ(of(S::duplicate).action, A::ack);
  EXPECT_EQ(of(S::handler_failed).action, A::retry);
  EXPECT_TRUE(of(S::handler_failed).counts_as_attempt);
  EXPECT_EQ(of(S::in_progress).action, A::retry);
  EXPECT_FALSE(of(S::in_progress).counts_as_attempt);
  EXPECT_FALSE(of(S::lost).counts_as_attempt);
  EXPECT_EQ(of(S::conflict).action, A::dead_letter);
  EXPECT_EQ(of(S::invalid_id).reason, "invalid_id");
  EXPECT_EQ(of(S::outcome_unknown).reason, "outcome_unknown");
  const auto down = disposition_of(std::unexpected(StoreError{StoreErrc::unavailable, "down", false}));
  EXPECT_EQ(down.action, A::retry);
  EXPECT_FALSE(down.counts_as_attempt);
  const auto corrupt = disposition_of(std::unexpected(StoreError{StoreErrc::corrupt, "bad", false}));
  EXPECT_TRUE(corrupt.counts_as_attempt);
}

}  // namespace
}  // namespace idem
