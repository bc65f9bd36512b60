#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "idem/clock.hpp"
#include "idem/store.hpp"
#include "idem/store_admin.hpp"

namespace idem {

/// Everything RedisStore::open needs; defaults are for production on a LAN.
struct RedisOptions {
  /// Where the records live:
  ///   redis://[[USER]:PASSWORD@]HOST[:PORT][/DB]                  one server (port 6379, db 0)
  ///   redis+cluster://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]  a Redis Cluster; the listed
  ///                                                               nodes are only seeds
  /// TLS (rediss://) is not supported.
  std::string url;
  /// Every record's key starts with this, so several applications (or tests) can share one
  /// Redis. Must not contain `{` or `}` (the rest of the key is a cluster hash tag).
  std::string key_prefix = "idem:";
  /// How long a TCP connect (and the AUTH/SELECT after it) may take.
  Millis connect_timeout{1000};
  /// How long a command may wait for its reply, counted from the call. When it passes, the
  /// call fails with StoreErrc::timeout (in doubt) and the connection is dropped and reopened.
  Millis command_timeout{1000};
  /// After a failed connect (or a dropped connection) calls to that node fail at once with
  /// StoreErrc::unavailable until this delay has passed; the next call then reconnects. The
  /// delay doubles after each failure up to `reconnect_backoff_max`.
  Millis reconnect_backoff_min{100};
  /// Cap of the reconnect delay.
  Millis reconnect_backoff_max{1000};
  /// Replies that say "not now" (TRYAGAIN, CLUSTERDOWN, LOADING, MASTERDOWN, READONLY) are
  /// retried this many times, `retry_delay` apart (doubling), before the call fails with
  /// StoreErrc::unavailable.
  int max_retries = 3;
  /// First delay between such retries.
  Millis retry_delay{50};
  /// MOVED/ASK redirections followed per call before it fails with StoreErrc::unavailable.
  int max_redirects = 5;
  /// Each record's physical TTL is its logical lifetime (`expires - now` of the write) plus
  /// this, so Redis never drops a record a replica with a slower clock still considers live.
  /// Decisions always use the logical `expires`; this only bounds how long expired records
  /// linger (purge_expired removes them sooner).
  Millis ttl_grace{std::chrono::minutes(10)};
  /// If nonzero, every write is followed by `WAIT wait_replicas wait_timeout` on the same
  /// connection, and a write that fewer replicas acknowledged fails with
  /// StoreErrc::unavailable (in doubt). Narrows, but does not close, the window in which a
  /// failover loses an acknowledged record (Redis replication stays asynchronous).
  int wait_replicas = 0;
  /// How long WAIT waits for the replicas; must be below command_timeout.
  Millis wait_timeout{100};
  /// Cluster only: how often the slot map is re-read (CLUSTER SLOTS) even when nothing
  /// failed; zero disables the periodic refresh (MOVED and failures still trigger one).
  Millis topology_refresh_interval{10000};
  /// If true, open() fails with StoreErrc::unavailable when it cannot reach Redis (a cluster:
  /// cannot read the slot map). If false it starts anyway and calls fail with unavailable until
  /// Redis answers.
  bool check_on_open = true;
  /// COUNT hint of the SCANs behind purge_expired and the StoreAdmin calls.
  std::size_t scan_count = 1000;
};

/// What the store has done since it opened; for tests, benchmarks and metrics.
struct RedisStoreStats {
  std::uint64_t commands = 0;            ///< commands written (ASKING and WAIT not counted)
  std::uint64_t replies = 0;             ///< replies delivered to callers, errors included
  std::uint64_t batches = 0;             ///< socket writes that carried at least one command
  std::uint64_t largest_batch = 0;       ///< most commands appended at once (pipelining depth)
  std::uint64_t moved = 0;               ///< MOVED redirections followed
  std::uint64_t ask = 0;                 ///< ASK redirections followed
  std::uint64_t retries = 0;             ///< TRYAGAIN/CLUSTERDOWN/LOADING/... retries
  std::uint64_t noscript = 0;            ///< NOSCRIPT answers, resent as EVAL
  std::uint64_t connects = 0;            ///< connections established
  std::uint64_t connect_failures = 0;    ///< connects that failed
  std::uint64_t connections_lost = 0;    ///< connections dropped (EOF, reset, timeout)
  std::uint64_t timeouts = 0;            ///< calls failed by command_timeout
  std::uint64_t topology_refreshes = 0;  ///< slot maps read (cluster)
};

/// A shared store on Redis (SPEC §6): one server or a Redis Cluster, shared by every replica.
///
/// Each record is one hash at `<key_prefix>{<tenant>:<key>}` (both escaped, so the hash tag is
/// the whole identity and all of a record lives in one slot). Every step (claim, complete,
/// fail, release, and the operator actions) is one Lua script on that one key, run by EVALSHA
/// (EVAL when the server answers NOSCRIPT), so each is atomic on the server and cluster-safe.
/// The scripts decide with the caller's `now`, never Redis's clock.
///
/// Each Redis node gets one connection and one I/O thread of the store's own: calls are queued
/// to it and their commands pipelined on that connection, so callers never block and many
/// concurrent requests share one round trip. Callbacks run on those threads; they may call the
/// store again but must not block on it. purge_expired, list and count (which SCAN) run on
/// one more thread of the store's own; one timer thread delays retries and, for a cluster, one
/// thread reads the slot map.
///
/// In a cluster the store routes each key by its CRC16 slot, follows MOVED and ASK, and
/// re-reads the slot map after a redirection, a failed node, or `topology_refresh_interval`.
class RedisStore final : public Store, public StoreAdmin {
 public:
  /// Validates the options and starts the store's threads. Fails with StoreErrc::internal for a
  /// bad URL or option, and StoreErrc::unavailable when `check_on_open` is set and Redis cannot
  /// be reached.
  static StoreResult<std::unique_ptr<RedisStore>> open(RedisOptions options);

