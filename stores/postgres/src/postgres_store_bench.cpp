// Store claim+complete ops/s on PostgreSQL with 1, 8 and 64 concurrent callers (one op = a claim
// of a fresh key, then its completion: two durable commits, as a request through the gateway
// needs). Compare with pgbench's one-by-one INSERT + UPDATE transaction on the same server:
// stores/postgres/bench/pgbench.sh runs both and prints the ratio.
//
//   IDEM_BENCH_POSTGRES_URL (or IDEM_TEST_POSTGRES_URL)=postgres://... idem_postgres_bench
//
// Arguments: pool (connections) and batch (max operations per transaction). pool:4/batch:128 is
// the default configuration (pipelined group commit); pool:16/batch:1 is the classic bounded
// pool, one transaction per operation, for the comparison that justifies the default.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>

#include "idem/postgres_store.hpp"

namespace idem {
namespace {

const char* bench_url() {
  for (const char* name : {"IDEM_BENCH_POSTGRES_URL", "IDEM_TEST_POSTGRES_URL"}) {
    const char* v = std::getenv(name);
    if (v && *v) return v;
  }
  return nullptr;
}

// One store per configuration, opened by the first thread that needs it and kept for the run.
PostgresStore* store_for(int pool, int batch, std::string& error) {
  static std::mutex mutex;
  static std::map<std::pair<int, int>, std::unique_ptr<PostgresStore>> stores;
  std::lock_guard lock(mutex);
  auto& slot = stores[{pool, batch}];
  if (slot) return slot.get();
  const char* url = bench_url();
  if (!url) {
    error = "set IDEM_BENCH_POSTGRES_URL or IDEM_TEST_POSTGRES_URL";
    return nullptr;
  }
  PostgresOptions o;
  o.conninfo = url;
  o.schema = "idem_bench";
  o.pool_size = static_cast<std::size_t>(pool);
  o.max_batch = static_cast<std::size_t>(batch);
  o.application_name = "idem-bench";
  auto opened = PostgresStore::open(std::move(o));
  if (!opened) {
    error = opened.error().message;
    return nullptr;
  }
  slot = std::move(*opened);
  return slot.get();
}

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

void BM_ClaimComplete(benchmark::State& state) {
  std::string error;
  PostgresStore* store = store_for(static_cast<int>(state.range(0)), static_cast<int>(state.range(1)), error);
  if (!store) {
    state.SkipWithError(error.c_str());
    return;
  }
  BlockingStore blocking(*store);
  std::mt19937_64 rng(std::random_device{}() ^ (static_cast<std::uint64_t>(state.thread_index()) << 32));
  const StoredResponse response{201,
                                {{"Content-Type", "application/json"}, {"Location", "/v1/payments/pay_123"}},
                                R"({"id":"pay_123","amount":1000,"currency":"eur","status":"succeeded"})"};
  const std::string hash(64, 'a');
  for (auto _ : state) {
    ClaimRequest req;
    req.id = RecordId{"bench", "bench-" + hex64(rng()) + hex64(rng())};  // a fresh key every time
    req.request_hash = hash;
    req.token = new_fencing_token();
    req.now = SystemClock::instance().now();
    req.lease_expires = req.now + std::chrono::seconds(60);
    req.expires = req.now + std::chrono::hours(24);
    auto claimed = blocking.claim(req);
    if (!claimed || claimed->status != ClaimStatus::claimed) {
      state.SkipWithError(claimed ? "claim did not win a fresh key" : claimed.error().message.c_str());
      break;
    }
    auto done = blocking.complete(CompleteRequest{Fence{req.id, req.token}, response, req.now, req.expires});
    if (!done || *done != FenceStatus::ok) {
      state.SkipWithError(done ? "completion was fenced out" : done.error().message.c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) {
    const auto s = store->stats();
    state.counters["largest_batch"] = static_cast<double>(s.largest_batch);
  }
}

BENCHMARK(BM_ClaimComplete)
    ->ArgNames({"pool", "batch"})
    ->Args({2, 128})
    ->Args({4, 128})
    ->Args({8, 128})
    ->Args({16, 1})
    ->Args({64, 1})
    ->Threads(1)
    ->Threads(8)
    ->Threads(64)
    ->UseRealTime();

}  // namespace
}  // namespace idem

BENCHMARK_MAIN();
