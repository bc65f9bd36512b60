#pragma once

// The thin RAII layer over the SQLite C API. The only header of the module that includes
// sqlite3.h; nothing here is installed.

#include <sqlite3.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "idem/result.hpp"

namespace idem::sqlite_detail {

/// Maps an SQLite result code to a StoreError: the one place that decides which SQLite failures a
/// caller may retry. `what` says what was being done; `db` (optional) supplies SQLite's message.
StoreError map_error(int code, std::string_view what, sqlite3* db = nullptr);

/// Closes a connection when its owner goes away.
struct ConnectionCloser {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};

/// An open connection.
using Connection = std::unique_ptr<sqlite3, ConnectionCloser>;

/// Opens `path` read-write (creating it unless `create` is false), with extended result codes
/// and a busy timeout. The connection is used by one thread at a time, so SQLite's own mutex is
/// left out.
StoreResult<Connection> open_connection(const std::string& path, int busy_timeout_ms, bool create = true);

/// Puts the database in WAL mode (PRAGMA journal_mode = WAL), trying again for up to
/// `busy_timeout_ms` while another connection holds the lock the switch needs: processes that
/// open one new file at once each want that lock while holding a read lock, and SQLite answers
/// SQLITE_BUSY at once, without waiting, to all but one of them (no deadlock). `path` is for the
/// message of a database that cannot use WAL.
StoreResult<Done> enable_wal(sqlite3* db, const std::string& path, int busy_timeout_ms);

/// Raises SQLite's statement-journal spill threshold (process-wide, before SQLite's first use;
/// connection.cpp says why and to what) and records whether that took, for configure_connection.
void configure_statement_journal_spill();

/// Sets what every connection of the module gets beyond open_connection's flags: PRAGMA
/// temp_store = MEMORY, unless this process raised the statement-journal spill threshold
/// (connection.cpp says why). Returns SQLite's result code.
int configure_connection(sqlite3* db);

/// Runs one or more SQL statements that return no rows the caller needs.
StoreResult<Done> exec(sqlite3* db, const char* sql, std::string_view what);

/// A prepared statement, prepared once and reused (SQLITE_PREPARE_PERSISTENT).
class Statement {
 public:
  Statement() = default;
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;
  Statement(Statement&& other) noexcept : stmt_(std::exchange(other.stmt_, nullptr)) {}
  Statement& operator=(Statement&& other) noexcept {
    std::swap(stmt_, other.stmt_);
    return *this;
  }
  ~Statement() { sqlite3_finalize(stmt_); }

  /// Prepares `sql` on `db`.
  static StoreResult<Statement> prepare(sqlite3* db, std::string_view sql);

  // Bind by 1-based index. Text and blobs are bound SQLITE_STATIC: the bytes must outlive step().
  void bind(int index, std::int64_t value) { sqlite3_bind_int64(stmt_, index, value); }
  void bind_text(int index, std::string_view value) {
    sqlite3_bind_text64(stmt_, index, value.data() ? value.data() : "", value.size(), SQLITE_STATIC, SQLITE_UTF8);
  }
  void bind_blob(int index, std::string_view value) {
    sqlite3_bind_blob64(stmt_, index, value.data() ? value.data() : "", value.size(), SQLITE_STATIC);
  }
  void bind_null(int index) { sqlite3_bind_null(stmt_, index); }

  /// Steps once: SQLITE_ROW, SQLITE_DONE or an error code.
  int step() { return sqlite3_step(stmt_); }

  // Columns by 0-based index, valid until the next step() or reset().
  bool is_null(int index) const { return sqlite3_column_type(stmt_, index) == SQLITE_NULL; }
  std::int64_t int64(int index) const { return sqlite3_column_int64(stmt_, index); }
  std::string_view text(int index) const {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, index));
    return p ? std::string_view(p, static_cast<std::size_t>(sqlite3_column_bytes(stmt_, index))) : std::string_view{};
  }
  std::string_view blob(int index) const {
    const auto* p = static_cast<const char*>(sqlite3_column_blob(stmt_, index));
    return p ? std::string_view(p, static_cast<std::size_t>(sqlite3_column_bytes(stmt_, index))) : std::string_view{};
  }

  /// Rewinds the statement and drops its bindings, so it holds no lock and no caller memory.
  void reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }

  /// Runs a statement that returns no rows; the statement is reset afterwards.
  StoreResult<Done> run(std::string_view what);

  sqlite3_stmt* get() const { return stmt_; }

 private:
  explicit Statement(sqlite3_stmt* stmt) : stmt_(stmt) {}
  sqlite3_stmt* stmt_ = nullptr;
};

/// Resets a statement when a scope ends, whatever path leaves it.
class ResetOnExit {
 public:
  explicit ResetOnExit(Statement& statement) : statement_(statement) {}
  ResetOnExit(const ResetOnExit&) = delete;
  ResetOnExit& operator=(const ResetOnExit&) = delete;
  ~ResetOnExit() { statement_.reset(); }

 private:
  Statement& statement_;
};

}  // namespace idem::sqlite_detail
