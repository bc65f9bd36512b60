// The engine's whole cost for one idempotent request: begin (key parsing, fingerprint, claim)
// and finish (completion with a stored response), through the memory and the SQLite store
// (synchronous = FULL), from 1 and 8 threads. The baseline of the same run is the store alone
// (claim + complete with a precomputed request), so the ratio shows what the engine adds.
// Message consumers (idem::Consumer::process_once, and process_once_in_transaction on SQLite)
// are measured the same way: one message processed per iteration, against the same baseline.
//
// SQLite files go to $IDEM_BENCH_DIR, else the system temporary directory: put it on the disk
// you mean to measure.
#include <benchmark/benchmark.h>
#include <atomic>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "idem/consumer.hpp"
#include "idem/engine.hpp"
#include "idem/memory_store.hpp"
#include "idem/sqlite_consumer.hpp"
#include "idem/sqlite_store.hpp"
#include "idem/testing/bench_store.hpp"

namespace {

enum class Backend { memory, sqlite };

// One store (and its directory) per benchmark run, shared by the run's threads.
struct Run {
  explicit Run(Backend backend) {
    if (backend == Backend::memory) {
      store = std::make_unique<idem::MemoryStore>();
      return;
    }
    dir.emplace("idem-engine-bench");
    idem::SqliteOptions options;
    options.path = dir->db_path();
    auto opened = idem::SqliteStore::open(options);
    if (!opened) throw std::runtime_error(opened.error().message);
    store = std::move(*opened);
  }
  std::optional<idem::testing::BenchDir> dir;  // SQLite only; declared first: removed last
  std::unique_ptr<idem::Store> store;
  std::atomic<std::uint64_t> next_token{1};
};
// One Run per benchmark run, made before its threads start and deleted after they end.
Run* g_run = nullptr;
void start_memory(const benchmark::State&) { g_run = new Run(Backend::memory); }
void start_sqlite(const benchmark::State&) { g_run = new Run(Backend::sqlite); }
void stop(const benchmark::State&) {
  delete g_run;
  g_run = nullptr;
}

const std::string kBody = R"({"amount":100,"currency":"EUR","reference":"bench"})";
const idem::StoredResponse kResponse{201, {{"Content-Type", "application/json"}}, R"({"id":"pay_1","amount":100})"};

void engine_begin_finish(benchmark::State& state) {
  idem::Engine engine(*g_run->store);
  const idem::Policy policy;
  // Keys of at least 16 characters (the default key rules).
  const std::string prefix = "bench-engine-key-" + std::to_string(state.thread_index()) + "-";
  std::uint64_t i = 0;
  for (auto _ : state) {
    const std::string key = prefix + std::to_string(i++);
    const idem::HeaderView headers[] = {{"Content-Type", "application/json"}, {"Idempotency-Key", key}};
    const idem::RequestView request{"POST", "/v1/payments", "", headers, kBody};
    const idem::Decision d = engine.begin_and_wait(policy, request, "bench-tenant");
    if (d.verdict != idem::Verdict::execute) {
      state.SkipWithError("begin did not execute");
      break;
    }
    auto finished = engine.finish_and_wait(*d.ticket, kResponse);
    if (!finished || *finished != idem::FinishStatus::stored) {
      state.SkipWithError("finish did not store");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}

void store_claim_complete(benchmark::State& state) {
  idem::BlockingStore blocking(*g_run->store);
  const auto now = idem::SystemClock::instance().now();
  const std::string prefix = "bench-raw-" + std::to_string(state.thread_index()) + "-";
  std::uint64_t i = 0;
  for (auto _ : state) {
    const std::string_view failed = idem::testing::claim_then_complete(
        blocking, idem::RecordId{"bench-tenant", prefix + std::to_string(i++)}, g_run->next_token++, now);
    if (!failed.empty()) {
      state.SkipWithError(std::string(failed).c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}

idem::Consumer bench_consumer() {
  auto consumer = idem::Consumer::create(*g_run->store, {.name = "bench"});
  if (!consumer) throw std::runtime_error(consumer.error());
  return std::move(*consumer);
}

// One message per iteration, through process_once; the handler does nothing but return a result.
void consumer_process_once(benchmark::State& state) {
  idem::Consumer consumer = bench_consumer();
  const std::string prefix = "bench-msg-" + std::to_string(state.thread_index()) + "-";
  std::uint64_t i = 0;
  for (auto _ : state) {
    auto outcome = consumer.process_once(prefix + std::to_string(i++), kBody,
                                         []() -> std::expected<std::string, std::string> { return "done"; });
    if (!outcome || outcome->status != idem::MessageStatus::processed) {
      state.SkipWithError("a message was not processed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}

// The same through process_once_in_transaction on SQLite (the work runs no SQL of its own).
void consumer_in_transaction(benchmark::State& state) {
  idem::Consumer consumer = bench_consumer();
  auto& store = static_cast<idem::SqliteStore&>(*g_run->store);
  const std::string prefix = "bench-txmsg-" + std::to_string(state.thread_index()) + "-";
  std::uint64_t i = 0;
  for (auto _ : state) {
    auto outcome = idem::process_once_in_transaction(consumer, store, prefix + std::to_string(i++), kBody,
                                                     [](sqlite3*, std::string&) { return true; });
    if (!outcome || outcome->status != idem::MessageStatus::processed) {
      state.SkipWithError("a message was not processed");
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK(engine_begin_finish)->Name("engine_begin_finish/memory")->Setup(start_memory)->Teardown(stop)
    ->Threads(1)->Threads(8)->UseRealTime();
BENCHMARK(store_claim_complete)->Name("store_claim_complete/memory")->Setup(start_memory)->Teardown(stop)
    ->Threads(1)->Threads(8)->UseRealTime();
BENCHMARK(engine_begin_finish)->Name("engine_begin_finish/sqlite")->Setup(start_sqlite)->Teardown(stop)
    ->Threads(1)->Threads(8)->UseRealTime()->MinTime(2.0);
BENCHMARK(store_claim_complete)->Name("store_claim_complete/sqlite")->Setup(start_sqlite)->Teardown(stop)
    ->Threads(1)->Threads(8)->UseRealTime()->MinTime(2.0);
BENCHMARK(consumer_process_once)->Name("consumer_process_once/memory")->Setup(start_memory)->Teardown(stop)
    ->Threads(1)->Threads(8)->UseRealTime();
BENCHMARK(consumer_process_once)->Name("consumer_process_once/sqlite")->Setup(start_sqlite)->Teardown(stop)
    ->Threads(1)->Threads(8)->UseRealTime()->MinTime(2.0);
BENCHMARK(consumer_in_transaction)->Name("consumer_in_transaction/sqlite")->Setup(start_sqlite)->Teardown(stop)
    ->Threads(1)->Threads(8)->UseRealTime()->MinTime(2.0);

}  // namespace

BENCHMARK_MAIN();
