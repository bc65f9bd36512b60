#include "idem/http/async.hpp"

#include <gtest/gtest.h>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/use_awaitable.hpp>

#include <chrono>
#include <mutex>
#include <thread>
#include <vector>

#include "idem/memory_store.hpp"

namespace idem::http {
namespace {

namespace asio = boost::asio;
using namespace std::chrono_literals;

// A store whose callbacks run on threads of its own, after the call returned (like SQLite's
// writer thread), or never (to prove a dropped continuation is only destroyed).
class ThreadedStore final : public Store {
 public:
  explicit ThreadedStore(bool drop = false) : drop_(drop) {}
  ~ThreadedStore() override {
    for (auto& t : threads_) t.join();
  }
  void claim(ClaimRequest r, Callback<ClaimResult> done) override { later(&Store::claim, std::move(r), std::move(done)); }
  void complete(CompleteRequest r, Callback<FenceStatus> done) override { later(&Store::complete, std::move(r), std::move(done)); }
  void fail(FailRequest r, Callback<FenceStatus> done) override { later(&Store::fail, std::move(r), std::move(done)); }
  void release(Fence f, Callback<FenceStatus> done) override { later(&Store::release, std::move(f), std::move(done)); }
  void abandon(AbandonRequest r, Callback<FenceStatus> done) override { later(&Store::abandon, std::move(r), std::move(done)); }
  void get(RecordId id, Callback<std::optional<Record>> done) override { later(&Store::get, std::move(id), std::move(done)); }
  void purge_expired(TimePoint now, std::size_t limit, Callback<std::size_t> done) override {
    std::lock_guard lock(mutex_);
    threads_.emplace_back([this, now, limit, done = std::move(done)]() mutable {
      std::this_thread::sleep_for(5ms);
      callback_threads_.push_back(std::this_thread::get_id());
      inner_.purge_expired(now, limit, std::move(done));
    });
  }
  void ping(Callback<Done> done) override {
    std::lock_guard lock(mutex_);
    threads_.emplace_back([this, done = std::move(done)]() mutable {
      std::this_thread::sleep_for(5ms);
      if (!drop_) done(Done{});
    });
  }
  std::vector<std::thread::id> callback_threads_;

