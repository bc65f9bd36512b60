#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "idem/clock.hpp"
#include "idem/store.hpp"
#include "idem/store_admin.hpp"

struct sqlite3;  // the application's SQL in complete_in_transaction runs on this handle

namespace idem {

/// How hard SQLite pushes each commit to the disk (PRAGMA synchronous, in WAL mode).
enum class SqliteSynchronous : std::uint8_t {
  off,     ///< no fsync: a power loss may lose or corrupt recent commits; a process crash does not
  normal,  ///< fsync at checkpoints only: a power loss may lose the last commits, never corrupts
  full,    ///< fsync of the WAL at every commit: committed means durable
  extra,   ///< full, plus an fsync of the directory
};

/// Everything SqliteStore::open needs; defaults are for production.
struct SqliteOptions {
  /// The database file, created if missing (with its -wal and -shm companions beside it).
  /// Processes on one machine may share it; network filesystems are not supported (SQLite's
  /// locks do not work there).
  std::string path;
  /// Durability of each commit; `full` so that an answered write survives a power loss.
  SqliteSynchronous synchronous = SqliteSynchronous::full;
  /// How long a transaction waits for another process's write lock before its operations fail
  /// with StoreErrc::unavailable.
  Millis busy_timeout{5000};
  /// The most operations the writer commits in one transaction (group commit). Larger batches
  /// mean fewer fsyncs under load, and a longer wait for the first operation of a batch.
  std::size_t max_batch = 256;
  /// WAL pages after which a commit copies the WAL back into the database file (SQLite's
  /// wal_autocheckpoint; SQLite's own default is 1000). Idempotency keys are random, so each
  /// operation dirties a page of the key index far from the last one: a larger WAL rewrites a
  /// page that many operations touched once per checkpoint instead of once per few operations.
  /// 16384 pages is a WAL of up to 64 MiB, truncated back to that after each checkpoint. The
  /// writer runs each checkpoint, so a larger value also means a longer pause now and then
  /// (docs/stores.md: p99 27-67 ms against 18-24 ms with 1000, under a 64-connection load).
  int wal_autocheckpoint = 16384;
  /// How often the background reaper deletes expired records; zero (the default) runs no reaper,
  /// leaving purge_expired to the caller (e.g. `idemctl purge` from cron).
  Millis reaper_interval{0};
  /// Records the reaper deletes per transaction; it repeats until fewer than this remain.
  std::size_t reaper_batch = 1000;
  /// The reaper's "now"; the system clock when null. Must outlive the store.
  const Clock* clock = nullptr;
};

/// What the store has done since it opened; for tests, benchmarks and metrics.
struct SqliteStoreStats {
  std::uint64_t operations = 0;           ///< operations the writer executed
  std::uint64_t transactions = 0;         ///< transactions the writer began (one per batch, or per purge)
  std::uint64_t write_transactions = 0;   ///< of those, write transactions committed (one fsync each)
  std::uint64_t largest_batch = 0;        ///< most operations in one transaction
  std::uint64_t failed_transactions = 0;  ///< transactions that could not begin or commit
  std::uint64_t reaped = 0;               ///< records the background reaper deleted
  std::uint64_t reaper_batches = 0;       ///< reaper transactions that deleted at least one record
};

/// The application's part of a transactional completion (SPEC §4.4): runs its own SQL on `db`,
/// inside the store's open transaction. Returns false (with `error` set) to roll everything of
/// this completion back. It runs on the store's writer thread, so it must not call the store,
/// must not BEGIN, COMMIT, ROLLBACK or RELEASE anything it did not open itself, should finalize
/// or reset its statements, and should be quick: the writer waits for it.
using SqliteWork = std::move_only_function<bool(sqlite3* db, std::string& error)>;

/// One item of SqliteStore::complete_many_in_transaction: a completion and the application's work
/// that commits with it.
struct SqliteWorkItem {
  CompleteRequest request;
  SqliteWork work;
};

/// The embedded, durable store (SPEC §6): one SQLite file in WAL mode, shared safely by the
/// threads of this process and by other processes on the same machine.
///
/// Every operation is queued to one writer thread, which runs up to `max_batch` queued
/// operations in one transaction (each in its own savepoint, so one failure undoes only its own
/// operation), commits once (one fsync for the batch), then calls their callbacks. Callbacks
/// therefore run on the writer thread, with no lock held; they may call the store again, but
/// must not block on it nor throw. A failed commit reports its error to every operation of the
/// batch, with `in_doubt` set for writes that may have reached the disk anyway.
class SqliteStore final : public Store, public StoreAdmin {
 public:
  /// Opens (creating and migrating as needed) the database and starts the writer and, if
  /// configured, the reaper. Fails with StoreErrc::corrupt for a file that is not a database or
  /// whose schema is newer than this build, and unavailable when it cannot be opened or locked.
  static StoreResult<std::unique_ptr<SqliteStore>> open(SqliteOptions options);

  /// Finishes every queued operation, stops the threads and closes the database.
  ~SqliteStore() override;

  SqliteStore(const SqliteStore&) = delete;
  SqliteStore& operator=(const SqliteStore&) = delete;

