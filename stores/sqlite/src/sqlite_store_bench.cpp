// How close the store comes to what the disk allows (synchronous = FULL, one fsync per commit).
//
//   store_claim_complete/threads:N     claim + complete through SqliteStore from N threads
//   raw_batched_loop/ops_per_commit:B  one thread, no store: INSERT + UPDATE per operation on the
//                                      same schema, pragmas and keys, B operations per
//                                      transaction, where B is what the writer achieved with 8
//                                      threads (a store operation is a claim or a complete, a
//                                      raw operation is both: B = store ops per commit / 2)
//
// Then it runs the 8-thread store and the raw loop alternately, `kRounds` times, and prints the
// median of the per-round ratios store / raw (the issue's goal: at least 0.8). Alternating
// keeps a noisy disk (shared VMs) from favouring whichever ran during a quiet moment.
// The files go to $IDEM_BENCH_DIR, else the system temporary directory: put it on the disk you
// mean to measure (tmpfs has no fsync cost and measures only the CPU).
#include <benchmark/benchmark.h>
#include <sqlite3.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "idem/sqlite_store.hpp"
#include "idem/testing/bench_store.hpp"

namespace {

const idem::TimePoint kNow = idem::from_epoch_ms(1'767'225'600'000);

// Store operations per write transaction the 8-thread run achieved; sizes the raw loop.
std::atomic<double> g_store_ops_per_commit_8{0};

struct StoreRun {
  idem::testing::BenchDir file{"idem-sqlite-bench"};
  std::unique_ptr<idem::SqliteStore> store;
  std::atomic<std::uint64_t> next_token{1};
};
StoreRun* g_run = nullptr;  // set by thread 0 before the timed loop (the loop starts after a barrier)

void store_claim_complete(benchmark::State& state) {
  if (state.thread_index() == 0) {
    g_run = new StoreRun;
    idem::SqliteOptions options;
    options.path = g_run->file.db_path();
    auto opened = idem::SqliteStore::open(options);
    if (!opened) {
      state.SkipWithError(opened.error().message.c_str());
      return;
    }
    g_run->store = std::move(*opened);
  }
  std::uint64_t i = 0;
  const std::string prefix = "bench-" + std::to_string(state.thread_index()) + "-";
  for (auto _ : state) {
    idem::BlockingStore blocking(*g_run->store);
    const std::string_view failed = idem::testing::claim_then_complete(
        blocking, idem::RecordId{"bench-tenant", prefix + std::to_string(i++)}, g_run->next_token++, kNow);
    if (!failed.empty()) {
      state.SkipWithError(std::string(failed).c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations());
  if (state.thread_index() == 0) {
    const auto stats = g_run->store->stats();
    const double per_commit =
        stats.write_transactions ? static_cast<double>(stats.operations) / static_cast<double>(stats.write_transactions)
                                 : 0;
    state.counters["store_ops_per_commit"] = per_commit;
    if (state.threads() == 8) g_store_ops_per_commit_8 = per_commit;
    delete g_run;
    g_run = nullptr;
  }
}
BENCHMARK(store_claim_complete)->Threads(1)->Threads(8)->UseRealTime()->MinTime(3.0);

// The physical ceiling: the same two statements per operation, no queue, no threads, no
// savepoints, `ops_per_commit` operations per transaction.
void raw_batched_loop(benchmark::State& state) {
  const auto ops_per_commit = static_cast<std::uint64_t>(state.range(0));
  idem::testing::BenchDir file{"idem-sqlite-bench"};
  {
    idem::SqliteOptions options;  // the same schema and pragmas as the store
    options.path = file.db_path();
    auto opened = idem::SqliteStore::open(options);
    if (!opened) {
      state.SkipWithError(opened.error().message.c_str());
      return;
    }
  }
  sqlite3* db = nullptr;
  sqlite3_open(file.db_path().c_str(), &db);
  sqlite3_exec(db, "PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL", nullptr, nullptr, nullptr);
  sqlite3_wal_autocheckpoint(db, idem::SqliteOptions{}.wal_autocheckpoint);  // as the store checkpoints
  sqlite3_stmt *insert = nullptr, *update = nullptr, *begin = nullptr, *commit = nullptr;
  sqlite3_prepare_v2(db,
                     "INSERT INTO idempotency_keys (tenant_id, key, state, request_hash, fencing_token, "
                     "lease_expires_ms, created_ms, expires_ms) VALUES (?1, ?2, 'in_progress', ?3, ?4, ?5, ?6, ?7) "
                     "ON CONFLICT (tenant_id, key) DO NOTHING",
                     -1, &insert, nullptr);
  sqlite3_prepare_v2(db,
                     "UPDATE idempotency_keys SET state = 'completed', response_status = ?4, response_headers = ?5, "
                     "response_body = ?6, completed_ms = ?7, expires_ms = ?8 WHERE tenant_id = ?1 AND key = ?2 AND "
                     "fencing_token = ?3 AND state = 'in_progress'",
                     -1, &update, nullptr);
  sqlite3_prepare_v2(db, "BEGIN IMMEDIATE", -1, &begin, nullptr);
  sqlite3_prepare_v2(db, "COMMIT", -1, &commit, nullptr);
  const std::string hash = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
  const std::string headers =
      "\x01\x01\x0c"
      "Content-Type"
      "\x10"
      "application/json";
  const std::string body = R"({"id":"pay_1","amount":100})";
  const std::int64_t now = idem::to_epoch_ms(kNow);
  std::uint64_t i = 0;
  bool open_transaction = false;
  for (auto _ : state) {
    if (!open_transaction) {
      sqlite3_step(begin);
      sqlite3_reset(begin);
      open_transaction = true;
    }
    // The keys the 8-thread store run writes: eight interleaved sequences.
    const std::string key = "bench-" + std::to_string(i % 8) + "-" + std::to_string(i / 8);
    const auto token = static_cast<sqlite3_int64>(i + 1);
    sqlite3_bind_text(insert, 1, "bench-tenant", -1, SQLITE_STATIC);
    sqlite3_bind_text(insert, 2, key.c_str(), static_cast<int>(key.size()), SQLITE_STATIC);
    sqlite3_bind_text(insert, 3, hash.c_str(), static_cast<int>(hash.size()), SQLITE_STATIC);
    sqlite3_bind_int64(insert, 4, token);
    sqlite3_bind_int64(insert, 5, now + 60'000);
    sqlite3_bind_int64(insert, 6, now);
    sqlite3_bind_int64(insert, 7, now + 86'400'000);
    if (sqlite3_step(insert) != SQLITE_DONE) state.SkipWithError(sqlite3_errmsg(db));
    sqlite3_reset(insert);
    sqlite3_bind_text(update, 1, "bench-tenant", -1, SQLITE_STATIC);
    sqlite3_bind_text(update, 2, key.c_str(), static_cast<int>(key.size()), SQLITE_STATIC);
    sqlite3_bind_int64(update, 3, token);
    sqlite3_bind_int64(update, 4, 201);
    sqlite3_bind_blob(update, 5, headers.data(), static_cast<int>(headers.size()), SQLITE_STATIC);
    sqlite3_bind_blob(update, 6, body.data(), static_cast<int>(body.size()), SQLITE_STATIC);
    sqlite3_bind_int64(update, 7, now);
    sqlite3_bind_int64(update, 8, now + 86'400'000);
    if (sqlite3_step(update) != SQLITE_DONE) state.SkipWithError(sqlite3_errmsg(db));
    sqlite3_reset(update);
    if (++i % ops_per_commit == 0) {
      sqlite3_step(commit);
      sqlite3_reset(commit);
      open_transaction = false;
    }
  }
  if (open_transaction) {
    sqlite3_step(commit);
    sqlite3_reset(commit);
  }
  state.SetItemsProcessed(state.iterations());
  state.counters["ops_per_commit"] = static_cast<double>(ops_per_commit);
  for (auto* stmt : {insert, update, begin, commit}) sqlite3_finalize(stmt);
  sqlite3_close_v2(db);
}

constexpr int kRounds = 7;

// Remembers each benchmark's rates, to print the ratio at the end.
class RateReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const auto& run : runs) {
      if (run.run_type != Run::RT_Iteration || run.error_occurred) continue;
      if (auto it = run.counters.find("items_per_second"); it != run.counters.end()) {
        rates[run.benchmark_name()].push_back(it->second.value);
      }
    }
    ConsoleReporter::ReportRuns(runs);
  }
  // The rates of the one benchmark whose name starts with `prefix`.
  const std::vector<double>& of(std::string_view prefix) const {
    static const std::vector<double> none;
    for (const auto& [name, values] : rates) {
      if (name.starts_with(prefix)) return values;
    }
    return none;
  }
  std::map<std::string, std::vector<double>> rates;
};

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RateReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);  // the store, first: it measures the batch size

  const double store_ops = g_store_ops_per_commit_8.load();
  const long batch = std::max(1L, std::lround(store_ops / 2));
  benchmark::RegisterBenchmark("raw_batched_loop", raw_batched_loop)
      ->ArgName("ops_per_commit")
      ->Arg(batch)
      ->MinTime(3.0)
      ->UseRealTime();
  benchmark::RunSpecifiedBenchmarks(&reporter, "^raw_batched_loop");

  // Each round sizes its raw loop by the batches its own store run achieved: how full the
  // writer's batches get depends on how fast the disk is at that moment.
  benchmark::RegisterBenchmark("paired_store", store_claim_complete)->Threads(8)->MinTime(1.0)->UseRealTime();
  std::vector<double> ratios;
  std::string batches;
  for (int round = 0; round < kRounds; ++round) {
    benchmark::RunSpecifiedBenchmarks(&reporter, "^paired_store");
    const long round_batch = std::max(1L, std::lround(g_store_ops_per_commit_8.load() / 2));
    const std::string raw_name = "paired_raw_round" + std::to_string(round);
    benchmark::RegisterBenchmark(raw_name.c_str(), raw_batched_loop)->Arg(round_batch)->MinTime(1.0)->UseRealTime();
    benchmark::RunSpecifiedBenchmarks(&reporter, "^" + raw_name + "/");
    const auto& store = reporter.of("paired_store");
    const auto& raw = reporter.of(raw_name + "/");
    if (store.size() == static_cast<std::size_t>(round) + 1 && raw.size() == 1 && raw.back() > 0) {
      ratios.push_back(store.back() / raw.back());
      batches += " " + std::to_string(round_batch);
    }
  }
  std::printf(
      "\nfirst runs: store (1 thread) %.0f ops/s, store (8 threads) %.0f ops/s at %.2f store ops per commit, "
      "raw batched loop (%ld ops per commit) %.0f ops/s\n",
      median(reporter.of("store_claim_complete/min_time:3.000/real_time/threads:1")),
      median(reporter.of("store_claim_complete/min_time:3.000/real_time/threads:8")), store_ops, batch,
      median(reporter.of("raw_batched_loop/")));
  std::printf("alternating rounds, store (8 threads) / raw (ops per commit:%s):", batches.c_str());
  for (double r : ratios) std::printf(" %.2f", r);
  std::printf("; median %.2f (goal >= 0.80)\n", median(ratios));
  benchmark::Shutdown();
  return 0;
}
