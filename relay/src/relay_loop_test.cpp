#include "relay_loop.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <thread>

namespace idem::relay {
namespace {

using namespace std::chrono_literals;

// An outbox in memory, as the loop's unit tests need it (the SQLite and PostgreSQL readers have
// their own tests): rows claimed in id order when due, settled as told.
class FakeOutbox final : public OutboxReader {
 public:
  void add(std::string id, std::string body = "b", std::string key = "") {
    const std::lock_guard lock(mutex);
    OutboxRow row;
    row.id = static_cast<std::int64_t>(rows.size() + 1);
    row.message.message_id = std::move(id);
    row.message.body = std::move(body);
    row.message.ordering_key = std::move(key);
    row.created = SystemClock::instance().now();
    rows[row.id] = row;
  }
  StoreResult<std::vector<OutboxRow>> claim(const OutboxClaim& c) override {
    const std::lock_guard lock(mutex);
    if (down) return std::unexpected(StoreError{StoreErrc::unavailable, "outbox down", false});
    last_dead_rows_pass = c.dead_rows_pass;
    std::vector<OutboxRow> out;
    std::set<std::string> keys_behind;  // keys with an earlier row not sent (the stores' rule)
    for (auto& [id, row] : rows) {
      if (out.size() >= c.limit) break;
      const std::string& key = row.message.ordering_key;
      const bool waits = !key.empty() && keys_behind.count(key) > 0;
      if (!key.empty() && row.state != OutboxState::sent) keys_behind.insert(key);
      if (row.state == OutboxState::pending && row.next_attempt <= c.now && !waits) out.push_back(row);
    }
    return out;
  }
  StoreResult<Done> settle(const std::vector<OutboxResult>& results, TimePoint, const std::string&) override {
    const std::lock_guard lock(mutex);
    for (const auto& r : results) {
      OutboxRow& row = rows.at(r.id);
      switch (r.kind) {
        case OutboxResult::Kind::sent: row.state = OutboxState::sent; break;
        case OutboxResult::Kind::retry: ++row.attempts; row.next_attempt = r.next_attempt; row.last_error = r.error; break;
        case OutboxResult::Kind::postpone: row.next_attempt = r.next_attempt; row.last_error = r.error; break;
        case OutboxResult::Kind::dead: ++row.attempts; row.state = OutboxState::dead; row.last_error = r.error; break;
      }
    }
    return Done{};
  }
  StoreResult<std::size_t> purge_sent(TimePoint, std::size_t) override { return 0; }
  StoreResult<OutboxCounts> count() override {
    const std::lock_guard lock(mutex);
    OutboxCounts c;
    for (auto& [id, row] : rows) {
      if (row.state == OutboxState::pending) ++c.pending;
      if (row.state == OutboxState::sent) ++c.sent;
      if (row.state == OutboxState::dead) ++c.dead;
    }
    return c;
  }
  StoreResult<std::vector<OutboxRow>> list(const OutboxQuery&) override { return std::vector<OutboxRow>{}; }
  StoreResult<std::optional<OutboxRow>> get(std::int64_t) override { return std::optional<OutboxRow>{}; }
  StoreResult<bool> retry_dead(std::int64_t, TimePoint) override { return false; }
  StoreResult<bool> drop_dead(std::int64_t) override { return false; }
  StoreResult<Done> ping() override { return Done{}; }

