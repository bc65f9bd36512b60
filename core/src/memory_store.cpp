#include "idem/memory_store.hpp"

namespace idem {

Record* MemoryStore::find_held(const Fence& fence) {
  auto it = records_.find(Key{fence.id.tenant, fence.id.key});
  if (it == records_.end()) return nullptr;
  Record& r = it->second;
  if (r.state != RecordState::in_progress || r.fencing_token != fence.token) return nullptr;
  return &r;
}

void MemoryStore::set_expiry(const Key& key, Record& r, TimePoint expires) {
  by_expiry_.erase({r.expires, key});
  r.expires = expires;
  by_expiry_.insert({expires, key});
}

void MemoryStore::erase(std::map<Key, Record>::iterator it) {
  by_expiry_.erase({it->second.expires, it->first});
  records_.erase(it);
}

void MemoryStore::claim(ClaimRequest request, Callback<ClaimResult> done) {
  ClaimResult result;
  {
    std::lock_guard lock(mutex_);
    auto it = records_.find(Key{request.id.tenant, request.id.key});
    std::optional<Record> current;
    if (it != records_.end()) current = it->second;
    const ClaimDecision decision = decide_claim(current, request);
    result.status = decision.status;
    result.kind = decision.kind;
    if (decision.status == ClaimStatus::claimed) {
      Key key{request.id.tenant, request.id.key};
      if (it != records_.end()) erase(it);
      Record fresh = claimed_record(request, current);
      result.record = fresh;
      by_expiry_.insert({fresh.expires, key});
      records_.emplace(std::move(key), std::move(fresh));
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
      set_expiry(Key{request.fence.id.tenant, request.fence.id.key}, *r, request.expires);
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
      set_expiry(Key{request.fence.id.tenant, request.fence.id.key}, *r, request.expires);
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
      erase(records_.find(Key{fence.id.tenant, fence.id.key}));
      status = FenceStatus::ok;
    }
  }
  done(status);
}

void MemoryStore::get(RecordId id, Callback<std::optional<Record>> done) {
  std::optional<Record> found;
  {
    std::lock_guard lock(mutex_);
    auto it = records_.find(Key{id.tenant, id.key});
    if (it != records_.end()) found = it->second;
  }
  done(std::move(found));
}

void MemoryStore::purge_expired(TimePoint now, std::size_t limit, Callback<std::size_t> done) {
  std::size_t purged = 0;
  {
    std::lock_guard lock(mutex_);
    while (purged < limit && !by_expiry_.empty() && by_expiry_.begin()->first <= now) {
      records_.erase(by_expiry_.begin()->second);
      by_expiry_.erase(by_expiry_.begin());
      ++purged;
    }
  }
  done(purged);
}

void MemoryStore::ping(Callback<Done> done) { done(Done{}); }

}  // namespace idem

namespace idem {

Record* MemoryStore::find_live(const RecordId& id, TimePoint now) {
  auto it = records_.find(Key{id.tenant, id.key});
  if (it == records_.end() || it->second.expires <= now) return nullptr;
  return &it->second;
}

void MemoryStore::list(ListQuery query, Callback<std::vector<Record>> done) {
  std::vector<Record> out;
  {
    std::lock_guard lock(mutex_);
    auto it = query.after ? records_.upper_bound(Key{query.after->tenant, query.after->key}) : records_.begin();
    for (; it != records_.end() && out.size() < query.limit; ++it) {
      if (!query.state || it->second.state == *query.state) out.push_back(it->second);
    }
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
        set_expiry(Key{id.tenant, id.key}, *r, expires);
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
