#include "idem/store.hpp"

#include <openssl/rand.h>

#include <pthread.h>

#include <array>
#include <cstdint>
#include <atomic>
#include <future>
#include <mutex>
#include <stdexcept>
#include <utility>

#include "idem/store_batch.hpp"

namespace idem {

// ---- batch calls: the single calls one after the other, for stores that have nothing better ----

void Store::claim_many(std::vector<ClaimRequest> requests, BatchCallback<ClaimResult> done) {
  one_by_one<ClaimRequest, ClaimResult>(std::move(requests), std::move(done),
                                        [this](ClaimRequest r, Callback<ClaimResult> cb) { claim(std::move(r), std::move(cb)); });
}

void Store::complete_many(std::vector<CompleteRequest> requests, BatchCallback<FenceStatus> done) {
  one_by_one<CompleteRequest, FenceStatus>(
      std::move(requests), std::move(done),
      [this](CompleteRequest r, Callback<FenceStatus> cb) { complete(std::move(r), std::move(cb)); });
}

void Store::fail_many(std::vector<FailRequest> requests, BatchCallback<FenceStatus> done) {
  one_by_one<FailRequest, FenceStatus>(std::move(requests), std::move(done),
                                       [this](FailRequest r, Callback<FenceStatus> cb) { fail(std::move(r), std::move(cb)); });
}

void Store::release_many(std::vector<Fence> fences, BatchCallback<FenceStatus> done) {
  one_by_one<Fence, FenceStatus>(std::move(fences), std::move(done),
                                 [this](Fence f, Callback<FenceStatus> cb) { release(std::move(f), std::move(cb)); });
}

namespace {

// Waits for a batch call, whose callback takes the results without a StoreResult around them.
template <class T, class Start>
BatchResults<T> wait_for_batch(Start&& start) {
  auto results = wait_for<BatchResults<T>>([&](Callback<BatchResults<T>> cb) {
    start([cb = std::move(cb)](BatchResults<T> r) mutable { cb(std::move(r)); });
  });
  return std::move(*results);  // never an error: a batch reports per item
}

}  // namespace

BatchResults<ClaimResult> BlockingStore::claim_many(std::vector<ClaimRequest> requests) {
  return wait_for_batch<ClaimResult>([&](auto cb) { store_.claim_many(std::move(requests), std::move(cb)); });
}
BatchResults<FenceStatus> BlockingStore::complete_many(std::vector<CompleteRequest> requests) {
  return wait_for_batch<FenceStatus>([&](auto cb) { store_.complete_many(std::move(requests), std::move(cb)); });
}
BatchResults<FenceStatus> BlockingStore::fail_many(std::vector<FailRequest> requests) {
  return wait_for_batch<FenceStatus>([&](auto cb) { store_.fail_many(std::move(requests), std::move(cb)); });
}
BatchResults<FenceStatus> BlockingStore::release_many(std::vector<Fence> fences) {
  return wait_for_batch<FenceStatus>([&](auto cb) { store_.release_many(std::move(fences), std::move(cb)); });
}

StoreResult<ClaimResult> BlockingStore::claim(ClaimRequest request) {
  return wait_for<ClaimResult>([&](auto cb) { store_.claim(std::move(request), std::move(cb)); });
}
StoreResult<FenceStatus> BlockingStore::complete(CompleteRequest request) {
  return wait_for<FenceStatus>([&](auto cb) { store_.complete(std::move(request), std::move(cb)); });
}
StoreResult<FenceStatus> BlockingStore::fail(FailRequest request) {
  return wait_for<FenceStatus>([&](auto cb) { store_.fail(std::move(request), std::move(cb)); });
}
StoreResult<FenceStatus> BlockingStore::release(Fence fence) {
  return wait_for<FenceStatus>([&](auto cb) { store_.release(std::move(fence), std::move(cb)); });
}
StoreResult<FenceStatus> BlockingStore::abandon(AbandonRequest request) {
  return wait_for<FenceStatus>([&](auto cb) { store_.abandon(std::move(request), std::move(cb)); });
}
StoreResult<std::optional<Record>> BlockingStore::get(RecordId id) {
  return wait_for<std::optional<Record>>([&](auto cb) { store_.get(std::move(id), std::move(cb)); });
}
StoreResult<std::size_t> BlockingStore::purge_expired(TimePoint now, std::size_t limit) {
  return wait_for<std::size_t>([&](auto cb) { store_.purge_expired(now, limit, std::move(cb)); });
}
StoreResult<Done> BlockingStore::ping() {
  return wait_for<Done>([&](auto cb) { store_.ping(std::move(cb)); });
}

ClaimDecision decide_claim(const std::optional<Record>& current, const ClaimRequest& request) {
  if (!current || current->expires <= request.now) return {ClaimStatus::claimed, ClaimKind::fresh};
  // A different request under the same key is refused whatever the record's state, and the
  // record is left as it is: a mismatch never poisons the key.
  if (current->request_hash != request.request_hash) return {ClaimStatus::mismatch};
  switch (current->state) {
    case RecordState::completed:
      return {ClaimStatus::completed};
    case RecordState::failed_retryable:
      return {ClaimStatus::claimed, ClaimKind::after_failure};
    case RecordState::in_progress:
      if (current->lease_expires > request.now) return {ClaimStatus::in_progress};
      if (!request.take_over_expired_lease) return {ClaimStatus::outcome_unknown};
      return {ClaimStatus::claimed, ClaimKind::after_lease_expiry};
  }
  return {ClaimStatus::in_progress};  // unreachable: every state is handled above
}

namespace {

// Tokens are drawn from OpenSSL in blocks: RAND_bytes costs a getpid() system call per call (its
// fork check), which at one call per request was a tenth of the gateway's per-request CPU.
// A forked child must never reuse its parent's buffered tokens, so fork bumps a generation that
// invalidates every thread's block.
std::atomic<std::uint64_t> fork_generation{0};
std::once_flag fork_handler_installed;

struct TokenBlock {
  std::array<std::uint64_t, 64> tokens{};
  std::size_t next = 64;
  std::uint64_t generation = 0;
};

}  // namespace

std::uint64_t new_fencing_token() {
  std::call_once(fork_handler_installed, [] {
    pthread_atfork(nullptr, nullptr, [] { fork_generation.fetch_add(1, std::memory_order_relaxed); });
  });
  thread_local TokenBlock block;
  const std::uint64_t generation = fork_generation.load(std::memory_order_relaxed);
  for (;;) {
    if (block.next == block.tokens.size() || block.generation != generation) {
      if (RAND_bytes(reinterpret_cast<unsigned char*>(block.tokens.data()),
                     static_cast<int>(sizeof block.tokens)) != 1) {
        // Without a CSPRNG fencing is unsafe; this only happens on a broken system.
        throw std::runtime_error("OpenSSL RAND_bytes failed: no entropy for fencing tokens");
      }
      block.next = 0;
      block.generation = generation;
    }
    const std::uint64_t token = block.tokens[block.next++];
    if (token != 0) return token;
  }
}

namespace {

// Copies or moves (when `request` is an rvalue) the request's strings into the record.
template <class Request>
Record make_claimed_record(Request&& request, const std::optional<Record>& previous) {
  Record r;
  r.state = RecordState::in_progress;
  r.fencing_token = request.token;
  r.lease_expires = request.lease_expires;
  // A takeover continues the same operation, so it keeps the first attempt's creation time and
  // counts on from its attempt number (saturating: a key is never taken over 4 billion times).
  const bool takeover = previous && previous->expires > request.now;
  r.created = takeover ? previous->created : request.now;
  r.attempt = takeover ? previous->attempt + (previous->attempt < UINT32_MAX ? 1 : 0) : 1;
  r.expires = request.expires;
  r.tenant = std::forward<Request>(request).id.tenant;
  r.key = std::forward<Request>(request).id.key;
  r.request_hash = std::forward<Request>(request).request_hash;
  r.lookup = std::forward<Request>(request).lookup;
  return r;
}

}  // namespace

Record claimed_record(const ClaimRequest& request, const std::optional<Record>& previous) {
  return make_claimed_record(request, previous);
}

Record claimed_record(ClaimRequest&& request, const std::optional<Record>& previous) {
  return make_claimed_record(std::move(request), previous);
}

}  // namespace idem