  OutboxRow row(std::int64_t id) {
    const std::lock_guard lock(mutex);
    return rows.at(id);
  }
  std::mutex mutex;
  std::map<std::int64_t, OutboxRow> rows;
  std::vector<std::string> last_dead_rows_pass;
  bool down = false;
};

// A sink that records what it got, failing as told.
class FakeSink final : public MessageSink {
 public:
  std::vector<BrokerResult<Done>> publish(std::span<const OutgoingMessage> messages) override {
    const std::lock_guard lock(mutex);
    std::vector<BrokerResult<Done>> out;
    for (const auto& m : messages) {
      keys[m.message_id] = m.ordering_key;
      if (rejects.count(m.message_id)) {
        out.push_back(std::unexpected(BrokerError{BrokerErrc::rejected, "too large for the sink", false}));
      } else if (failures_left.count(m.message_id) && failures_left[m.message_id] > 0) {
        --failures_left[m.message_id];
        out.push_back(std::unexpected(BrokerError{BrokerErrc::unavailable, "the endpoint answered 503", true}));
      } else if (away) {
        out.push_back(std::unexpected(BrokerError{BrokerErrc::unavailable, "connection refused", false}));
      } else {
        published.push_back(m.message_id);
        out.push_back(Done{});
      }
    }
    return out;
  }
  BrokerResult<Done> ping() override {
    const std::lock_guard lock(mutex);
    if (away) return std::unexpected(BrokerError{BrokerErrc::unavailable, "connection refused", false});
    return Done{};
  }
  std::string name() const override { return "fake"; }