  void claim(ClaimRequest request, Callback<ClaimResult> done) override;
  void complete(CompleteRequest request, Callback<FenceStatus> done) override;
  void fail(FailRequest request, Callback<FenceStatus> done) override;
  void release(Fence fence, Callback<FenceStatus> done) override;
  void abandon(AbandonRequest request, Callback<FenceStatus> done) override;
  /// A batch call is one operation of the writer: all of its items run in one transaction (the
  /// one its group commit is in, never split between two), in order, each in a savepoint of its
  /// own, then commit together with one fsync.
  void claim_many(std::vector<ClaimRequest> requests, BatchCallback<ClaimResult> done) override;
  void complete_many(std::vector<CompleteRequest> requests, BatchCallback<FenceStatus> done) override;
  void fail_many(std::vector<FailRequest> requests, BatchCallback<FenceStatus> done) override;
  void release_many(std::vector<Fence> fences, BatchCallback<FenceStatus> done) override;
  /// A read: never waits for another process's write lock (WAL), unless batched with writes.
  void get(RecordId id, Callback<std::optional<Record>> done) override;
  /// Runs in a transaction of its own, so reaping never makes a batch of requests wait long.
  void purge_expired(TimePoint now, std::size_t limit, Callback<std::size_t> done) override;
  /// Succeeds when the writer can take the database's write lock within busy_timeout.
  void ping(Callback<Done> done) override;

  // StoreAdmin (idemctl). list and count are reads; mark_retryable and resolve are queued like
  // any write.
  void list(ListQuery query, Callback<std::vector<Record>> done) override;
  void mark_retryable(RecordId id, TimePoint now, Callback<AdminStatus> done) override;
  void resolve(RecordId id, StoredResponse response, TimePoint now, TimePoint expires,
               Callback<AdminStatus> done) override;
  void count(TimePoint now, Callback<StateCounts> done) override;

  /// Completes a record together with the application's own writes, atomically (SPEC §4.4).
  /// If the caller no longer holds the record, reports FenceStatus::lost without running `work`.
  /// Otherwise runs `work`, then the fenced completion; the two commit together or not at all.
  /// If `work` returns false or throws, nothing of either is kept and the result is an error
  /// (StoreErrc::internal, not retryable) carrying `work`'s message.
  void complete_in_transaction(CompleteRequest request, SqliteWork work, Callback<FenceStatus> done);

  /// Blocking form of complete_in_transaction, for threads that may wait. Calling it from a
  /// store callback (the writer thread) fails with StoreErrc::internal instead of deadlocking.
  StoreResult<FenceStatus> complete_in_transaction(CompleteRequest request, SqliteWork work);

  /// complete_in_transaction for many records in one transaction (one writer operation, one
  /// commit, never split between two): each item in a savepoint of its own, in order. An item
  /// whose fence is lost reports WorkStatus::lost without running its work; one whose work returns
  /// false or throws is rolled back to its savepoint (its writes and its completion) and reports
  /// WorkStatus::declined with the work's message; one whose completion finds the fence gone
  /// (its work took the record) is rolled back and lost. The others commit together. When the
  /// transaction cannot begin or commit, every item fails with that error (in doubt, for items
  /// that wrote, when the commit may have reached the disk), as complete_in_transaction's do.
  /// Works follow SqliteWork's rules; each runs with the writer's connection.
  void complete_many_in_transaction(std::vector<SqliteWorkItem> items, BatchCallback<WorkResult> done);

  /// Blocking form of complete_many_in_transaction, for threads that may wait. Calling it from a
  /// store callback (the writer thread) fails every item with StoreErrc::internal instead of
  /// deadlocking.
  BatchResults<WorkResult> complete_many_in_transaction(std::vector<SqliteWorkItem> items);

  /// Counters since open.
  SqliteStoreStats stats() const;

  /// The schema version this build writes (see the idem_schema_version table).
  static int schema_version();

 private:
  class Impl;  // the writer, its queue and the connection (sqlite_store.cpp)
  explicit SqliteStore(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Call first thing in main(), before anything in the process uses SQLite. It turns off SQLite's
/// memory statistics, which otherwise take one process-wide mutex on every allocation (the
/// store's writer thread and the application's own connections contend on it: in the payments
/// example it cost a third of the CPU per payment), and keeps statement journals in memory up to
/// 127 KiB, in one allocation, instead of SQLite's 64 KiB, past which they go to a temporary file
/// (every write in the store's group commit keeps one; docs/benchmarks.md measures both). Freed
/// journal blocks are kept for reuse by wrapping SQLite's allocator (up to four, ~520 KiB; other
/// allocations untouched): handed back to glibc they made some processes trim and refault their
/// heap at every savepoint, three times slower. Returns false and changes nothing once SQLite is
/// initialized (a second call, or SQLite used first): harmless, only slower.
bool sqlite_configure_process();

/// What the store sets on its own connections, for the application's (call after opening one):
/// nothing after sqlite_configure_process, else PRAGMA temp_store = MEMORY, which keeps statement
/// journals off the disk in smaller pieces. Returns SQLite's result code.
int sqlite_configure_connection(sqlite3* db);

}  // namespace idem
