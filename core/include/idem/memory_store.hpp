#pragma once

#include <map>
#include <mutex>
#include <set>

#include "idem/store.hpp"
#include "idem/store_admin.hpp"

namespace idem {

/// Records in a mutex-guarded map: for tests and single-process use. Nothing survives the
/// process. Callbacks run inline, on the caller's thread, before each call returns.
class MemoryStore final : public Store, public StoreAdmin {
 public:
  void claim(ClaimRequest request, Callback<ClaimResult> done) override;
  void complete(CompleteRequest request, Callback<FenceStatus> done) override;
  void fail(FailRequest request, Callback<FenceStatus> done) override;
  void release(Fence fence, Callback<FenceStatus> done) override;
  void get(RecordId id, Callback<std::optional<Record>> done) override;
  void purge_expired(TimePoint now, std::size_t limit, Callback<std::size_t> done) override;
  void ping(Callback<Done> done) override;

  void list(ListQuery query, Callback<std::vector<Record>> done) override;
  void mark_retryable(RecordId id, TimePoint now, Callback<AdminStatus> done) override;
  void resolve(RecordId id, StoredResponse response, TimePoint now, TimePoint expires,
               Callback<AdminStatus> done) override;
  void count(TimePoint now, Callback<StateCounts> done) override;

 private:
  using Key = std::pair<std::string, std::string>;
  Record* find_held(const Fence& fence);                // requires mutex_
  Record* find_live(const RecordId& id, TimePoint now);  // requires mutex_; unexpired only
  void set_expiry(const Key& key, Record& r, TimePoint expires);  // requires mutex_
  void erase(std::map<Key, Record>::iterator it);       // requires mutex_

  std::mutex mutex_;
  std::map<Key, Record> records_;
  // (expires, key) for every record, so purging touches only what expired instead of scanning.
  std::set<std::pair<TimePoint, Key>> by_expiry_;
};

}  // namespace idem