  std::vector<std::string> got() {
    const std::lock_guard lock(mutex);
    return published;
  }
  std::mutex mutex;
  std::map<std::string, std::string> keys;  // message id -> the ordering key it was published with
  std::vector<std::string> published;
  std::map<std::string, int> failures_left;
  std::set<std::string> rejects;
  bool away = false;
};

RelayOptions fast() {
  RelayOptions o;
  o.batch = 10;
  o.poll_interval = 5ms;
  o.retry_min = 5ms;
  o.retry_max = 20ms;
  o.max_attempts = 4;
  o.owner = "test";
  return o;
}

template <class Until>
void run_until(RelayLoop& loop, Until done) {
  std::thread t([&] { loop.run(); });
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (!done() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(2ms);
  EXPECT_TRUE(done()) << "the relay did not get there within 10 s";
  loop.stop();
  t.join();
}

TEST(RelayLoop, PublishesEveryRowInEnqueueOrder) {
  FakeOutbox outbox;
  FakeSink sink;
  for (int i = 0; i < 35; ++i) outbox.add("m-" + std::to_string(i));
  RelayLoop loop(outbox, sink, fast());
  run_until(loop, [&] { return sink.got().size() == 35; });
  const auto got = sink.got();
  for (int i = 0; i < 35; ++i) EXPECT_EQ(got[i], "m-" + std::to_string(i));
  EXPECT_EQ(outbox.count()->pending, 0u);
  EXPECT_EQ(loop.stats().published.load(), 35u);
}

TEST(RelayLoop, KeyedRowsGoWithTheirKeyAndAShortBatchOfThemIsNotFollowedByAPollWait) {
  FakeOutbox outbox;
  FakeSink sink;
  // The store hands out one row of a key at a time: 3 keys x 8 rows come in batches of 3, each
  // short of the batch size. With a poll wait after each, 8 rounds would take 80 s.
  for (int i = 0; i < 8; ++i) {
    for (const char* key : {"pay_a", "pay_b", "pay_c"}) outbox.add(std::string(key) + "-" + std::to_string(i), "b", key);
  }
  RelayOptions o = fast();
  o.poll_interval = 10s;
  o.dead_rows_pass = {"refunds"};
  RelayLoop loop(outbox, sink, o);
  run_until(loop, [&] { return sink.got().size() == 24; });
  std::map<std::string, int> next;
  for (const std::string& id : sink.got()) {
    const std::string key = id.substr(0, 5);
    EXPECT_EQ(id, key + "-" + std::to_string(next[key]++));
    EXPECT_EQ(sink.keys.at(id), key);
  }
  EXPECT_EQ(outbox.last_dead_rows_pass, std::vector<std::string>{"refunds"});
}

TEST(RelayLoop, AFailedRowHoldsBackTheRowsAfterItAndOnlyItCounts) {
  FakeOutbox outbox;
  FakeSink sink;
  for (int i = 0; i < 5; ++i) outbox.add("m-" + std::to_string(i));
  sink.failures_left["m-2"] = 2;
  RelayLoop loop(outbox, sink, fast());
  run_until(loop, [&] { return outbox.count()->pending == 0; });
  // m-3 and m-4 went through on the first round too (the sink took them), but every round after
  // started again from m-2: nothing after it overtook it for good.
  const auto got = sink.got();
  ASSERT_FALSE(got.empty());
  EXPECT_EQ(std::count(got.begin(), got.end(), "m-2"), 1);
  EXPECT_EQ(outbox.row(3).attempts, 2u);  // m-2 failed twice
  EXPECT_EQ(outbox.row(4).attempts, 0u);  // behind it: postponed, not counted
  EXPECT_EQ(outbox.row(3).state, OutboxState::sent);
}

TEST(RelayLoop, ARowTheSinkRefusesIsDeadAtOnceAndTheRestGoOn) {
  FakeOutbox outbox;
  FakeSink sink;
  outbox.add("ok-1");
  outbox.add("huge");
  outbox.add("ok-2");
  sink.rejects.insert("huge");
  RelayLoop loop(outbox, sink, fast());
  run_until(loop, [&] { return outbox.count()->pending == 0; });
  EXPECT_EQ(outbox.row(2).state, OutboxState::dead);
  EXPECT_NE(outbox.row(2).last_error.find("too large"), std::string::npos);
  EXPECT_EQ(sink.got(), (std::vector<std::string>{"ok-1", "ok-2"}));
  EXPECT_EQ(loop.stats().dead.load(), 1u);
}

TEST(RelayLoop, ARowFailingMaxAttemptsTimesIsDead) {
  FakeOutbox outbox;
  FakeSink sink;
  outbox.add("flaky");
  outbox.add("after");
  sink.failures_left["flaky"] = 100;
  RelayLoop loop(outbox, sink, fast());
  run_until(loop, [&] { return outbox.count()->pending == 0; });
  EXPECT_EQ(outbox.row(1).state, OutboxState::dead);
  EXPECT_EQ(outbox.row(1).attempts, 4u);
  EXPECT_NE(outbox.row(1).last_error.find("gave up after 4 publishes"), std::string::npos);
  EXPECT_EQ(outbox.row(2).state, OutboxState::sent);
}

TEST(RelayLoop, ASinkOutageKillsNoRowAndEverythingGoesOnceItIsBack) {
  FakeOutbox outbox;
  FakeSink sink;
  for (int i = 0; i < 20; ++i) outbox.add("m-" + std::to_string(i));
  sink.away = true;
  RelayLoop loop(outbox, sink, fast());
  std::thread t([&] { loop.run(); });
  std::this_thread::sleep_for(300ms);  // far more rounds than max_attempts
  EXPECT_EQ(outbox.count()->dead, 0u);
  EXPECT_EQ(outbox.row(1).attempts, 0u);
  EXPECT_FALSE(loop.stats().ready.load());
  {
    const std::lock_guard lock(sink.mutex);
    sink.away = false;
  }
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (outbox.count()->pending > 0 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  loop.stop();
  t.join();
  EXPECT_EQ(outbox.count()->pending, 0u);
  EXPECT_EQ(sink.got().size(), 20u);
}

TEST(RelayLoop, AnOutboxThatCannotBeReadIsWaitedFor) {
  FakeOutbox outbox;
  FakeSink sink;
  outbox.add("m-1");
  outbox.down = true;
  RelayLoop loop(outbox, sink, fast());
  std::thread t([&] { loop.run(); });
  std::this_thread::sleep_for(50ms);
  EXPECT_GT(loop.stats().outbox_errors.load(), 0u);
  {
    const std::lock_guard lock(outbox.mutex);
    outbox.down = false;
  }
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (sink.got().empty() && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(5ms);
  loop.stop();
  t.join();
  EXPECT_EQ(sink.got(), std::vector<std::string>{"m-1"});
}

}  // namespace
}  // namespace idem::relay
