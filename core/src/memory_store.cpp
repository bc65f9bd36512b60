#include "idem/memory_store.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <mutex>
#include <string_view>
#include <tuple>

#include "record_table.hpp"

namespace idem {
namespace {

// The second an expiry falls in: the expiry index's bucket.
std::int64_t second_of(TimePoint t) {
  return std::chrono::floor<std::chrono::seconds>(t).time_since_epoch().count();
}

std::size_t hash_of(std::string_view tenant, std::string_view key) {
  const std::size_t t = std::hash<std::string_view>{}(tenant);
  const std::size_t k = std::hash<std::string_view>{}(key);
  return k ^ (t + 0x9e3779b97f4a7c15ULL + (k << 6) + (k >> 2));
}
std::size_t hash_of(const RecordId& id) { return hash_of(id.tenant, id.key); }

}  // namespace

// The records whose key hashes to one shard, under their own mutex. Sharding keeps the event
// loops of a gateway from queueing on one lock, and each table small: a table that grows moves
// all its slots at once, under its lock, so one big table would stall every request for as long
// as that takes.
struct MemoryStore::Shard {
  std::mutex mutex;
  memory_detail::RecordTable records;
  // The expiry index: for each second, the key hashes of the records that expire within it.
  // Purging walks the seconds that have passed and nothing else. An entry can be stale (the
  // record was released, or its expiry moved to another second when it completed); purging
  // checks the records with that hash and drops the entry when none of them is due in its second.
  std::map<std::int64_t, std::vector<std::size_t>> expiring;
  std::vector<std::size_t>* last_bucket = nullptr;  // expiring[last_second]; null once purged
  std::int64_t last_second = 0;

