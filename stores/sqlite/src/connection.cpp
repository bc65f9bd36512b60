#include "connection.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "journal_block_cache.hpp"

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

namespace {
// Bytes a savepoint's or a statement's journal holds in memory, in one allocation of this size,
// before it moves to a file. Below 128 KiB: SQLite 3.40's unix VFS writes at most 128 KiB - 1
// bytes at once, so a larger in-memory journal cannot be moved to its file (the write fails with
// SQLITE_FULL; the statement journal test shows it).
constexpr int kStatementJournalSpillBytes = 127 << 10;

std::atomic<bool> statement_journal_spill_configured{false};
}  // namespace

void configure_statement_journal_spill() {
  if (sqlite3_config(SQLITE_CONFIG_STMTJRNL_SPILL, kStatementJournalSpillBytes) == SQLITE_OK) {
    statement_journal_spill_configured.store(true, std::memory_order_release);
    // One block of that size per savepoint, thousands a second: kept for reuse rather than freed,
    // or glibc may give its pages back and fault them in again every time (journal_block_cache.cpp).
    install_journal_block_cache(kStatementJournalSpillBytes);
  }
}

// Every write in the store's group commit runs in a savepoint of its own, so each page it touches
// is first copied into the connection's statement journal ("sub-journal"), kept until the
// savepoint is released. Where that copy goes decides much of a write's cost:
// - SQLite's default keeps it in memory up to 64 KiB, in one 64 KiB allocation, then moves it to a
//   /var/tmp file. A payment with its outbox row passed 64 KiB: about 11 file writes per payment,
//   the outbox then cost 45 % of payments/s (docs/benchmarks.md).
// - temp_store = MEMORY keeps it in memory without limit, but in chunks of 1 KiB: every 4 KiB page
//   is five allocations, and five frees at the release. About 10k instructions per payment, a
//   fifth of what the outbox row costs.
// - sqlite_configure_process raises the threshold to kStatementJournalSpillBytes (127 KiB): one
//   allocation per savepoint (reused from one savepoint to the next: journal_block_cache.cpp), no
//   file unless a single write copies more. A payment with its outbox row copies up to about
//   90 KiB (strace, payments benchmark: with 64 KiB 110 of 5,466 payments made a file, with
//   88 KiB 3 of 8,883, with 120 KiB none of 11,444). Then temp_store stays at its default, which
//   is what makes SQLite use the threshold.
// The threshold is process-wide and settable only before SQLite's first use, hence the fallback.
int configure_connection(sqlite3* db) {
  if (statement_journal_spill_configured.load(std::memory_order_acquire)) return SQLITE_OK;
  return sqlite3_exec(db, "PRAGMA temp_store = MEMORY", nullptr, nullptr, nullptr);
}

StoreResult<Connection> open_connection(const std::string& path, int busy_timeout_ms, bool create) {
  sqlite3* raw = nullptr;
  const int flags = SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0) | SQLITE_OPEN_NOMUTEX;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, flags, nullptr);
  Connection db(raw);  // closes even a half-opened handle
  if (rc != SQLITE_OK) return std::unexpected(map_error(rc, "open " + path, db.get()));
  sqlite3_extended_result_codes(db.get(), 1);
  sqlite3_busy_timeout(db.get(), busy_timeout_ms);
  if (const int t = configure_connection(db.get()); t != SQLITE_OK) {
    return std::unexpected(map_error(t, "set temp_store", db.get()));
  }
  return db;
}

StoreResult<Done> enable_wal(sqlite3* db, const std::string& path, int busy_timeout_ms) {
  auto wal = Statement::prepare(db, "PRAGMA journal_mode = WAL");
  if (!wal) return std::unexpected(wal.error());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(busy_timeout_ms);
  auto pause = std::chrono::milliseconds(1);
  int rc = wal->step();
  while ((rc & 0xff) == SQLITE_BUSY && std::chrono::steady_clock::now() < deadline) {
    wal->reset();
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::milliseconds(50));
    rc = wal->step();
  }
  if (rc != SQLITE_ROW) return std::unexpected(map_error(rc, "enable WAL", db));
  if (const auto mode = wal->text(0); mode != "wal") {
    return std::unexpected(StoreError{StoreErrc::unavailable, "sqlite: " + path +
                                                                  ": cannot use WAL mode (journal_mode is " +
                                                                  std::string(mode) + ")"});
  }
  return Done{};
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
