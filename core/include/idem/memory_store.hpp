#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
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
  using Key = std::pair<std::string, std::string>;             // (tenant, key)
  using KeyView = std::pair<std::string_view, std::string_view>;  // looks a Key up without copying it
  // Transparent, so lookups take a KeyView. Not noexcept on purpose: libstdc++ then keeps each
  // node's hash, so walking a bucket and growing the table compare and move stored hashes
  // instead of hashing every key they pass again.
  struct KeyHash {
    using is_transparent = void;
    std::size_t operator()(const KeyView& k) const;
    std::size_t operator()(const Key& k) const { return (*this)(KeyView(k.first, k.second)); }
  };
  struct KeyEqual {
    using is_transparent = void;
    template <class A, class B>
    bool operator()(const A& a, const B& b) const noexcept {
      return std::string_view(a.first) == std::string_view(b.first) &&
             std::string_view(a.second) == std::string_view(b.second);
    }
  };
  using Records = std::unordered_map<Key, Record, KeyHash, KeyEqual>;

  // The records whose key hashes to one shard, under their own mutex. Sharding keeps the event
  // loops of a gateway from queueing on one lock, and each table small: a table that grows
  // rehashes all its records at once, under its lock, so one big table stalls every request for
  // as long as that takes (over 100 ms at a million records).
  struct Shard {
    std::mutex mutex;
    Records records;
    // The expiry index: for each second, the keys of the records that expire within it. Purging
    // walks the seconds that have passed and nothing else. An entry can be stale (the record was
    // released, or its expiry moved to another second when it completed); purging checks each
    // against the record and drops the stale ones.
    std::map<std::int64_t, std::vector<Key>> expiring;

    // All require `mutex`.
    Record* find_held(const Fence& fence);
    Record* find_live(const RecordId& id, TimePoint now);  // unexpired only
    void index_expiry(Key key, TimePoint expires);
    void set_expiry(const RecordId& id, Record& r, TimePoint expires);
    std::size_t purge(TimePoint now, std::size_t limit);
  };
  static constexpr std::size_t kShards = 64;

  Shard& shard_of(const RecordId& id);

  std::array<Shard, kShards> shards_;
};

}  // namespace idem