  // All require `mutex`.
  Record* find_held(std::size_t hash, const Fence& fence) {
    Record* r = records.find(hash, fence.id.tenant, fence.id.key);
    if (!r || r->state != RecordState::in_progress || r->fencing_token != fence.token) return nullptr;
    return r;
  }
  Record* find_live(std::size_t hash, const RecordId& id, TimePoint now) {  // unexpired only
    Record* r = records.find(hash, id.tenant, id.key);
    return r && r->expires > now ? r : nullptr;
  }
  void index_expiry(std::size_t hash, TimePoint expires) {
    // Nearly every record of a busy second lands in the same bucket: skip the map's search.
    const std::int64_t second = second_of(expires);
    if (!last_bucket || second != last_second) {
      last_bucket = &expiring[second];
      last_second = second;
    }
    last_bucket->push_back(hash);
  }
  void set_expiry(std::size_t hash, Record& r, TimePoint expires) {
    // Within the same second the record's existing index entry still covers it.
    if (second_of(expires) != second_of(r.expires)) index_expiry(hash, expires);
    r.expires = expires;
  }
  std::size_t purge(TimePoint now, std::size_t limit);
  ClaimResult claim(std::size_t hash, ClaimRequest&& request);
  FenceStatus complete(std::size_t hash, CompleteRequest&& request);
  FenceStatus fail(std::size_t hash, const FailRequest& request);
  FenceStatus release(std::size_t hash, const Fence& fence);
};

MemoryStore::MemoryStore() : shards_(std::make_unique<Shard[]>(kShards)) {}
MemoryStore::~MemoryStore() = default;

std::span<MemoryStore::Shard> MemoryStore::shards() { return {shards_.get(), kShards}; }

MemoryStore::Shard& MemoryStore::shard_for(std::size_t hash) {
  // The top bits: the shard's table picks slots by the low bits.
  static_assert(kShards == 64);
  return shards_[hash >> 58];
}

std::size_t MemoryStore::Shard::purge(TimePoint now, std::size_t limit) {
  std::size_t purged = 0;
  const std::int64_t current = second_of(now);
  while (!expiring.empty() && expiring.begin()->first <= current && purged < limit) {
    const std::int64_t second = expiring.begin()->first;
    std::vector<std::size_t>& hashes = expiring.begin()->second;
    // Keeps, at the front, the entries that must stay: records of this second that have not
    // expired yet (only in the current second), and those beyond `limit`.
    std::size_t kept = 0;
    for (std::size_t i = 0; i < hashes.size(); ++i) {
      bool due_later = purged == limit;
      if (!due_later) {
        records.erase_hash_if(hashes[i], [&](const Record& r) {
          if (second_of(r.expires) != second) return false;  // another record, or this entry is stale
          if (r.expires <= now && purged < limit) {
            ++purged;
            return true;
          }
          due_later = true;
          return false;
        });
      }
      if (due_later) hashes[kept++] = hashes[i];
    }
    hashes.resize(kept);
    if (!hashes.empty()) break;  // the current second, or the limit
    if (&hashes == last_bucket) last_bucket = nullptr;
    expiring.erase(expiring.begin());
  }
  return purged;
}

// ---- Store ------------------------------------------------------------------------------------

// The operations on one record, each under its shard's mutex (the caller holds it).

ClaimResult MemoryStore::Shard::claim(std::size_t hash, ClaimRequest&& request) {
  ClaimResult result;
  Record* existing = records.find(hash, request.id.tenant, request.id.key);
  std::optional<Record> current;
  if (existing) current = *existing;
  const ClaimDecision decision = decide_claim(current, request);
  result.status = decision.status;
  result.kind = decision.kind;
  if (decision.status == ClaimStatus::claimed) {
    Record fresh = claimed_record(std::move(request), current);  // `request` is not read again
    result.record = fresh;
    index_expiry(hash, fresh.expires);
    if (existing) {
      *existing = std::move(fresh);  // its old index entry goes stale or still matches
    } else {
      records.insert(hash, std::move(fresh));
    }
  } else {
    result.record = std::move(*current);
  }
  return result;
}

FenceStatus MemoryStore::Shard::complete(std::size_t hash, CompleteRequest&& request) {
  Record* r = find_held(hash, request.fence);
  if (!r) return FenceStatus::lost;
  r->state = RecordState::completed;
  r->response = std::move(request.response);
  r->completed = request.now;
  set_expiry(hash, *r, request.expires);
  return FenceStatus::ok;
}

FenceStatus MemoryStore::Shard::fail(std::size_t hash, const FailRequest& request) {
  Record* r = find_held(hash, request.fence);
  if (!r) return FenceStatus::lost;
  r->state = RecordState::failed_retryable;
  set_expiry(hash, *r, request.expires);
  return FenceStatus::ok;
}

FenceStatus MemoryStore::Shard::release(std::size_t hash, const Fence& fence) {
  if (!find_held(hash, fence)) return FenceStatus::lost;
  records.erase(hash, fence.id.tenant, fence.id.key);  // its index entry goes stale
  return FenceStatus::ok;
}

namespace {

const RecordId& id_of(const ClaimRequest& r) { return r.id; }
const RecordId& id_of(const CompleteRequest& r) { return r.fence.id; }
const RecordId& id_of(const FailRequest& r) { return r.fence.id; }
const RecordId& id_of(const Fence& f) { return f.id; }

}  // namespace

// Applies `apply(shard, hash, item)` to each item, taking each shard's mutex once for all of its
// items: they run in their order, so two items on one key (one shard) run one after the other.
template <class T, class Item, class Apply>
BatchResults<T> MemoryStore::by_shard(std::vector<Item>& items, Apply&& apply) {
  struct Slot {
    std::size_t hash;
    std::size_t index;
  };
  std::vector<Slot> slots;
  slots.reserve(items.size());
  for (std::size_t i = 0; i < items.size(); ++i) slots.push_back({hash_of(id_of(items[i])), i});
  std::sort(slots.begin(), slots.end(), [&](const Slot& a, const Slot& b) {
    const Shard* x = &shard_for(a.hash);
    const Shard* y = &shard_for(b.hash);
    return x != y ? x < y : a.index < b.index;
  });
  BatchResults<T> results(items.size());
  for (std::size_t at = 0; at < slots.size();) {
    Shard& shard = shard_for(slots[at].hash);
    std::lock_guard lock(shard.mutex);
    for (; at < slots.size() && &shard_for(slots[at].hash) == &shard; ++at) {
      results[slots[at].index] = apply(shard, slots[at].hash, items[slots[at].index]);
    }
  }
  return results;
}

void MemoryStore::claim(ClaimRequest request, Callback<ClaimResult> done) {
  ClaimResult result;
  {
    const std::size_t hash = hash_of(request.id);
    Shard& shard = shard_for(hash);
    std::lock_guard lock(shard.mutex);
    result = shard.claim(hash, std::move(request));
  }
  done(std::move(result));
}

void MemoryStore::complete(CompleteRequest request, Callback<FenceStatus> done) {
  FenceStatus status;
  {
    const std::size_t hash = hash_of(request.fence.id);
    Shard& shard = shard_for(hash);
    std::lock_guard lock(shard.mutex);
    status = shard.complete(hash, std::move(request));
  }
  done(status);
}

void MemoryStore::fail(FailRequest request, Callback<FenceStatus> done) {
  FenceStatus status;
  {
    const std::size_t hash = hash_of(request.fence.id);
    Shard& shard = shard_for(hash);
    std::lock_guard lock(shard.mutex);
    status = shard.fail(hash, request);
  }
  done(status);
}

void MemoryStore::release(Fence fence, Callback<FenceStatus> done) {
  FenceStatus status;
  {
    const std::size_t hash = hash_of(fence.id);
    Shard& shard = shard_for(hash);
    std::lock_guard lock(shard.mutex);
    status = shard.release(hash, fence);
  }
  done(status);
}

void MemoryStore::abandon(AbandonRequest request, Callback<FenceStatus> done) {
  FenceStatus status = FenceStatus::lost;
  {
    const std::size_t hash = hash_of(request.fence.id);
    Shard& shard = shard_for(hash);
    std::lock_guard lock(shard.mutex);
    if (Record* r = shard.find_held(hash, request.fence)) {
      r->lease_expires = request.now;
      status = FenceStatus::ok;
    }
  }
  done(status);
}

void MemoryStore::claim_many(std::vector<ClaimRequest> requests, BatchCallback<ClaimResult> done) {
  done(by_shard<ClaimResult>(requests, [](Shard& shard, std::size_t hash, ClaimRequest& r) {
    return shard.claim(hash, std::move(r));
  }));
}

void MemoryStore::complete_many(std::vector<CompleteRequest> requests, BatchCallback<FenceStatus> done) {
  done(by_shard<FenceStatus>(requests, [](Shard& shard, std::size_t hash, CompleteRequest& r) {
    return shard.complete(hash, std::move(r));
  }));
}

void MemoryStore::fail_many(std::vector<FailRequest> requests, BatchCallback<FenceStatus> done) {
  done(by_shard<FenceStatus>(
      requests, [](Shard& shard, std::size_t hash, const FailRequest& r) { return shard.fail(hash, r); }));
}

void MemoryStore::release_many(std::vector<Fence> fences, BatchCallback<FenceStatus> done) {
  done(by_shard<FenceStatus>(
      fences, [](Shard& shard, std::size_t hash, const Fence& f) { return shard.release(hash, f); }));
}

void MemoryStore::get(RecordId id, Callback<std::optional<Record>> done) {
  std::optional<Record> found;
  {
    const std::size_t hash = hash_of(id);
    Shard& shard = shard_for(hash);
    std::lock_guard lock(shard.mutex);
    if (const Record* r = shard.records.find(hash, id.tenant, id.key)) found = *r;
  }
  done(std::move(found));
}

void MemoryStore::purge_expired(TimePoint now, std::size_t limit, Callback<std::size_t> done) {
  std::size_t purged = 0;
  for (Shard& shard : shards()) {
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
  for (Shard& shard : shards()) {
    std::vector<const Record*> best;  // a max-heap by key of this shard's smallest
    const auto by_key_ptr = [&](const Record* a, const Record* b) { return by_key(*a, *b); };
    std::lock_guard lock(shard.mutex);
    shard.records.for_each([&](const Record& record) {
      if (query.after && std::tie(record.tenant, record.key) <= std::tie(query.after->tenant, query.after->key)) return;
      if (query.state && record.state != *query.state) return;
      if (query.tenant && record.tenant != *query.tenant) return;
      if (best.size() < query.limit) {
        best.push_back(&record);
        std::push_heap(best.begin(), best.end(), by_key_ptr);
      } else if (!best.empty() && by_key(record, *best.front())) {
        std::pop_heap(best.begin(), best.end(), by_key_ptr);
        best.back() = &record;
        std::push_heap(best.begin(), best.end(), by_key_ptr);
      }
    });
    for (const Record* r : best) page.push_back(*r);
  }
  std::sort(page.begin(), page.end(), by_key);
  if (page.size() > query.limit) page.resize(query.limit);
  done(std::move(page));
}

void MemoryStore::mark_retryable(RecordId id, TimePoint now, Callback<AdminStatus> done) {
  AdminStatus status = AdminStatus::not_found;
  {
    const std::size_t hash = hash_of(id);
    Shard& shard = shard_for(hash);
    std::lock_guard lock(shard.mutex);
    if (Record* r = shard.find_live(hash, id, now)) {
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
    const std::size_t hash = hash_of(id);
    Shard& shard = shard_for(hash);
    std::lock_guard lock(shard.mutex);
    if (Record* r = shard.find_live(hash, id, now)) {
      if (r->state == RecordState::completed) {
        status = AdminStatus::wrong_state;
      } else {
        r->state = RecordState::completed;
        r->fencing_token = new_fencing_token();
        r->response = std::move(response);
        r->completed = now;
        shard.set_expiry(hash, *r, expires);
        status = AdminStatus::done;
      }
    }
  }
  done(status);
}

void MemoryStore::count(TimePoint now, Callback<StateCounts> done) {
  StateCounts counts;
  for (Shard& shard : shards()) {
    std::lock_guard lock(shard.mutex);
    shard.records.for_each([&](const Record& r) {
      if (r.expires <= now) {
        ++counts.expired;
        return;
      }
      switch (r.state) {
        case RecordState::in_progress: ++counts.in_progress; break;
        case RecordState::completed: ++counts.completed; break;
        case RecordState::failed_retryable: ++counts.failed_retryable; break;
      }
    });
  }
  done(counts);
}

}  // namespace idem
