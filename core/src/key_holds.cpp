#include "idem/key_holds.hpp"

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>

#include "idem/fingerprint.hpp"

namespace idem {
namespace {

// A hold outlives any operator's absence; it ends when its parked messages have run again or
// were dropped, never by itself.
constexpr auto kHoldLifetime = std::chrono::hours(24 * 365 * 10);
// A hold's writers take turns under a lock: how long one may hold it (a writer that died holding
// it delays the next this long), and how long the next waits for it before giving up.
constexpr auto kLockLease = std::chrono::seconds(5);
constexpr auto kLockWait = std::chrono::milliseconds(10000);

const std::string& hold_hash() {
  static const std::string hash = [] {
    Sha256 sha;
    sha.update("idem key hold\n");
    return sha.hex_digest();
  }();
  return hash;
}

std::string joined(const std::vector<std::string>& ids) {
  std::string text;
  for (const std::string& id : ids) {
    if (!text.empty()) text += '\n';
    text += id;
  }
  return text;
}

StoreError not_a_hold(const RecordId& id) {
  return StoreError{StoreErrc::corrupt,
                    "the record \"" + id.key + "\" of tenant \"" + id.tenant + "\" is not a key hold", false};
}

}  // namespace

StoreKeyHolds::StoreKeyHolds(Store& store, std::string_view consumer_name, const Clock* clock)
    : store_(store), tenant_(tenant_of(consumer_name)), lock_tenant_(tenant_ + " lock"), clock_(clock) {}

std::string StoreKeyHolds::tenant_of(std::string_view consumer_name) {
  return "consumer " + std::string(consumer_name) + " held";
}

std::vector<std::string> StoreKeyHolds::parked_ids(const Record& hold) {
  std::vector<std::string> ids;
  std::string_view rest = hold.lookup;
  while (!rest.empty()) {
    const std::size_t end = std::min(rest.find('\n'), rest.size());
    if (end > 0) ids.emplace_back(rest.substr(0, end));
    rest.remove_prefix(std::min(end + 1, rest.size()));
  }
  return ids;
}

TimePoint StoreKeyHolds::now() const { return clock_ ? clock_->now() : SystemClock::instance().now(); }

StoreResult<std::vector<std::string>> StoreKeyHolds::parked(std::string_view key) {
  const RecordId id{tenant_, std::string(key)};
  auto got = BlockingStore(store_).get(id);
  if (!got) return std::unexpected(got.error());
  if (!*got || (*got)->expires <= now()) return std::vector<std::string>{};
  if ((*got)->request_hash != hold_hash() || (*got)->state != RecordState::in_progress) {
    return std::unexpected(not_a_hold(id));
  }
  return parked_ids(**got);
}

template <class Change>
StoreResult<Done> StoreKeyHolds::update(std::string_view key, Change change) {
  BlockingStore store(store_);
  // The writers of one hold take turns under a lock of their own: a claim on a second record
  // whose lease is short, so that a writer that died holding it delays the next by that much.
  ClaimRequest lock;
  lock.id = RecordId{lock_tenant_, std::string(key)};
  lock.request_hash = hold_hash();
  lock.take_over_expired_lease = true;
  const auto give_up = std::chrono::steady_clock::now() + kLockWait;
  for (;;) {
    lock.token = new_fencing_token();
    lock.now = now();
    lock.lease_expires = lock.now + kLockLease;
    lock.expires = lock.now + kLockLease;
    auto locked = store.claim(lock);
    if (!locked) return std::unexpected(locked.error());
    if (locked->status == ClaimStatus::claimed) break;
    if (locked->status == ClaimStatus::mismatch) return std::unexpected(not_a_hold(lock.id));
    if (std::chrono::steady_clock::now() >= give_up) {
      return std::unexpected(StoreError{StoreErrc::unavailable,
                                        "the hold of ordering key \"" + std::string(key) + "\" is being changed by "
                                        "another writer (it was locked for " +
                                            std::to_string(kLockWait.count()) + " ms)",
                                        false});
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  auto written = write_locked(store, key, change);
  (void)store.release(Fence{lock.id, lock.token});  // if it fails, the lock's lease runs out
  return written;
}

template <class Change>
StoreResult<Done> StoreKeyHolds::write_locked(BlockingStore& store, std::string_view key, Change& change) {
  const RecordId id{tenant_, std::string(key)};
  auto got = store.get(id);
  if (!got) return std::unexpected(got.error());
  const TimePoint t = now();
  std::optional<Record> current = std::move(*got);
  if (current && current->expires <= t) current.reset();
  if (current && (current->request_hash != hold_hash() || current->state != RecordState::in_progress)) {
    return std::unexpected(not_a_hold(id));
  }
  std::vector<std::string> ids = current ? parked_ids(*current) : std::vector<std::string>{};
  if (!change(ids)) return Done{};
  const Fence fence{id, current ? current->fencing_token : 0};
  auto lost = [&] {
    return std::unexpected(StoreError{StoreErrc::internal,
                                      "the hold of ordering key \"" + std::string(key) +
                                          "\" changed while its writer held the lock (a writer stalled longer "
                                          "than the lock's lease?)",
                                      false});
  };
  if (ids.empty()) {
    if (!current) return Done{};
    auto released = store.release(fence);
    if (!released) return std::unexpected(released.error());
    if (*released == FenceStatus::lost) return lost();
    return Done{};
  }
  if (current) {
    // Ends the lease so that the claim below may take the record over: rewritten in place, never
    // absent (a reader always sees the old list or the new one).
    auto ended = store.abandon(AbandonRequest{fence, t});
    if (!ended) return std::unexpected(ended.error());
    if (*ended == FenceStatus::lost) return lost();
  }
  ClaimRequest claim;
  claim.id = id;
  claim.request_hash = hold_hash();
  claim.token = new_fencing_token();
  claim.now = t;
  claim.lease_expires = t + kHoldLifetime;
  claim.expires = t + kHoldLifetime;
  claim.take_over_expired_lease = true;
  claim.lookup = joined(ids);
  auto claimed = store.claim(std::move(claim));
  if (!claimed) return std::unexpected(claimed.error());
  if (claimed->status != ClaimStatus::claimed) return lost();
  return Done{};
}

StoreResult<Done> StoreKeyHolds::park(std::string_view key, std::string_view message_id) {
  return update(key, [&](std::vector<std::string>& ids) {
    if (std::find(ids.begin(), ids.end(), message_id) != ids.end()) return false;
    ids.emplace_back(message_id);
    return true;
  });
}

StoreResult<Done> StoreKeyHolds::unpark_first(std::string_view key, std::string_view message_id) {
  return update(key, [&](std::vector<std::string>& ids) {
    if (ids.empty() || ids.front() != message_id) return false;
    ids.erase(ids.begin());
    return true;
  });
}

StoreResult<bool> StoreKeyHolds::forget(std::string_view key) {
  bool had = false;
  auto done = update(key, [&](std::vector<std::string>& ids) {
    had = !ids.empty();
    ids.clear();
    return had;
  });
  if (!done) return std::unexpected(done.error());
  return had;
}

}  // namespace idem
