#include "idem/memory_store.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <string_view>
#include <tuple>

namespace idem {
namespace {

// The second an expiry falls in: the expiry index's bucket.
std::int64_t second_of(TimePoint t) {
  return std::chrono::floor<std::chrono::seconds>(t).time_since_epoch().count();
}

}  // namespace

std::size_t MemoryStore::KeyHash::operator()(const KeyView& k) const {
  const std::size_t tenant = std::hash<std::string_view>{}(k.first);
  const std::size_t key = std::hash<std::string_view>{}(k.second);
  return key ^ (tenant + 0x9e3779b97f4a7c15ULL + (key << 6) + (key >> 2));
}

MemoryStore::Shard& MemoryStore::shard_of(const RecordId& id) {
  // The top bits: the tables pick buckets by the hash modulo a prime, which the low bits drive.
  static_assert(kShards == 64);
  return shards_[KeyHash{}(KeyView(id.tenant, id.key)) >> 58];
}

// ---- one shard --------------------------------------------------------------------------------

Record* MemoryStore::Shard::find_held(const Fence& fence) {
  auto it = records.find(KeyView(fence.id.tenant, fence.id.key));
  if (it == records.end()) return nullptr;
  Record& r = it->second;
  if (r.state != RecordState::in_progress || r.fencing_token != fence.token) return nullptr;
  return &r;
}

Record* MemoryStore::Shard::find_live(const RecordId& id, TimePoint now) {
  auto it = records.find(KeyView(id.tenant, id.key));
  if (it == records.end() || it->second.expires <= now) return nullptr;
  return &it->second;
}

void MemoryStore::Shard::index_expiry(Key key, TimePoint expires) {
  expiring[second_of(expires)].push_back(std::move(key));
}

void MemoryStore::Shard::set_expiry(const RecordId& id, Record& r, TimePoint expires) {
  // Within the same second the record's existing index entry still covers it.
  if (second_of(expires) != second_of(r.expires)) index_expiry(Key{id.tenant, id.key}, expires);
  r.expires = expires;
}

std::size_t MemoryStore::Shard::purge(TimePoint now, std::size_t limit) {
  std::size_t purged = 0;
  const std::int64_t current = second_of(now);
  while (!expiring.empty() && expiring.begin()->first <= current && purged < limit) {
    const std::int64_t second = expiring.begin()->first;
    std::vector<Key>& keys = expiring.begin()->second;
    // Keeps, at the front, the entries that must stay: records of this second that have not
    // expired yet (only in the current second), and those beyond `limit`.
    std::size_t kept = 0;
    const auto keep = [&](std::size_t i) {
      if (i != kept) keys[kept] = std::move(keys[i]);  // never onto itself: that empties it
      ++kept;
    };
    for (std::size_t i = 0; i < keys.size(); ++i) {
      if (purged == limit) {
        keep(i);
        continue;
      }
      auto it = records.find(keys[i]);
      if (it == records.end() || second_of(it->second.expires) != second) continue;  // stale
      if (it->second.expires <= now) {
        records.erase(it);
        ++purged;
      } else {
        keep(i);
      }
    }
    keys.resize(kept);
    if (!keys.empty()) break;  // the current second, or the limit
    expiring.erase(expiring.begin());
  }
  return purged;
}

// ---- Store ------------------------------------------------------------------------------------

void MemoryStore::claim(ClaimRequest request, Callback<ClaimResult> done) {
  ClaimResult result;
  {
    Shard& shard = shard_of(request.id);
    std::lock_guard lock(shard.mutex);
    auto it = shard.records.find(KeyView(request.id.tenant, request.id.key));
    std::optional<Record> current;
    if (it != shard.records.end()) current = it->second;
    const ClaimDecision decision = decide_claim(current, request);
    result.status = decision.status;
    result.kind = decision.kind;
    if (decision.status == ClaimStatus::claimed) {
      Record fresh = claimed_record(request, current);
      result.record = fresh;
      shard.index_expiry(Key{request.id.tenant, request.id.key}, fresh.expires);
      if (it != shard.records.end()) {
        it->second = std::move(fresh);  // its old index entry goes stale or still matches
      } else {
        shard.records.emplace(Key{std::move(request.id.tenant), std::move(request.id.key)}, std::move(fresh));
      }
    } else {
      result.record = std::move(*current);
    }
  }
  done(std::move(result));
}

void MemoryStore::complete(CompleteRequest request, Callback<FenceStatus> done) {
  FenceStatus status = FenceStatus::lost;
  {
    Shard& shard = shard_of(request.fence.id);
    std::lock_guard lock(shard.mutex);
    if (Record* r = shard.find_held(request.fence)) {
      r->state = RecordState::completed;
      r->response = std::move(request.response);
      r->completed = request.now;
      shard.set_expiry(request.fence.id, *r, request.expires);
      status = FenceStatus::ok;
    }
  }
  done(status);
}

void MemoryStore::fail(FailRequest request, Callback<FenceStatus> done) {
  FenceStatus status = FenceStatus::lost;
  {
    Shard& shard = shard_of(request.fence.id);
    std::lock_guard lock(shard.mutex);
    if (Record* r = shard.find_held(request.fence)) {
      r->state = RecordState::failed_retryable;
      shard.set_expiry(request.fence.id, *r, request.expires);
      status = FenceStatus::ok;
    }
  }
  done(status);
}

void MemoryStore::release(Fence fence, Callback<FenceStatus> done) {
  FenceStatus status = FenceStatus::lost;
  {
    Shard& shard = shard_of(fence.id);
    std::lock_guard lock(shard.mutex);
    if (shard.find_held(fence)) {
      shard.records.erase(shard.records.find(KeyView(fence.id.tenant, fence.id.key)));  // its index entry goes stale
      status = FenceStatus::ok;
    }
  }
  done(status);
}

void MemoryStore::get(RecordId id, Callback<std::optional<Record>> done) {
  std::optional<Record> found;
  {
    Shard& shard = shard_of(id);
    std::lock_guard lock(shard.mutex);
    auto it = shard.records.find(KeyView(id.tenant, id.key));
    if (it != shard.records.end()) found = it->second;
  }
  done(std::move(found));
}

void MemoryStore::purge_expired(TimePoint now, std::size_t limit, Callback<std::size_t> done) {
  std::size_t purged = 0;
  for (Shard& shard : shards_) {
    if (purged == limit) break;
    std::lock_guard lock(shard.mutex);
    purged += shard.purge(now, limit - purged);
  }
  done(purged);
}

void MemoryStore::ping(Callback<Done> done) { done(Done{}); }

// ---- StoreAdmin -------------------------------------------------------------------------------

void MemoryStore::list(ListQuery query, Callback<std::vector<Record>> done) {
  // The `limit` smallest keys after the cursor, in order: each shard's `limit` smallest (copied
  // under its lock), then the smallest of those.
  std::vector<Record> page;
  const auto by_key = [](const Record& a, const Record& b) {
    return std::tie(a.tenant, a.key) < std::tie(b.tenant, b.key);
  };
  std::optional<Key> after;
  if (query.after) after = Key{query.after->tenant, query.after->key};
  for (Shard& shard : shards_) {
    std::vector<const Record*> best;  // a max-heap by key of this shard's smallest
    const auto by_key_ptr = [&](const Record* a, const Record* b) { return by_key(*a, *b); };
    std::lock_guard lock(shard.mutex);
    for (const auto& [key, record] : shard.records) {
      if (after && !(*after < key)) continue;
      if (query.state && record.state != *query.state) continue;
      if (best.size() < query.limit) {
        best.push_back(&record);
        std::push_heap(best.begin(), best.end(), by_key_ptr);
      } else if (!best.empty() && by_key(record, *best.front())) {
        std::pop_heap(best.begin(), best.end(), by_key_ptr);
        best.back() = &record;
        std::push_heap(best.begin(), best.end(), by_key_ptr);
      }
    }
    for (const Record* r : best) page.push_back(*r);
  }
  std::sort(page.begin(), page.end(), by_key);
  if (page.size() > query.limit) page.resize(query.limit);
  done(std::move(page));
}

void MemoryStore::mark_retryable(RecordId id, TimePoint now, Callback<AdminStatus> done) {
  AdminStatus status = AdminStatus::not_found;
  {
    Shard& shard = shard_of(id);
    std::lock_guard lock(shard.mutex);
    if (Record* r = shard.find_live(id, now)) {
      if (r->state == RecordState::completed) {
        status = AdminStatus::wrong_state;
      } else {
        r->state = RecordState::failed_retryable;
        r->fencing_token = new_fencing_token();
        status = AdminStatus::done;
      }
    }
  }
  done(status);
}

void MemoryStore::resolve(RecordId id, StoredResponse response, TimePoint now, TimePoint expires,
                          Callback<AdminStatus> done) {
  AdminStatus status = AdminStatus::not_found;
  {
    Shard& shard = shard_of(id);
    std::lock_guard lock(shard.mutex);
    if (Record* r = shard.find_live(id, now)) {
      if (r->state == RecordState::completed) {
        status = AdminStatus::wrong_state;
      } else {
        r->state = RecordState::completed;
        r->fencing_token = new_fencing_token();
        r->response = std::move(response);
        r->completed = now;
        shard.set_expiry(id, *r, expires);
        status = AdminStatus::done;
      }
    }
  }
  done(status);
}

void MemoryStore::count(TimePoint now, Callback<StateCounts> done) {
  StateCounts counts;
  for (Shard& shard : shards_) {
    std::lock_guard lock(shard.mutex);
    for (const auto& [key, r] : shard.records) {
      if (r.expires <= now) {
        ++counts.expired;
        continue;
      }
      switch (r.state) {
        case RecordState::in_progress: ++counts.in_progress; break;
        case RecordState::completed: ++counts.completed; break;
        case RecordState::failed_retryable: ++counts.failed_retryable; break;
      }
    }
  }
  done(counts);
}

}  // namespace idem
