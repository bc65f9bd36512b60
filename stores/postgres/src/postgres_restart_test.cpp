// PostgreSQL stopped and started under load (issue 4, "Faults"): while it is down every claim
// fails fast with StoreErrc::unavailable and nothing is claimed; afterwards the store recovers by
// itself; over the whole run no key executes twice. It runs against a server of its own, so that
// stopping it does not disturb the other tests sharing IDEM_TEST_POSTGRES_URL.
#include "idem/postgres_store.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "test_support.hpp"

namespace idem {
namespace {

using namespace std::chrono_literals;
using SteadyClock = std::chrono::steady_clock;

struct Attempt {
  SteadyClock::time_point start, end;
  bool ok = false;
  ClaimStatus status = ClaimStatus::in_progress;
  StoreErrc error = StoreErrc::internal;
  bool in_doubt = false;
};

TEST(PostgresRestart, ClaimsFailFastWhileDownNothingRunsTwiceAndTheStoreRecoversByItself) {
  pgtest::PrivateServer server;
  PostgresOptions o = pgtest::options_for("idem_restart", server.url());
  o.connect_timeout = 500ms;
  o.statement_timeout = 2000ms;
  o.reconnect_backoff_max = 250ms;
  auto store = pgtest::open_store(o);

  constexpr int kThreads = 16, kKeys = 20000;
  std::vector<std::atomic<int>> executions(kKeys);
  std::atomic<bool> stop{false};
  std::mutex attempts_mutex;
  std::vector<Attempt> attempts;

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t) * 7919u + 1);
      std::uniform_int_distribution<int> pick(0, kKeys - 1);
      BlockingStore b(*store);
      std::vector<Attempt> mine;
      int k = pick(rng);
      while (!stop) {
        char key[32];
        std::snprintf(key, sizeof key, "restart-key-%06d", k);
        ClaimRequest req;
        req.id = RecordId{"t", key};
        req.request_hash = "h";
        req.token = new_fencing_token();
        req.now = SystemClock::instance().now();
        req.lease_expires = req.now + 10min;  // longer than the test: no takeover may happen
        req.expires = req.now + 1h;
        Attempt a;
        a.start = SteadyClock::now();
        auto c = b.claim(req);
        a.end = SteadyClock::now();
        a.ok = c.has_value();
        if (c) {
          a.status = c->status;
        } else {
          a.error = c.error().code;
          a.in_doubt = c.error().in_doubt;
        }
        mine.push_back(a);
        if (c && c->status == ClaimStatus::claimed) {
          executions[static_cast<std::size_t>(k)]++;  // "execute"
          std::this_thread::sleep_for(std::chrono::microseconds(rng() % 1000));
          const TimePoint now = SystemClock::instance().now();
          (void)b.complete(CompleteRequest{Fence{req.id, c->record.fencing_token}, StoredResponse{201, {}, "done"}, now,
                                           now + 1h});
        }
        if (c) {
          k = pick(rng);  // answered: on to the next operation
        } else {
          std::this_thread::sleep_for(5ms);  // a client backing off, then retrying the same key
        }
      }
      std::lock_guard lock(attempts_mutex);
      attempts.insert(attempts.end(), mine.begin(), mine.end());
    });
  }

  std::this_thread::sleep_for(1500ms);
  server.stop();
  const auto down = SteadyClock::now();  // pg_ctl has returned: the server is gone
  std::this_thread::sleep_for(2000ms);
  const auto restarting = SteadyClock::now();
  server.start();
  const auto up = SteadyClock::now();
  std::this_thread::sleep_for(2500ms);
  stop = true;
  for (auto& t : threads) t.join();

  int during_down = 0, ok_after = 0, failed_after = 0;
  SteadyClock::time_point first_success_after_up = SteadyClock::time_point::max();
  Millis slowest_down{0};
  for (const auto& a : attempts) {
    if (a.start >= down && a.end <= restarting) {
      ++during_down;
      EXPECT_FALSE(a.ok) << "a claim succeeded while the server was down";
      if (!a.ok) {
        EXPECT_EQ(a.error, StoreErrc::unavailable);
      }
      EXPECT_FALSE(a.in_doubt);  // nothing can have been sent to a server that is gone
      slowest_down = std::max(slowest_down, std::chrono::duration_cast<Millis>(a.end - a.start));
    }
    if (a.start >= up) {
      if (a.ok) {
        ++ok_after;
        first_success_after_up = std::min(first_success_after_up, a.end);
      } else {
        ++failed_after;
      }
    }
  }
  EXPECT_GT(during_down, 50);
  // Bounded: a refused connection fails at once; at worst one connect attempt (connect_timeout).
  EXPECT_LT(slowest_down, 1500ms);
  EXPECT_GT(ok_after, 100);
  ASSERT_NE(first_success_after_up, SteadyClock::time_point::max());
  EXPECT_LT(first_success_after_up - up, 2s) << "the store did not recover by itself";

  int executed = 0;
  for (int k = 0; k < kKeys; ++k) {
    EXPECT_LE(executions[static_cast<std::size_t>(k)].load(), 1) << "key " << k << " executed twice";
    executed += executions[static_cast<std::size_t>(k)].load();
  }
  EXPECT_GT(executed, 50);
  const auto stats = store->stats();
  EXPECT_GT(stats.connect_failures, 0u);
  EXPECT_GT(stats.connects, o.pool_size);
  std::printf("restart: %zu claims, %d while down (slowest %lld ms), %d ok / %d failed after restart, "
              "%d executions, %llu in doubt, %llu reconnects\n",
              attempts.size(), during_down, static_cast<long long>(slowest_down.count()), ok_after, failed_after,
              executed, static_cast<unsigned long long>(stats.in_doubt),
              static_cast<unsigned long long>(stats.connects - o.pool_size));
}

}  // namespace
}  // namespace idem
