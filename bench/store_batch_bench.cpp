// Batch calls against single calls, on every store, from one caller (as a consumer handed 64
// messages at once by its broker):
//
//   single/STORE   claim + complete of one fresh key, one call each, waiting for each answer
//   batch/STORE    claim_many + complete_many of 64 fresh keys, waiting for each batch
//
// Items per second: claim+complete pairs. The ratio batch / single of one store is the figure to
// read (docs/benchmarks.md, "Batch calls").
//
// STORE is memory, sqlite (a file under $IDEM_BENCH_DIR or the temporary directory), postgres,
// redis and redis_cluster (from IDEM_TEST_POSTGRES_URL, IDEM_TEST_REDIS_URL and
// IDEM_TEST_REDIS_CLUSTER_URL, written by scripts/lib/servers.sh; skipped when unset).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "idem/open_store.hpp"
#include "idem/store.hpp"
#include "idem/testing/bench_store.hpp"

namespace {

using namespace std::chrono_literals;

constexpr std::size_t kBatch = 64;

// A store of the kind named, or the reason it cannot be opened.
struct Opened {
  std::unique_ptr<idem::testing::BenchDir> dir;
  std::unique_ptr<idem::Store> store;
  std::string error;
};

Opened open(const std::string& kind) {
  Opened o;
  std::string url;
  if (kind == "memory") {
    url = "memory:";
  } else if (kind == "sqlite") {
    o.dir = std::make_unique<idem::testing::BenchDir>("idem-batch-bench");
    url = "sqlite:" + o.dir->db_path();
  } else {
    const char* variable = kind == "postgres" ? "IDEM_TEST_POSTGRES_URL"
                           : kind == "redis"  ? "IDEM_TEST_REDIS_URL"
                                              : "IDEM_TEST_REDIS_CLUSTER_URL";
    const char* value = std::getenv(variable);
    if (!value) {
      o.error = std::string(variable) + " is not set (scripts/lib/servers.sh)";
      return o;
    }
    url = value;
  }
  auto opened = idem::open_store(url);
  if (!opened) {
    o.error = opened.error().message;
    return o;
  }
  o.store = std::move(opened->store);
  return o;
}

// Fresh keys per run: the servers keep what earlier runs wrote.
std::string run_prefix() {
  static std::atomic<int> runs{0};
  return "bench-" + std::to_string(::getpid()) + "-" + std::to_string(runs++) + "-";
}

idem::ClaimRequest claim_of(const std::string& key, std::uint64_t token) {
  idem::ClaimRequest r;
  r.id = idem::RecordId{"bench-tenant", key};
  r.request_hash = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
  r.token = token;
  r.now = idem::SystemClock::instance().now();
  r.lease_expires = r.now + 60s;
  r.expires = r.now + 10min;
  return r;
}

idem::CompleteRequest completion_of(const idem::ClaimRequest& claim) {
  return idem::CompleteRequest{
      idem::Fence{claim.id, claim.token},
      idem::StoredResponse{201, {{"Content-Type", "application/json"}}, R"({"id":"pay_1","amount":100})"}, claim.now,
      claim.expires};
}

void single(benchmark::State& state, const std::string& kind) {
  Opened o = open(kind);
  if (!o.store) return state.SkipWithError(o.error.c_str());
  idem::BlockingStore store(*o.store);
  const std::string prefix = run_prefix();
  std::uint64_t i = 0;
  for (auto _ : state) {
    ++i;
    const auto claim = claim_of(prefix + std::to_string(i), i);
    auto claimed = store.claim(claim);
    auto completed = store.complete(completion_of(claim));
    if (!claimed || claimed->status != idem::ClaimStatus::claimed || !completed || *completed != idem::FenceStatus::ok) {
      return state.SkipWithError("a claim or completion failed");
    }
  }
  state.SetItemsProcessed(state.iterations());
}

void batch(benchmark::State& state, const std::string& kind) {
  Opened o = open(kind);
  if (!o.store) return state.SkipWithError(o.error.c_str());
  idem::BlockingStore store(*o.store);
  const std::string prefix = run_prefix();
  std::uint64_t i = 0;
  for (auto _ : state) {
    std::vector<idem::ClaimRequest> claims;
    std::vector<idem::CompleteRequest> completions;
    claims.reserve(kBatch);
    completions.reserve(kBatch);
    for (std::size_t n = 0; n < kBatch; ++n) {
      ++i;
      claims.push_back(claim_of(prefix + std::to_string(i), i));
      completions.push_back(completion_of(claims.back()));
    }
    for (const auto& c : store.claim_many(std::move(claims))) {
      if (!c || c->status != idem::ClaimStatus::claimed) return state.SkipWithError("a claim failed");
    }
    for (const auto& c : store.complete_many(std::move(completions))) {
      if (!c || *c != idem::FenceStatus::ok) return state.SkipWithError("a completion failed");
    }
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(kBatch));
}

const bool registered = [] {
  for (const char* kind : {"memory", "sqlite", "postgres", "redis", "redis_cluster"}) {
    benchmark::RegisterBenchmark((std::string("single/") + kind).c_str(), single, std::string(kind))
        ->UseRealTime()
        ->MinTime(2.0);
    benchmark::RegisterBenchmark((std::string("batch/") + kind).c_str(), batch, std::string(kind))
        ->UseRealTime()
        ->MinTime(2.0);
  }
  return true;
}();

}  // namespace

int main(int argc, char** argv) {
  idem::configure_process_for_stores();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
