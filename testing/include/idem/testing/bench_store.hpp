#pragma once

// What the store benchmarks share (bench/engine_bench.cpp, stores/sqlite/src/sqlite_store_bench.cpp):
// a database file on the disk being measured, and one operation's store work.

#include <stdlib.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>

#include "idem/store.hpp"

namespace idem::testing {

/// A fresh directory for one benchmark run's database, removed with everything in it at the end.
/// Under $IDEM_BENCH_DIR, else the system temporary directory: put it on the disk you mean to
/// measure (tmpfs has no fsync cost and measures only the CPU).
class BenchDir {
 public:
  explicit BenchDir(std::string_view name) {
    const char* base = std::getenv("IDEM_BENCH_DIR");
    const std::filesystem::path parent = base ? std::filesystem::path(base) : std::filesystem::temp_directory_path();
    std::string pattern = (parent / (std::string(name) + "-XXXXXX")).string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp in " + parent.string());
    dir_ = pattern;
  }
  ~BenchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
  BenchDir(const BenchDir&) = delete;
  BenchDir& operator=(const BenchDir&) = delete;

  /// The database file's path (with its -wal and -shm beside it).
  std::string db_path() const { return (dir_ / "bench.db").string(); }

 private:
  std::filesystem::path dir_;
};

/// One fresh operation's store work with a precomputed request: the claim of (tenant, key) with
/// `token` at `now`, then its completion with a small stored 201. Returns what failed, or empty.
inline std::string_view claim_then_complete(BlockingStore& store, RecordId id, std::uint64_t token, TimePoint now) {
  using namespace std::chrono_literals;
  ClaimRequest claim;
  claim.id = std::move(id);
  claim.request_hash = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
  claim.token = token;
  claim.now = now;
  claim.lease_expires = now + 60s;
  claim.expires = now + 24h;
  const Fence fence{claim.id, claim.token};
  auto claimed = store.claim(std::move(claim));
  if (!claimed || claimed->status != ClaimStatus::claimed) return "claim failed";
  const StoredResponse response{201, {{"Content-Type", "application/json"}}, R"({"id":"pay_1","amount":100})"};
  auto done = store.complete(CompleteRequest{fence, response, now, now + 24h});
  if (!done || *done != FenceStatus::ok) return "complete failed";
  return {};
}

}  // namespace idem::testing
