#pragma once

// What SqliteStore's writer thread runs: the SQL of every store operation, prepared once, and
// the operations themselves, each run inside the writer's transaction (sqlite_store.cpp batches
// them and commits). Split from sqlite_store.cpp, which keeps the writer, its batching and the
// public class.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "connection.hpp"
#include "idem/sqlite_store.hpp"
#include "idem/store.hpp"
#include "idem/store_admin.hpp"

namespace idem::sqlite_detail {

/// SQLite integers are signed; the token's 64 bits are stored as they are.
inline std::int64_t token_to_db(std::uint64_t token) { return static_cast<std::int64_t>(token); }
inline std::uint64_t token_from_db(std::int64_t value) { return static_cast<std::uint64_t>(value); }

inline StoreError internal_error(std::string message) { return StoreError{StoreErrc::internal, std::move(message)}; }

/// Every statement the writer runs, prepared once at open.
struct Statements {
  Statement begin_immediate, begin_deferred, commit, rollback;
  Statement savepoint, release_savepoint, rollback_to_savepoint;
  Statement select_record, insert_claim, takeover, complete, fail, release, abandon, check_fence, purge, ping;
  Statement admin_mark_retryable, admin_resolve, admin_count;
  /// SqliteOutbox::enqueue's INSERT, prepared by the first enqueue inside complete_in_transaction's
  /// work (writer_transaction.hpp), not here: the store never enqueues itself.
  Statement outbox_insert;
};

/// Prepares every statement on `db` (whose schema is up to date).
StoreResult<Statements> prepare_statements(sqlite3* db);

/// The connection and its statements, as operations see them (on the writer thread only).
struct Db {
  sqlite3* raw;
  Statements& st;
};

/// What an operation did inside its savepoint, beyond its result.
struct Effects {
  bool wrote = false;     ///< it changed the database, so its answer depends on the commit
  bool rollback = false;  ///< its savepoint must be undone although it produced an answer
};

namespace ops {

StoreResult<std::optional<Record>> read_record(Db& db, const RecordId& id);
StoreResult<ClaimResult> run_claim(Db& db, const ClaimRequest& req, Effects& fx);
StoreResult<FenceStatus> run_complete(Db& db, const CompleteRequest& req, Effects& fx);
StoreResult<FenceStatus> run_fail(Db& db, const FailRequest& req, Effects& fx);
StoreResult<FenceStatus> run_release(Db& db, const Fence& fence, Effects& fx);
StoreResult<FenceStatus> run_abandon(Db& db, const AbandonRequest& req, Effects& fx);
StoreResult<std::size_t> run_purge(Db& db, TimePoint now, std::size_t limit, Effects& fx);
StoreResult<Done> run_ping(Db& db);
/// Checks the fence, runs `work`, completes; a lost fence or a failed `work` changes nothing.
StoreResult<FenceStatus> run_complete_in_transaction(Db& db, const CompleteRequest& req, SqliteWork& work,
                                                     Effects& fx);
/// One item of complete_many_in_transaction, inside its own savepoint: checks the fence, runs
/// the work, completes. Sets fx.rollback when the savepoint must be undone (declined, lost).
StoreResult<WorkResult> run_work_item(Db& db, SqliteWorkItem& item, Effects& fx);

// Operator actions (StoreAdmin).
StoreResult<std::vector<Record>> run_list(Db& db, const ListQuery& query);
StoreResult<AdminStatus> run_mark_retryable(Db& db, const RecordId& id, TimePoint now, Effects& fx);
StoreResult<AdminStatus> run_resolve(Db& db, const RecordId& id, const StoredResponse& response, TimePoint now,
                                     TimePoint expires, Effects& fx);
StoreResult<StateCounts> run_count(Db& db, TimePoint now);

}  // namespace ops
}  // namespace idem::sqlite_detail
