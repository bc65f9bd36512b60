#include "idem/key_holds.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

#include "idem/fingerprint.hpp"

namespace idem {
namespace {

// A hold outlives any operator's absence; it ends when its parked messages have run again or
// were dropped, never by itself.
constexpr auto kHoldLifetime = std::chrono::hours(24 * 365 * 10);
// Read-modify-write rounds before giving up: each lost round means someone else changed the
// hold in between, which with one delivery of a key at a time happens only in a hand-over.
constexpr int kUpdateRounds = 16;

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
    : store_(store), tenant_(tenant_of(consumer_name)), clock_(clock) {}

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
  if ((*got)->request_hash != hold_hash()) return std::unexpected(not_a_hold(id));
  return parked_ids(**got);
}

template <class Change>
StoreResult<Done> StoreKeyHolds::update(std::string_view key, Change change) {
  BlockingStore store(store_);
  const RecordId id{tenant_, std::string(key)};
  for (int round = 0; round < kUpdateRounds; ++round) {
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
    if (ids.empty()) {
      if (!current) return Done{};
      auto released = store.release(fence);
      if (!released) return std::unexpected(released.error());
      if (*released == FenceStatus::ok) return Done{};
      continue;  // changed meanwhile: read again
    }
    if (current) {
      // Ends the lease only if nobody changed the hold since it was read, so that the claim
      // below may take it over.
      auto ended = store.abandon(AbandonRequest{fence, t});
      if (!ended) return std::unexpected(ended.error());
      if (*ended == FenceStatus::lost) continue;
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
    if (claimed->status == ClaimStatus::claimed) return Done{};
    if (claimed->status == ClaimStatus::mismatch) return std::unexpected(not_a_hold(id));
    // in_progress: someone else wrote the hold between our read and our claim; read again.
  }
  return std::unexpected(StoreError{StoreErrc::unavailable,
                                    "the hold of ordering key \"" + std::string(key) + "\" kept changing under " +
                                        std::to_string(kUpdateRounds) + " tries in a row",
                                    false});
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
