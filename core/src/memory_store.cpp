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
