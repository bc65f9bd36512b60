#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.hpp"
#include "idem/store.hpp"
#include "idem/store_admin.hpp"

struct pg_conn;  // libpq's PGconn, for applications that drive libpq themselves in a transaction

namespace idem {

/// Everything PostgresStore::open needs; defaults are for production.
struct PostgresOptions {
  /// Where the server is: a libpq URL (`postgres://user@host:5432/db?sslmode=require`) or a
  /// key=value string. libpq's environment variables (PGPASSWORD, PGSSLMODE, ...) and
  /// ~/.pgpass apply as usual.
  std::string conninfo;
  /// The schema holding idem's table, created if missing. Every replica of a service must use
  /// the same one; different services may share a database with different schemas.
  std::string schema = "public";
  /// Run the schema migrations at open (under an advisory lock, so replicas starting together
  /// do not race). When false, open only checks that the schema is at this build's version —
  /// for roles without CREATE rights, with migrations run once by a privileged `open`.
  bool migrate = true;
  /// Connections, each owned by one store thread. Operations queued while all are busy share
  /// the next transaction (group commit), so a few connections serve many concurrent requests.
  std::size_t pool_size = 4;
  /// The most operations one transaction (one pipelined round trip) carries; a batch call with
  /// more items still goes in one.
  std::size_t max_batch = 128;
  /// How long opening one connection may take. While the server is unreachable, an operation
  /// fails with StoreErrc::unavailable within about this time (at once during reconnect backoff).
  Millis connect_timeout{2000};
  /// The server cancels a statement running longer (StoreErrc::timeout). The client gives up on
  /// a connection that stays silent for this plus one second (StoreErrc::timeout, in doubt).
  Millis statement_timeout{5000};
  /// Transactions aborted by a serialization failure or deadlock are run again this many times
  /// before their operations fail with StoreErrc::unavailable.
  int max_retries = 3;
  /// A lost connection is reopened at once, then after waits doubling from min to max while the
  /// server stays away.
  Millis reconnect_backoff_min{50};
  Millis reconnect_backoff_max{1000};
  /// How often the background reaper deletes expired records; zero (the default) runs no reaper,
  /// leaving purge_expired to the caller (e.g. `idemctl purge` from cron). Replicas may all reap:
  /// they skip each other's locked rows.
  Millis reaper_interval{0};
  /// Records the reaper deletes per transaction; it repeats until fewer than this remain.
  std::size_t reaper_batch = 1000;
  /// The reaper's "now"; the system clock when null. Must outlive the store.
  const Clock* clock = nullptr;
  /// Shown in pg_stat_activity; a conninfo that sets application_name wins.
  std::string application_name = "idem";
};

/// What the store has done since it opened; for tests, benchmarks and metrics.
struct PostgresStoreStats {
  std::uint64_t operations = 0;       ///< operations executed (successfully or not)
  std::uint64_t transactions = 0;     ///< transactions sent (a batch is one pipelined transaction)
  std::uint64_t largest_batch = 0;    ///< most operations in one transaction
  std::uint64_t retried = 0;          ///< transactions run again after a serialization failure or deadlock
  std::uint64_t isolated = 0;         ///< batches split into one transaction per operation after one was refused
  std::uint64_t failed = 0;           ///< transactions that failed as a whole (connection, timeout, ...)
  std::uint64_t in_doubt = 0;         ///< operations answered with an in-doubt error
  std::uint64_t connects = 0;         ///< connections opened (including the first ones)
  std::uint64_t connect_failures = 0; ///< attempts to connect that failed
  std::uint64_t reaped = 0;           ///< records the background reaper deleted
};

/// One row of a PostgresTransaction result: each column in PostgreSQL's text form, nullopt for NULL.
using PostgresRow = std::vector<std::optional<std::string>>;

/// The answer to PostgresTransaction::exec.
struct PostgresResult {
  std::vector<PostgresRow> rows;  ///< rows returned, if any
  std::uint64_t affected = 0;     ///< rows inserted, updated or deleted (PQcmdTuples)
};

/// The application's handle on the store's open transaction during complete_in_transaction:
/// its statements run on the same connection and commit or roll back with the completion.
class PostgresTransaction {
 public:
  /// Runs one SQL statement with `$1`, `$2`, ... parameters in text form (nullopt for NULL).
  /// An error leaves the transaction aborted: the work should return false.
  StoreResult<PostgresResult> exec(std::string_view sql, std::span<const std::optional<std::string>> params = {});
  /// exec with a braced list of parameters: tx.exec("INSERT ... VALUES ($1, $2)", {"a", "b"}).
  StoreResult<PostgresResult> exec(std::string_view sql, std::initializer_list<std::optional<std::string>> params) {
    return exec(sql, std::span<const std::optional<std::string>>(params.begin(), params.size()));
  }
  /// The connection, for libpq calls of the application's own (blocking calls are fine here; the
  /// connection is in its normal, non-pipeline mode). Do not BEGIN, COMMIT or ROLLBACK, do not
  /// close it, and leave no query running.
  pg_conn* native_handle() const;
  /// The schema of the store's tables (PostgresOptions::schema), unquoted: where the
  /// application's statements find idem's tables (the outbox: PostgresOutbox::enqueue).
  const std::string& schema() const;

  class Session;  // store-internal
  explicit PostgresTransaction(Session& session) : session_(session) {}

