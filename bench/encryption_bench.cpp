// The CPU cost of encryption at rest per record: KeyRing::seal and ::open (AES-256-GCM, a fresh
// nonce each) for responses of 64 B, 1 KiB and 64 KiB, against copying the same response (what
// storing it costs at least) in the same run; and a claim + complete + replaying claim through
// an EncryptedStore over the memory store against the memory store alone.
#include <benchmark/benchmark.h>

#include <memory>
#include <string>

#include "idem/encrypted_store.hpp"
#include "idem/memory_store.hpp"
#include "idem/testing/test_keys.hpp"

namespace {

using namespace std::chrono_literals;

std::shared_ptr<const idem::KeyRing> keys() {
  return idem::testing::test_key_ring(idem::testing::test_key_line("bench-1", 1));
}

idem::StoredResponse response(std::size_t size) {
  return idem::StoredResponse{201, {{"Content-Type", "application/json"}, {"X-Request-Id", "req_1234567890"}},
                              std::string(size, 'x')};
}

const idem::RecordId kId{"acme", "3f2c8a1e-8b7d-4c1a-9f0e-6d5b4a3c2b1a"};

void BM_Copy(benchmark::State& state) {
  const auto r = response(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) {
    idem::StoredResponse copy = r;
    benchmark::DoNotOptimize(copy);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}

void BM_Seal(benchmark::State& state) {
  const auto ring = keys();
  const auto r = response(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) {
    auto sealed = ring->seal(kId, r);
    benchmark::DoNotOptimize(sealed);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}

void BM_Open(benchmark::State& state) {
  const auto ring = keys();
  const auto sealed = *ring->seal(kId, response(static_cast<std::size_t>(state.range(0))));
  for (auto _ : state) {
    auto opened = ring->open(kId, sealed);
    benchmark::DoNotOptimize(opened);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0));
}

// One request's store calls: claim (fresh), complete with a 1 KiB response, claim again (replay).
void lifecycle(benchmark::State& state, idem::Store& store) {
  idem::BlockingStore blocking(store);
  std::uint64_t n = 0;
  const auto r = response(1024);
  for (auto _ : state) {
    idem::ClaimRequest claim;
    claim.id = idem::RecordId{"acme", "key-" + std::to_string(n++)};
    claim.request_hash = "hash";  // not one character: GCC 12 warns on that at -O3 (bug 105329)
    claim.token = idem::new_fencing_token();
    claim.now = idem::from_epoch_ms(1'800'000'000'000);
    claim.lease_expires = claim.now + 1min;
    claim.expires = claim.now + 24h;
    const idem::Fence fence{claim.id, claim.token};
    auto again = claim;
    benchmark::DoNotOptimize(blocking.claim(std::move(claim)));
    benchmark::DoNotOptimize(blocking.complete(idem::CompleteRequest{fence, r, again.now, again.expires}));
    auto replay = blocking.claim(std::move(again));
    if (!replay || replay->status != idem::ClaimStatus::completed) state.SkipWithError("no replay");
  }
}

void BM_MemoryStore(benchmark::State& state) {
  idem::MemoryStore store;
  lifecycle(state, store);
}

void BM_EncryptedMemoryStore(benchmark::State& state) {
  auto inner = std::make_unique<idem::MemoryStore>();
  idem::StoreAdmin* admin = inner.get();
  idem::EncryptedStore store(std::move(inner), admin, keys());
  lifecycle(state, store);
}

BENCHMARK(BM_Copy)->Arg(64)->Arg(1024)->Arg(64 * 1024);
BENCHMARK(BM_Seal)->Arg(64)->Arg(1024)->Arg(64 * 1024);
BENCHMARK(BM_Open)->Arg(64)->Arg(1024)->Arg(64 * 1024);
BENCHMARK(BM_MemoryStore);
BENCHMARK(BM_EncryptedMemoryStore);

}  // namespace

BENCHMARK_MAIN();