  /// Finishes the calls already made (each within command_timeout), then closes.
  ~RedisStore() override;

  RedisStore(const RedisStore&) = delete;
  RedisStore& operator=(const RedisStore&) = delete;

  void claim(ClaimRequest request, Callback<ClaimResult> done) override;
  void complete(CompleteRequest request, Callback<FenceStatus> done) override;
  void fail(FailRequest request, Callback<FenceStatus> done) override;
  void release(Fence fence, Callback<FenceStatus> done) override;
  void abandon(AbandonRequest request, Callback<FenceStatus> done) override;
  /// A batch call hands each node its share of the items at once: one pipelined write and one
  /// round trip per node (a claim that must take a record over, or meets a legacy record, costs
  /// one more). A cluster routes each item by its slot and follows MOVED/ASK item by item. A key
  /// that comes more than once in one claim_many is claimed by the script each time, so that its
  /// claims run in order.
  void claim_many(std::vector<ClaimRequest> requests, BatchCallback<ClaimResult> done) override;
  void complete_many(std::vector<CompleteRequest> requests, BatchCallback<FenceStatus> done) override;
  void fail_many(std::vector<FailRequest> requests, BatchCallback<FenceStatus> done) override;
  void release_many(std::vector<Fence> fences, BatchCallback<FenceStatus> done) override;
  void get(RecordId id, Callback<std::optional<Record>> done) override;
  /// SCANs the prefix (every master of a cluster) and deletes records whose logical expiry has
  /// passed: O(records). Redis also drops each record by itself `ttl_grace` after its expiry,
  /// so running this is optional (an operator's `idemctl purge`).
  void purge_expired(TimePoint now, std::size_t limit, Callback<std::size_t> done) override;
  /// PING; a cluster answers only if every master does.
  void ping(Callback<Done> done) override;
  /// True: every record carries a key TTL (`expires` + ttl_grace).
  bool expires_records_itself() const noexcept override { return true; }

  /// SCANs every record under the prefix, sorts and pages them: O(records), for operators.
  void list(ListQuery query, Callback<std::vector<Record>> done) override;
  void mark_retryable(RecordId id, TimePoint now, Callback<AdminStatus> done) override;
  void resolve(RecordId id, StoredResponse response, TimePoint now, TimePoint expires,
               Callback<AdminStatus> done) override;
  /// SCANs every record under the prefix: O(records), for operators.
  void count(TimePoint now, Callback<StateCounts> done) override;

  /// Counters since open.
  RedisStoreStats stats() const;

  /// The Redis key that holds (tenant, key) under `key_prefix`, as redis-cli shows it.
  std::string redis_key(const RecordId& id) const;

 private:
  class Impl;  // routing, node threads and scripts (redis_store.cpp)
  explicit RedisStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
