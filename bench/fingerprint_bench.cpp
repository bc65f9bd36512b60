// Request fingerprint throughput against its floor: plain SHA-256 of the same body, measured in
// the same run. The summary prints fingerprint / sha256 throughput; the goal is >= 0.5, i.e.
// canonicalising a JSON body costs no more than hashing it.

#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "idem/fingerprint.hpp"
#include "idem/jcs.hpp"

namespace {

// A payment-API style request body of exactly `size` bytes: compact JSON, members not sorted,
// a mix of ids, amounts, free text (some non-ASCII and escapes), flags and nested line items.
std::string realistic_body(std::size_t size) {
  std::mt19937_64 rng(42);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<std::uint64_t>(n)); };
  static const char* const words[] = {"premium", "widget", "blue", "Größe", "L", "organic", "café",
                                      "set of 3", "refill", "\\\"deluxe\\\"", "gift", "€ pack"};
  auto phrase = [&](int n) {
    std::string s;
    for (int i = 0; i < n; ++i) s += std::string(i ? " " : "") + words[pick(12)];
    return s;
  };
  std::string head =
      R"({"amount":)" + std::to_string(1000 + pick(90000)) + "." + std::to_string(10 + pick(89)) +
      R"(,"currency":"EUR","customer":{"id":"cus_9s6XKzkNRiz8i3","email":"jane.doe@example.com",)"
      R"("name":"Jane Doe","address":{"line1":"Musterstraße 12","city":"Berlin","postal_code":"10115",)"
      R"("country":"DE"}},"description":"Order #)" + std::to_string(100000 + pick(900000)) +
      R"( for \"Jane\"","capture":true,"statement_descriptor":null,)"
      R"("metadata":{"order_id":"ord_1","channel":"web","campaign":"spring-sale"},"items":[)";
  std::string items;
  std::string last_item;
  for (int i = 0;; ++i) {
    std::string item = std::string(i ? "," : "") + R"({"sku":"SKU-)" +
                       std::to_string(100000 + pick(900000)) + R"(","name":")" + phrase(3) +
                       R"(","quantity":)" + std::to_string(1 + pick(9)) + R"(,"unit_price":)" +
                       std::to_string(pick(500)) + "." + std::to_string(10 + pick(89)) +
                       R"(,"tax_rate":0.19,"discount":)" + (pick(3) ? "0" : "1.5") +
                       R"(,"gift":)" + (pick(2) ? "true" : "false") + R"(,"tags":[")" + words[pick(12)] +
                       R"(",")" + words[pick(12)] + R"("]})";
    if (head.size() + items.size() + item.size() + 32 > size) break;
    items += item;
  }
  std::string body = head + items + R"(],"note":")";
  const std::string tail = R"("})";
  while (body.size() + tail.size() < size) body += static_cast<char>('a' + pick(26));
  body += tail;
  return body;
}

idem::HeaderView kHeaders[] = {{"Content-Type", "application/json; charset=utf-8"},
                               {"Accept", "application/json"},
                               {"X-Request-Id", "3f2a1c9e-5b7d-4e1f-9a0c-2d8b6e4f1a3c"}};

void BM_Sha256(benchmark::State& state) {
  const std::string body = realistic_body(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(idem::sha256_hex(body));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * body.size()));
}

void BM_Fingerprint(benchmark::State& state) {
  const std::string body = realistic_body(static_cast<std::size_t>(state.range(0)));
  const idem::RequestView request{"POST", "/v1/payments", "expand=customer", kHeaders, body};
  idem::FingerprintOptions options;
  options.json_ignore = {"/metadata/campaign"};
  if (!idem::canonicalize_json(body)) state.SkipWithError("benchmark body is not valid JSON");
  for (auto _ : state) benchmark::DoNotOptimize(idem::fingerprint(request, options));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * body.size()));
}

// The canonicaliser alone, to see where fingerprint time goes.
void BM_Canonicalize(benchmark::State& state) {
  const std::string body = realistic_body(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(idem::canonicalize_json(body));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * body.size()));
}

BENCHMARK(BM_Sha256)->Arg(1 << 10)->Arg(64 << 10);
BENCHMARK(BM_Fingerprint)->Arg(1 << 10)->Arg(64 << 10);
BENCHMARK(BM_Canonicalize)->Arg(1 << 10)->Arg(64 << 10);

// Console output as usual, remembering each benchmark's throughput for the summary: the best
// of its runs (with --benchmark_repetitions=N, the best of N filters out noise from other
// processes better than a mean), or the median when only aggregates are reported.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.error_occurred) continue;
      const auto it = run.counters.find("bytes_per_second");
      if (it == run.counters.end()) continue;
      // "BM_Fingerprint/1024": function "BM_Fingerprint", args "1024".
      Rate& rate = rates_[run.run_name.args][run.run_name.function_name];
      if (run.run_type == Run::RT_Iteration) {
        rate.best = std::max(rate.best, it->second.value);
      } else if (run.aggregate_name == "median") {
        rate.median = it->second.value;
      }
    }
  }

  void summary() const {
    std::printf("\nfingerprint / sha256 throughput (goal >= 0.5):\n");
    for (const auto& [args, by_name] : rates_) {
      const auto fp = by_name.find("BM_Fingerprint"), sha = by_name.find("BM_Sha256");
      if (fp == by_name.end() || sha == by_name.end()) continue;
      const bool best = fp->second.best > 0 && sha->second.best > 0;
      const double f = best ? fp->second.best : fp->second.median;
      const double h = best ? sha->second.best : sha->second.median;
      std::printf("  %6s B: fingerprint %7.1f MB/s, sha256 %7.1f MB/s, ratio %.2f (%s)\n",
                  args.c_str(), f / 1e6, h / 1e6, f / h, best ? "best run" : "median");
    }
  }

 private:
  struct Rate {
    double best = 0;
    double median = 0;
  };
  std::map<std::string, std::map<std::string, Rate>> rates_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.summary();
  benchmark::Shutdown();
  return 0;
}
