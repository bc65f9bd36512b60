#include "connection.hpp"

namespace idem::sqlite_detail {

StoreError map_error(int code, std::string_view what, sqlite3* db) {
  StoreError error;
  switch (code & 0xff) {
    // Another writer (maybe another process) held the lock past busy_timeout: try again later.
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_PROTOCOL:  // lost a race on the WAL's locks; transient by SQLite's own account
      error.code = StoreErrc::unavailable;
      break;
    // The disk or the file is the problem, not the data: an operator can fix it, then retry.
    case SQLITE_IOERR:
    case SQLITE_FULL:
    case SQLITE_CANTOPEN:
      error.code = StoreErrc::unavailable;
      break;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      error.code = StoreErrc::corrupt;
      break;
    default:
      error.code = StoreErrc::internal;
      break;
  }
  const char* detail = db ? sqlite3_errmsg(db) : sqlite3_errstr(code);
  error.message = "sqlite: " + std::string(what) + ": " + detail + " (code " + std::to_string(code) + ")";
  return error;
}

StoreResult<Connection> open_connection(const std::string& path, int busy_timeout_ms, bool create) {
  sqlite3* raw = nullptr;
  const int flags = SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0) | SQLITE_OPEN_NOMUTEX;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, flags, nullptr);
  Connection db(raw);  // closes even a half-opened handle
  if (rc != SQLITE_OK) return std::unexpected(map_error(rc, "open " + path, db.get()));
  sqlite3_extended_result_codes(db.get(), 1);
  sqlite3_busy_timeout(db.get(), busy_timeout_ms);
  // Statement journals (and temporary b-trees) in memory: a statement that may abort halfway
  // inside a transaction — the outbox's INSERT, which writes a row and several indexes and can
  // still fail on its unique message id or its triggers — keeps one, and on disk it spilled to a
  // /var/tmp file past 64 KiB of a group-commit transaction: about 11 writes per payment that made
  // the outbox cost 45 % of payments/s (docs/benchmarks.md). They hold what one transaction's
  // statements touched, and are never needed after a crash.
  if (const int t = sqlite3_exec(db.get(), "PRAGMA temp_store = MEMORY", nullptr, nullptr, nullptr); t != SQLITE_OK) {
    return std::unexpected(map_error(t, "set temp_store", db.get()));
  }
  return db;
}

StoreResult<Done> exec(sqlite3* db, const char* sql, std::string_view what) {
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) return std::unexpected(map_error(rc, what, db));
  return Done{};
}

StoreResult<Statement> Statement::prepare(sqlite3* db, std::string_view sql) {
  sqlite3_stmt* stmt = nullptr;
  const int rc =
      sqlite3_prepare_v3(db, sql.data(), static_cast<int>(sql.size()), SQLITE_PREPARE_PERSISTENT, &stmt, nullptr);
  if (rc != SQLITE_OK) {
    sqlite3_finalize(stmt);
    return std::unexpected(map_error(rc, "prepare \"" + std::string(sql) + "\"", db));
  }
  return Statement(stmt);
}

StoreResult<Done> Statement::run(std::string_view what) {
  ResetOnExit reset(*this);
  const int rc = step();
  if (rc != SQLITE_DONE && rc != SQLITE_ROW) return std::unexpected(map_error(rc, what, sqlite3_db_handle(stmt_)));
  return Done{};
}

}  // namespace idem::sqlite_detail
