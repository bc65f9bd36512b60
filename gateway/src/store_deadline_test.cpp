#include "store_deadline.hpp"

#include <gtest/gtest.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <atomic>
#include <chrono>
#include <functional>
#include <optional>
#include <thread>
#include <vector>

namespace idem::gateway {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// A fake store call: its callback is kept, to be answered (from any thread) when the test says.
struct HeldCallbacks {
  std::vector<std::move_only_function<void(int)>> waiting;
  auto start() {
    return [this](auto done) { waiting.emplace_back(std::move(done)); };
  }
};

// An event loop with the gateway's sweep every 5 ms, and a coroutine awaiting one store call
// that gives up after `timeout` with -1; answers arriving after that land in `late`.
class StoreDeadlineTest : public ::testing::Test {
 protected:
  void SetUp() override { sweep(); }

  void sweep() {
    sweeper.expires_after(5ms);
    sweeper.async_wait([this](const boost::system::error_code& ec) {
      if (ec) return;
      deadlines.sweep(Clock::now());
      sweep();
    });
  }

  void await_call(Clock::duration timeout) {
    asio::co_spawn(
        io,
        [this, timeout]() -> asio::awaitable<void> {
          result = co_await async_store_call<int>(
              deadlines, timeout, [] { return -1; }, [this](int v) { late.push_back(v); }, store.start(), asio::use_awaitable);
          resumed_at = Clock::now();
        },
        asio::detached);
  }

  template <class Done>
  void run_until(Done done) {
    const auto give_up = Clock::now() + 5s;
    while (!done() && Clock::now() < give_up) io.run_for(5ms);
  }

  asio::io_context io;
  std::atomic<std::uint64_t> expired{0};
  StoreDeadlines deadlines{expired};
  asio::steady_timer sweeper{io};
  HeldCallbacks store;
  std::optional<int> result;
  Clock::time_point resumed_at;
  std::vector<int> late;
};

TEST_F(StoreDeadlineTest, AnAnswerBeforeTheDeadlineCompletesTheCall) {
  await_call(10s);
  run_until([&] { return !store.waiting.empty(); });
  ASSERT_EQ(store.waiting.size(), 1u);
  EXPECT_EQ(deadlines.size(), 1u);
  std::thread([&] { store.waiting[0](42); }).join();  // a store thread answers
  run_until([&] { return result.has_value(); });
  EXPECT_EQ(result, 42);
  EXPECT_EQ(deadlines.size(), 0u);
  EXPECT_EQ(expired.load(), 0u);
  EXPECT_TRUE(late.empty());
}

TEST_F(StoreDeadlineTest, NoAnswerCompletesWithTheStandInAfterTheTimeoutAndALateAnswerGoesToOnLate) {
  const auto started = Clock::now();
  await_call(100ms);
  run_until([&] { return result.has_value(); });
  EXPECT_EQ(result, -1);
  EXPECT_GE(resumed_at - started, 100ms);  // never early
  EXPECT_LT(resumed_at - started, 2s);
  EXPECT_EQ(deadlines.size(), 0u);
  EXPECT_EQ(expired.load(), 1u);

  ASSERT_EQ(store.waiting.size(), 1u);
  std::thread([&] { store.waiting[0](7); }).join();
  run_until([&] { return !late.empty(); });
  EXPECT_EQ(late, std::vector<int>{7});
  EXPECT_EQ(result, -1);  // the request's answer stands
}

TEST_F(StoreDeadlineTest, AStoreThatDropsItsCallbackStillLetsTheCallExpire) {
  await_call(50ms);
  run_until([&] { return !store.waiting.empty(); });
  store.waiting.clear();  // the callback destroyed unanswered
  run_until([&] { return result.has_value(); });
  EXPECT_EQ(result, -1);
  EXPECT_EQ(expired.load(), 1u);
}

TEST_F(StoreDeadlineTest, ManyCallsEachEndOnceWhicheverComesFirst) {
  // Half answered in time, half after their deadline: every coroutine resumes exactly once.
  int resumed = 0, answered = 0, timed_out = 0;
  for (int i = 0; i < 20; ++i) {
    const auto timeout = i % 2 == 0 ? 10s : 30ms;
    asio::co_spawn(
        io,
        [&, timeout]() -> asio::awaitable<void> {
          const int v = co_await async_store_call<int>(
              deadlines, timeout, [] { return -1; }, [this](int x) { late.push_back(x); }, store.start(), asio::use_awaitable);
          ++resumed;
          (v == -1 ? timed_out : answered) += 1;
        },
        asio::detached);
  }
  run_until([&] { return store.waiting.size() == 20; });
  run_until([&] { return timed_out == 10; });
  std::thread([&] {
    for (std::size_t i = 0; i < store.waiting.size(); ++i) store.waiting[i](static_cast<int>(i));
  }).join();
  run_until([&] { return resumed == 20 && late.size() == 10; });
  EXPECT_EQ(resumed, 20);
  EXPECT_EQ(answered, 10);
  EXPECT_EQ(timed_out, 10);
  EXPECT_EQ(late.size(), 10u);
  for (int v : late) EXPECT_EQ(v % 2, 1);  // only the ones given up on
  EXPECT_EQ(deadlines.size(), 0u);
}

TEST_F(StoreDeadlineTest, AZeroTimeoutSetsNoDeadline) {
  await_call(Clock::duration::zero());
  run_until([&] { return !store.waiting.empty(); });
  EXPECT_EQ(deadlines.size(), 0u);  // not in the list: never swept
  const auto give_up = Clock::now() + 100ms;
  while (Clock::now() < give_up) io.run_for(5ms);
  EXPECT_FALSE(result.has_value());
  std::thread([&] { store.waiting[0](9); }).join();
  run_until([&] { return result.has_value(); });
  EXPECT_EQ(result, 9);
  EXPECT_EQ(expired.load(), 0u);
}

TEST_F(StoreDeadlineTest, AbandonDestroysAWaitingCoroutineWithoutResumingIt) {
  await_call(10s);
  run_until([&] { return !store.waiting.empty(); });
  deadlines.abandon_all();
  EXPECT_EQ(deadlines.size(), 0u);
  std::thread([&] { store.waiting[0](5); }).join();
  run_until([&] { return !late.empty(); });
  EXPECT_FALSE(result.has_value());
  EXPECT_EQ(late, std::vector<int>{5});
}

}  // namespace
}  // namespace idem::gateway