 private:
  Session& session_;
};

/// The application's part of a transactional completion (SPEC §4.4): runs its own statements on
/// `tx`. Returns false (with `error` set) to roll everything back. It runs on a store thread, so
/// it must not call the store and should be quick: the record stays locked while it runs.
using PostgresWork = std::move_only_function<bool(PostgresTransaction& tx, std::string& error)>;

/// One item of PostgresStore::complete_many_in_transaction: a completion and the application's
/// work that commits with it.
struct PostgresWorkItem {
  CompleteRequest request;
  PostgresWork work;
};

/// The shared store (SPEC §6): one PostgreSQL table that every replica of a service uses.
///
/// `pool_size` threads each own one connection in libpq's pipeline mode. Operations go into one
/// queue; a thread takes everything queued (up to `max_batch`), sends it as one implicit
/// transaction in a single round trip, and calls the callbacks once it has committed. Under
/// load many requests share one commit; an idle store answers in one round trip. Callbacks run
/// on those threads; they may call the store again but must not block on it.
class PostgresStore final : public Store, public StoreAdmin {
 public:
  /// Connects, migrates (or checks) the schema and starts the threads. Fails with
  /// StoreErrc::unavailable when the server cannot be reached within connect_timeout, and
  /// corrupt when the schema is newer than this build.
  static StoreResult<std::unique_ptr<PostgresStore>> open(PostgresOptions options);

  /// Finishes every queued operation, stops the threads and closes the connections.
  ~PostgresStore() override;

  PostgresStore(const PostgresStore&) = delete;
  PostgresStore& operator=(const PostgresStore&) = delete;

  void claim(ClaimRequest request, Callback<ClaimResult> done) override;
  void complete(CompleteRequest request, Callback<FenceStatus> done) override;
  void fail(FailRequest request, Callback<FenceStatus> done) override;
  void release(Fence fence, Callback<FenceStatus> done) override;
  void abandon(AbandonRequest request, Callback<FenceStatus> done) override;
  /// A batch call's statements go out together, in one pipelined transaction (one round trip),
  /// never split between two; other queued operations may join it up to `max_batch`. Its items
  /// on one key run in their order.
  void claim_many(std::vector<ClaimRequest> requests, BatchCallback<ClaimResult> done) override;
  void complete_many(std::vector<CompleteRequest> requests, BatchCallback<FenceStatus> done) override;
  void fail_many(std::vector<FailRequest> requests, BatchCallback<FenceStatus> done) override;
  void release_many(std::vector<Fence> fences, BatchCallback<FenceStatus> done) override;
  void get(RecordId id, Callback<std::optional<Record>> done) override;
  /// Runs in a transaction of its own and skips rows other transactions hold, so reaping never
  /// makes a request wait.
  void purge_expired(TimePoint now, std::size_t limit, Callback<std::size_t> done) override;
  /// Succeeds when a connection answers and the schema is in place.
  void ping(Callback<Done> done) override;

  void list(ListQuery query, Callback<std::vector<Record>> done) override;
  void mark_retryable(RecordId id, TimePoint now, Callback<AdminStatus> done) override;
  void resolve(RecordId id, StoredResponse response, TimePoint now, TimePoint expires,
               Callback<AdminStatus> done) override;
  void count(TimePoint now, Callback<StateCounts> done) override;

  /// Completes a record together with the application's own writes, atomically (SPEC §4.4): in
  /// one transaction, locks the record (SELECT ... FOR UPDATE) and checks the fence — reporting
  /// FenceStatus::lost without running `work` if the caller no longer holds it — then runs
  /// `work`, then the completion, then commits. If `work` returns false or throws, everything
  /// rolls back and the result is an error: the error of the statement that failed, if one did
  /// (e.g. a retryable timeout), otherwise StoreErrc::internal with `work`'s message.
  void complete_in_transaction(CompleteRequest request, PostgresWork work, Callback<FenceStatus> done);

  /// Blocking form of complete_in_transaction, for threads that may wait. Calling it from a
  /// store callback fails with StoreErrc::internal instead of deadlocking.
  StoreResult<FenceStatus> complete_in_transaction(CompleteRequest request, PostgresWork work);

  /// complete_in_transaction for many records in one transaction: locks every item's record (in
  /// (tenant, key) order, so two such transactions never deadlock on each other), then for each
  /// item in order opens a savepoint, runs its work and its completion, and commits them all at
  /// the end. An item whose fence is lost reports WorkStatus::lost without running its work; one
  /// whose work returns false, throws or has a statement fail is rolled back to its savepoint and
  /// reports WorkStatus::declined with the statement's error (if one failed) and the work's
  /// message; one whose completion then finds the fence gone (its work took the record) is
  /// rolled back and lost; one whose completion fails reports that error. The others commit
  /// together. When the transaction as a whole fails (the connection, the commit), every item
  /// fails with that error, in doubt for the items that would have committed when the COMMIT
  /// may have happened. Works follow PostgresWork's rules; each runs with the transaction's
  /// handle, so its statements take round trips of their own.
  void complete_many_in_transaction(std::vector<PostgresWorkItem> items, BatchCallback<WorkResult> done);

  /// Blocking form of complete_many_in_transaction, for threads that may wait. Calling it from a
  /// store callback fails every item with StoreErrc::internal instead of deadlocking.
  BatchResults<WorkResult> complete_many_in_transaction(std::vector<PostgresWorkItem> items);

  /// Counters since open.
  PostgresStoreStats stats() const;

  /// The schema version this build writes (see the idem_schema_version table).
  static int schema_version();

 private:
  class Impl;  // the queue, the connection threads and the reaper (postgres_store.cpp)
  explicit PostgresStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
