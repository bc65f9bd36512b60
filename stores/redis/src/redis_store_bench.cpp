// Store claim+complete throughput on Redis, standalone and cluster, with 1, 8 and 64 callers.
//
//   claim_complete/standalone/threads:N   claim + complete of a fresh key through RedisStore from
//   claim_complete/cluster/threads:N      N threads (each waits for its answers: N in flight)
//
// Servers from IDEM_TEST_REDIS_URL / IDEM_TEST_REDIS_CLUSTER_URL (scripts/lib/servers.sh: AOF
// everysec). The raw ceiling, redis-benchmark running the same Lua scripts by EVALSHA with the
// same concurrency, is stores/redis/bench/redis_benchmark.sh.
//
// Counters: pipeline = commands per socket write (how much pipelining the callers' concurrency
// produced).
#include "idem/redis_store.hpp"

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <string>

namespace {

using namespace std::chrono_literals;

struct Run {
  std::unique_ptr<idem::RedisStore> store;
  std::string prefix;
  std::atomic<std::uint64_t> next_token{1};
};
Run* g_run = nullptr;  // set by thread 0 before the timed loop (the loop starts after a barrier)

void claim_complete(benchmark::State& state, const char* url_variable) {
  if (state.thread_index() == 0) {
    static std::atomic<int> runs{0};
    g_run = new Run;
    const char* url = std::getenv(url_variable);
    if (!url) {
      state.SkipWithError((std::string(url_variable) + " is not set (scripts/lib/servers.sh)").c_str());
      return;
    }
    idem::RedisOptions options;
    options.url = url;
    options.key_prefix = "idem-bench-" + std::to_string(::getpid()) + "-" + std::to_string(runs++) + ":";
    options.ttl_grace = 1min;  // the records go away soon after the run
    auto opened = idem::RedisStore::open(options);
    if (!opened) {
      state.SkipWithError(opened.error().message.c_str());
      return;
    }
    g_run->store = std::move(*opened);
  }
  const std::string prefix = "bench-" + std::to_string(state.thread_index()) + "-";
  std::uint64_t i = 0;
  for (auto _ : state) {
    idem::BlockingStore blocking(*g_run->store);  // here: g_run is set once the loop has started
    idem::ClaimRequest request;
    request.id = idem::RecordId{"bench-tenant", prefix + std::to_string(i++)};
    request.request_hash = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    request.token = g_run->next_token++;
    request.now = idem::SystemClock::instance().now();
    request.lease_expires = request.now + 60s;
    request.expires = request.now + 1min;
    auto claim = blocking.claim(request);
    if (!claim || claim->status != idem::ClaimStatus::claimed) {
      state.SkipWithError(claim ? "claim not claimed" : claim.error().message.c_str());
      break;
    }
    auto done = blocking.complete(idem::CompleteRequest{
        idem::Fence{request.id, request.token},
        idem::StoredResponse{201, {{"Content-Type", "application/json"}}, R"({"id":"pay_1","amount":100})"},
        request.now, request.expires});
    if (!done || *done != idem::FenceStatus::ok) {
      state.SkipWithError(done ? "complete fenced out" : done.error().message.c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) {
    if (g_run->store) {
      const auto stats = g_run->store->stats();
      state.counters["pipeline"] =
          stats.batches ? static_cast<double>(stats.commands) / static_cast<double>(stats.batches) : 0;
    }
    delete g_run;
    g_run = nullptr;
  }
}

void standalone(benchmark::State& state) { claim_complete(state, "IDEM_TEST_REDIS_URL"); }
void cluster(benchmark::State& state) { claim_complete(state, "IDEM_TEST_REDIS_CLUSTER_URL"); }

BENCHMARK(standalone)->Name("claim_complete/standalone")->Threads(1)->Threads(8)->Threads(64)->UseRealTime()->MinTime(3.0);
BENCHMARK(cluster)->Name("claim_complete/cluster")->Threads(1)->Threads(8)->Threads(64)->UseRealTime()->MinTime(3.0);

}  // namespace

BENCHMARK_MAIN();
