#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "idem/store.hpp"
#include "idem/store_admin.hpp"

namespace idem {

/// Records in hash tables, sharded by key, each shard behind its own mutex: for tests and
/// single-process use. Nothing survives the process. Callbacks run inline, on the caller's
/// thread, before each call returns.
///
/// Claims, completions and lookups cost O(1). Purging touches only what expired. `list` reads
/// every record to page through them in (tenant, key) order: O(records) per page.
class MemoryStore final : public Store, public StoreAdmin {
 public:
  MemoryStore();
  ~MemoryStore() override;
  MemoryStore(const MemoryStore&) = delete;
  MemoryStore& operator=(const MemoryStore&) = delete;

  void claim(ClaimRequest request, Callback<ClaimResult> done) override;
  void complete(CompleteRequest request, Callback<FenceStatus> done) override;
  void fail(FailRequest request, Callback<FenceStatus> done) override;
  void release(Fence fence, Callback<FenceStatus> done) override;
  void abandon(AbandonRequest request, Callback<FenceStatus> done) override;
  /// The batch calls take each shard's mutex once for all of the batch's items in that shard.
  void claim_many(std::vector<ClaimRequest> requests, BatchCallback<ClaimResult> done) override;
  void complete_many(std::vector<CompleteRequest> requests, BatchCallback<FenceStatus> done) override;
  void fail_many(std::vector<FailRequest> requests, BatchCallback<FenceStatus> done) override;
  void release_many(std::vector<Fence> fences, BatchCallback<FenceStatus> done) override;
  void get(RecordId id, Callback<std::optional<Record>> done) override;
  void purge_expired(TimePoint now, std::size_t limit, Callback<std::size_t> done) override;
  void ping(Callback<Done> done) override;

  void list(ListQuery query, Callback<std::vector<Record>> done) override;
  void mark_retryable(RecordId id, TimePoint now, Callback<AdminStatus> done) override;
  void resolve(RecordId id, StoredResponse response, TimePoint now, TimePoint expires,
               Callback<AdminStatus> done) override;
  void count(TimePoint now, Callback<StateCounts> done) override;

 private:
  // The records whose key hashes to one shard, under their own mutex (memory_store.cpp).
  struct Shard;
  static constexpr std::size_t kShards = 64;

  Shard& shard_for(std::size_t hash);
  std::span<Shard> shards();
  template <class T, class Item, class Apply>
  BatchResults<T> by_shard(std::vector<Item>& items, Apply&& apply);

  std::unique_ptr<Shard[]> shards_;
};

}  // namespace idem