 private:
  template <class Op, class Arg, class Cb>
  void later(Op op, Arg arg, Cb done) {
    std::lock_guard lock(mutex_);
    threads_.emplace_back([this, op, arg = std::move(arg), done = std::move(done)]() mutable {
      std::this_thread::sleep_for(5ms);  // the caller's io_context has nothing else to do meanwhile
      callback_threads_.push_back(std::this_thread::get_id());
      if (drop_) return;
      (inner_.*op)(std::move(arg), std::move(done));
    });
  }
  bool drop_;
  MemoryStore inner_;
  std::mutex mutex_;
  std::vector<std::thread> threads_;
};

Policy required_policy() {
  Policy p;
  p.key_required = true;
  return p;
}

// begin -> execute, finish -> stored, begin again -> replay; every resumption on `io`'s thread.
asio::awaitable<void> round_trip(Engine& engine, std::thread::id io_thread, std::vector<std::string>& log) {
  const Policy policy = required_policy();
  const HeaderView headers[] = {{"Idempotency-Key", "0123456789abcdef-async"}};
  const RequestView view{"POST", "/p", "", headers, "body"};

  Decision d = co_await async_begin(engine, policy, view, "t", asio::use_awaitable);
  EXPECT_EQ(std::this_thread::get_id(), io_thread);
  log.emplace_back(to_string(d.verdict));
  if (!d.ticket) co_return;

  StoredResponse response{201, {{"Content-Type", "text/plain"}}, "made"};
  auto finished = co_await async_finish(engine, *d.ticket, std::move(response), asio::use_awaitable);
  EXPECT_EQ(std::this_thread::get_id(), io_thread);
  log.emplace_back(finished ? std::string(to_string(*finished)) : "error");

  Decision again = co_await async_begin(engine, policy, view, "t", asio::use_awaitable);
  EXPECT_EQ(std::this_thread::get_id(), io_thread);
  log.emplace_back(to_string(again.verdict));
  if (again.replay) {
    EXPECT_EQ(again.replay->body, "made");
  }

  auto pong = co_await async_ping(engine.store(), asio::use_awaitable);
  EXPECT_TRUE(pong.has_value());
  auto purged = co_await async_purge_expired(engine.store(), TimePoint{}, 10, asio::use_awaitable);
  EXPECT_TRUE(purged.has_value());
  log.emplace_back("done");
}

TEST(AsyncAdapter, InlineCallbacksResumeOnTheExecutor) {
  MemoryStore store;
  Engine engine(store);
  asio::io_context io;
  std::vector<std::string> log;
  asio::co_spawn(io, round_trip(engine, std::this_thread::get_id(), log), asio::detached);
  io.run();
  EXPECT_EQ(log, (std::vector<std::string>{"execute", "stored", "replay", "done"}));
}

TEST(AsyncAdapter, ForeignThreadCallbacksResumeOnTheExecutorAndKeepItAlive) {
  // The io_context outlives the store: a store thread may still be inside post() (signalling the
  // io_context) after the handler it posted ran, until the store joins it (a data race under
  // ThreadSanitizer when the io_context was destroyed first). The gateway does the same: stores
  // are destroyed before the event loops.
  asio::io_context io;
  ThreadedStore store;
  Engine engine(store);
  std::vector<std::string> log;
  asio::co_spawn(io, round_trip(engine, std::this_thread::get_id(), log), asio::detached);
  // No work guard: run() returns early unless the adapter tracks the pending store calls.
  io.run();
  EXPECT_EQ(log, (std::vector<std::string>{"execute", "stored", "replay", "done"}));
  ASSERT_FALSE(store.callback_threads_.empty());
  for (auto id : store.callback_threads_) EXPECT_NE(id, std::this_thread::get_id());
}

TEST(AsyncAdapter, ReleaseLetsTheNextRequestExecute) {
  MemoryStore store;
  Engine engine(store);
  asio::io_context io;
  std::vector<std::string> log;
  asio::co_spawn(
      io,
      [&]() -> asio::awaitable<void> {
        const Policy policy = required_policy();
        const HeaderView headers[] = {{"Idempotency-Key", "0123456789abcdef-release"}};
        const RequestView view{"POST", "/p", "", headers, ""};
        Decision d = co_await async_begin(engine, policy, view, "", asio::use_awaitable);
        auto r = co_await async_release(engine, *d.ticket, asio::use_awaitable);
        log.emplace_back(to_string(*r));
        Decision d2 = co_await async_begin(engine, policy, view, "", asio::use_awaitable);
        log.emplace_back(to_string(d2.verdict));
      },
      asio::detached);
  io.run();
  EXPECT_EQ(log, (std::vector<std::string>{"released", "execute"}));
}

TEST(AsyncAdapter, WorksWithPlainCallbackTokens) {
  MemoryStore store;
  asio::io_context io;
  bool called = false;
  std::thread::id where;
  async_ping(store, asio::bind_executor(io, [&](StoreResult<Done> r) {
               called = r.has_value();
               where = std::this_thread::get_id();
             }));
  EXPECT_FALSE(called);  // posted, not run inline inside ping()
  io.run();
  EXPECT_TRUE(called);
  EXPECT_EQ(where, std::this_thread::get_id());
}

TEST(AsyncAdapter, ADroppedCallbackOnlyDestroysTheCoroutine) {
  bool resumed = false;
  {
    asio::io_context io;  // outlives the store's threads, as above
    ThreadedStore store(/*drop=*/true);
    asio::co_spawn(
        io,
        [&]() -> asio::awaitable<void> {
          co_await async_ping(store, asio::use_awaitable);
          resumed = true;
        },
        asio::detached);
    io.run_for(50ms);
  }
  EXPECT_FALSE(resumed);
}

}  // namespace
}  // namespace idem::http
