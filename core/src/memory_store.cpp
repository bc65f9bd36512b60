#include "idem/memory_store.hpp"

#include <algorithm>
#include <chrono>
#include <functional>
#include <string_view>

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

Record* MemoryStore::find_held(const Fence& fence) {
  auto it = records_.find(KeyView(fence.id.tenant, fence.id.key));
  if (it == records_.end()) return nullptr;
  Record& r = it->second;
  if (r.state != RecordState::in_progress || r.fencing_token != fence.token) return nullptr;
  return &r;
}

Record* MemoryStore::find_live(const RecordId& id, TimePoint now) {
  auto it = records_.find(KeyView(id.tenant, id.key));
  if (it == records_.end() || it->second.expires <= now) return nullptr;
  return &it->second;
}

void MemoryStore::index_expiry(Key key, TimePoint expires) {
  expiring_[second_of(expires)].push_back(std::move(key));
}

void MemoryStore::set_expiry(const RecordId& id, Record& r, TimePoint expires) {
  // Within the same second the record's existing index entry still covers it.
  if (second_of(expires) != second_of(r.expires)) index_expiry(Key{id.tenant, id.key}, expires);
  r.expires = expires;
}

void MemoryStore::claim(ClaimRequest request, Callback<ClaimResult> done) {
  ClaimResult result;
  {
    std::lock_guard lock(mutex_);
    auto it = records_.find(KeyView(request.id.tenant, request.id.key));
    std::optional<Record> current;
    if (it != records_.end()) current = it->second;
    const ClaimDecision decision = decide_claim(current, request);
    result.status = decision.status;
    result.kind = decision.kind;
    if (decision.status == ClaimStatus::claimed) {
      Record fresh = claimed_record(request, current);
      result.record = fresh;
      index_expiry(Key{request.id.tenant, request.id.key}, fresh.expires);
      if (it != records_.end()) {
        it->second = std::move(fresh);  // its old index entry goes stale or still matches
      } else {
        records_.emplace(Key{std::move(request.id.tenant), std::move(request.id.key)}, std::move(fresh));
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
    std::lock_guard lock(mutex_);
    if (Record* r = find_held(request.fence)) {
      r->state = RecordState::completed;
      r->response = std::move(request.response);
      r->completed = request.now;
      set_expiry(request.fence.id, *r, request.expires);
      status = FenceStatus::ok;
    }
  }
  done(status);
}

void MemoryStore::fail(FailRequest request, Callback<FenceStatus> done) {
  FenceStatus status = FenceStatus::lost;
  {
    std::lock_guard lock(mutex_);
    if (Record* r = find_held(request.fence)) {
      r->state = RecordState::failed_retryable;
      set_expiry(request.fence.id, *r, request.expires);
      status = FenceStatus::ok;
    }
  }
  done(status);
}

void MemoryStore::release(Fence fence, Callback<FenceStatus> done) {
  FenceStatus status = FenceStatus::lost;
  {
    std::lock_guard lock(mutex_);
    if (find_held(fence)) {
      records_.erase(records_.find(KeyView(fence.id.tenant, fence.id.key)));  // its index entry goes stale
      status = FenceStatus::ok;
    }
  }
  done(status);
}

void MemoryStore::get(RecordId id, Callback<std::optional<Record>> done) {
  std::optional<Record> found;
  {
    std::lock_guard lock(mutex_);
    auto it = records_.find(KeyView(id.tenant, id.key));
    if (it != records_.end()) found = it->second;
  }
  done(std::move(found));
}

void MemoryStore::purge_expired(TimePoint now, std::size_t limit, Callback<std::size_t> done) {
  std::size_t purged = 0;
  {
    std::lock_guard lock(mutex_);
    const std::int64_t current = second_of(now);
    while (!expiring_.empty() && expiring_.begin()->first <= current && purged < limit) {
      const std::int64_t second = expiring_.begin()->first;
      std::vector<Key>& keys = expiring_.begin()->second;
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
        auto it = records_.find(keys[i]);
        if (it == records_.end() || second_of(it->second.expires) != second) continue;  // stale
        if (it->second.expires <= now) {
          records_.erase(it);
          ++purged;
        } else {
          keep(i);
        }
      }
      keys.resize(kept);
      if (!keys.empty()) break;  // the current second, or the limit
      expiring_.erase(expiring_.begin());
    }
  }
  done(purged);
}

void MemoryStore::ping(Callback<Done> done) { done(Done{}); }

void MemoryStore::list(ListQuery query, Callback<std::vector<Record>> done) {
  std::vector<Record> out;
  {
    std::lock_guard lock(mutex_);
    // The `limit` smallest keys after the cursor, in order, from one pass over the table.
    std::vector<const Records::value_type*> page;
    const auto by_key = [](const Records::value_type* a, const Records::value_type* b) {
      return a->first < b->first;
    };
    std::optional<Key> after;
    if (query.after) after = Key{query.after->tenant, query.after->key};
    for (const auto& entry : records_) {
      if (after && !(*after < entry.first)) continue;
      if (query.state && entry.second.state != *query.state) continue;
      if (page.size() < query.limit) {
        page.push_back(&entry);
        std::push_heap(page.begin(), page.end(), by_key);
      } else if (!page.empty() && entry.first < page.front()->first) {
        std::pop_heap(page.begin(), page.end(), by_key);
        page.back() = &entry;
        std::push_heap(page.begin(), page.end(), by_key);
      }
    }
    std::sort_heap(page.begin(), page.end(), by_key);
    out.reserve(page.size());
    for (const auto* entry : page) out.push_back(entry->second);
  }
  done(std::move(out));
}

void MemoryStore::mark_retryable(RecordId id, TimePoint now, Callback<AdminStatus> done) {
  AdminStatus status = AdminStatus::not_found;
  {
    std::lock_guard lock(mutex_);
    if (Record* r = find_live(id, now)) {
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
    std::lock_guard lock(mutex_);
    if (Record* r = find_live(id, now)) {
      if (r->state == RecordState::completed) {
        status = AdminStatus::wrong_state;
      } else {
        r->state = RecordState::completed;
        r->fencing_token = new_fencing_token();
        r->response = std::move(response);
        r->completed = now;
        set_expiry(id, *r, expires);
        status = AdminStatus::done;
      }
    }
  }
  done(status);
}

void MemoryStore::count(TimePoint now, Callback<StateCounts> done) {
  StateCounts counts;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [key, r] : records_) {
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
