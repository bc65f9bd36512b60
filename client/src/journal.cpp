#include "idem/client/journal.hpp"

#include <fcntl.h>
#include <sqlite3.h>
#include <unistd.h>

#include <mutex>
#include <utility>

#include "netstring.hpp"

namespace idem::client {
namespace {

constexpr int kSchemaVersion = 1;
constexpr int kBusyTimeoutMs = 5000;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS pending (
  key        TEXT PRIMARY KEY NOT NULL,
  method     TEXT NOT NULL,
  url        TEXT NOT NULL,
  headers    BLOB NOT NULL,    -- netstrings: name, value, name, value, ...
  body       BLOB NOT NULL,
  attempts   INTEGER NOT NULL,
  created_ms INTEGER NOT NULL  -- Unix epoch milliseconds
);
CREATE TABLE IF NOT EXISTS dead_letters (
  key          TEXT PRIMARY KEY NOT NULL,
  method       TEXT NOT NULL,
  url          TEXT NOT NULL,
  headers      BLOB NOT NULL,
  body         BLOB NOT NULL,
  attempts     INTEGER NOT NULL,
  created_ms   INTEGER NOT NULL,
  failed_ms    INTEGER NOT NULL,
  reason       TEXT NOT NULL,
  last_status  INTEGER,          -- NULL when no answer ever came
  last_headers BLOB,
  last_body    BLOB,
  last_error   TEXT NOT NULL DEFAULT ''
);
)sql";

std::unexpected<JournalError> storage_error(std::string_view what, sqlite3* db, int rc) {
  std::string message = "journal: " + std::string(what) + ": ";
  message += db ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
  message += " (code " + std::to_string(rc) + ")";
  return std::unexpected(JournalError{JournalErrc::storage, std::move(message)});
}

std::unexpected<JournalError> not_found(std::string_view where, std::string_view key) {
  return std::unexpected(
      JournalError{JournalErrc::not_found, "journal: no " + std::string(where) + " with key " + std::string(key)});
}

struct CloseDb {
  void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
};
using Db = std::unique_ptr<sqlite3, CloseDb>;

// One prepared statement; binds are SQLITE_TRANSIENT so callers need not keep the bytes alive.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); }
  ~Stmt() { sqlite3_finalize(stmt_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;

  bool ok() const { return rc_ == SQLITE_OK; }
  int prepare_rc() const { return rc_; }

  Stmt& bind(int i, std::int64_t v) {
    sqlite3_bind_int64(stmt_, i, v);
    return *this;
  }
  Stmt& text(int i, std::string_view v) {
    sqlite3_bind_text64(stmt_, i, v.data() ? v.data() : "", v.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
    return *this;
  }
  Stmt& blob(int i, std::string_view v) {
    sqlite3_bind_blob64(stmt_, i, v.data() ? v.data() : "", v.size(), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& null(int i) {
    sqlite3_bind_null(stmt_, i);
    return *this;
  }

  int step() { return sqlite3_step(stmt_); }

  bool is_null(int i) const { return sqlite3_column_type(stmt_, i) == SQLITE_NULL; }
  std::int64_t int64(int i) const { return sqlite3_column_int64(stmt_, i); }
  std::string str(int i) const {
    const void* p = sqlite3_column_blob(stmt_, i);
    const int n = sqlite3_column_bytes(stmt_, i);
    return p ? std::string(static_cast<const char*>(p), static_cast<std::size_t>(n)) : std::string();
  }

 private:
  sqlite3_stmt* stmt_ = nullptr;
  int rc_ = SQLITE_OK;
};

// Rolls back unless committed, so every early return leaves the file as it was.
class Transaction {
 public:
  explicit Transaction(sqlite3* db) : db_(db) {}
  ~Transaction() {
    if (open_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  int begin() {
    const int rc = sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
    open_ = rc == SQLITE_OK;
    return rc;
  }
  int commit() {
    const int rc = sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
    if (rc == SQLITE_OK) open_ = false;
    return rc;
  }

 private:
  sqlite3* db_;
  bool open_ = false;
};

// Columns 0..6 of both tables: key, method, url, headers, body, attempts, created_ms.
JournalResult<Operation> read_operation(const Stmt& s) {
  Operation op;
  op.key = s.str(0);
  op.request.method = s.str(1);
  op.request.url = s.str(2);
  auto headers = detail::decode_headers(s.str(3));
  if (!headers) {
    return std::unexpected(JournalError{JournalErrc::storage, "journal: unreadable headers of key " + op.key});
  }
  op.request.headers = std::move(*headers);
  op.request.body = s.str(4);
  op.attempts = static_cast<int>(s.int64(5));
  op.created = from_epoch_ms(s.int64(6));
  return op;
}

}  // namespace

struct Journal::Impl {
  Db db;
  std::mutex mutex;  // one connection, one caller at a time

  // Runs a statement that returns no rows.
  JournalResult<void> run(Stmt& s, std::string_view what) {
    if (!s.ok()) return storage_error(what, db.get(), s.prepare_rc());
    const int rc = s.step();
    if (rc != SQLITE_DONE && rc != SQLITE_ROW) return storage_error(what, db.get(), rc);
    return {};
  }

  JournalResult<void> exec(const char* sql, std::string_view what) {
    const int rc = sqlite3_exec(db.get(), sql, nullptr, nullptr, nullptr);
    if (rc != SQLITE_OK) return storage_error(what, db.get(), rc);
    return {};
  }
};

Journal::Journal(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Journal::~Journal() = default;

JournalResult<std::unique_ptr<Journal>> Journal::open(const std::string& path) {
  // Requests may carry personal data: create the file private to its owner (SQLite gives the
  // -wal and -shm files the same mode).
  if (!path.empty() && path != ":memory:" && !path.starts_with("file:")) {
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) {
      return std::unexpected(JournalError{JournalErrc::storage, "journal: cannot open " + path});
    }
    ::close(fd);
  }
  sqlite3* raw = nullptr;
  const int flags = SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX | SQLITE_OPEN_URI;
  const int rc = sqlite3_open_v2(path.c_str(), &raw, flags, nullptr);
  Db db(raw);
  if (rc != SQLITE_OK) return storage_error("open " + path, db.get(), rc);
  sqlite3_extended_result_codes(db.get(), 1);
  sqlite3_busy_timeout(db.get(), kBusyTimeoutMs);

  auto impl = std::make_unique<Impl>();
  impl->db = std::move(db);
  // WAL + synchronous=FULL: a commit is on disk when it returns, power loss included.
  if (auto r = impl->exec("PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;", "set durability"); !r) {
    return std::unexpected(r.error());
  }
  {
    Stmt version(impl->db.get(), "PRAGMA user_version");
    if (!version.ok() || version.step() != SQLITE_ROW) {
      return storage_error("read schema version", impl->db.get(), version.prepare_rc());
    }
    if (version.int64(0) > kSchemaVersion) {
      return std::unexpected(JournalError{
          JournalErrc::storage, "journal: " + path + " was written by a newer idem (schema version " +
                                    std::to_string(version.int64(0)) + ")"});
    }
  }
  if (auto r = impl->exec(kSchema, "create schema"); !r) return std::unexpected(r.error());
  if (auto r = impl->exec("PRAGMA user_version = 1", "set schema version"); !r) return std::unexpected(r.error());
  return std::unique_ptr<Journal>(new Journal(std::move(impl)));
}

JournalResult<void> Journal::begin(const Operation& operation) {
  std::lock_guard lock(impl_->mutex);
  sqlite3* db = impl_->db.get();
  Transaction tx(db);
  if (const int rc = tx.begin(); rc != SQLITE_OK) return storage_error("begin", db, rc);
  Stmt insert(db,
              "INSERT INTO pending (key, method, url, headers, body, attempts, created_ms) "
              "VALUES (?1, ?2, ?3, ?4, ?5, 1, ?6) "
              "ON CONFLICT (key) DO UPDATE SET method = excluded.method, url = excluded.url, "
              "headers = excluded.headers, body = excluded.body, attempts = attempts + 1");
  insert.text(1, operation.key)
      .text(2, operation.request.method)
      .text(3, operation.request.url)
      .blob(4, detail::encode_headers(operation.request.headers))
      .blob(5, operation.request.body)
      .bind(6, to_epoch_ms(operation.created));
  if (auto r = impl_->run(insert, "record operation"); !r) return r;
  // Sent again by the caller: it is no longer given up on.
  Stmt unbury(db, "DELETE FROM dead_letters WHERE key = ?1");
  unbury.text(1, operation.key);
  if (auto r = impl_->run(unbury, "record operation"); !r) return r;
  if (const int rc = tx.commit(); rc != SQLITE_OK) return storage_error("commit", db, rc);
  return {};
}

JournalResult<void> Journal::count_attempt(std::string_view key) {
  std::lock_guard lock(impl_->mutex);
  Stmt s(impl_->db.get(), "UPDATE pending SET attempts = attempts + 1 WHERE key = ?1");
  s.text(1, key);
  return impl_->run(s, "count attempt");
}

JournalResult<void> Journal::complete(std::string_view key) {
  std::lock_guard lock(impl_->mutex);
  Stmt s(impl_->db.get(), "DELETE FROM pending WHERE key = ?1");
  s.text(1, key);
  return impl_->run(s, "complete operation");
}

JournalResult<void> Journal::bury(const DeadLetter& letter) {
  std::lock_guard lock(impl_->mutex);
  sqlite3* db = impl_->db.get();
  const Operation& op = letter.operation;
  Transaction tx(db);
  if (const int rc = tx.begin(); rc != SQLITE_OK) return storage_error("begin", db, rc);
  // The pending row knows the attempts of earlier runs and when the operation began.
  Stmt insert(db,
              "INSERT OR REPLACE INTO dead_letters (key, method, url, headers, body, attempts, created_ms, "
              "failed_ms, reason, last_status, last_headers, last_body, last_error) "
              "VALUES (?1, ?2, ?3, ?4, ?5, "
              "COALESCE((SELECT attempts FROM pending WHERE key = ?1), ?6), "
              "COALESCE((SELECT created_ms FROM pending WHERE key = ?1), ?7), "
              "?8, ?9, ?10, ?11, ?12, ?13)");
  insert.text(1, op.key)
      .text(2, op.request.method)
      .text(3, op.request.url)
      .blob(4, detail::encode_headers(op.request.headers))
      .blob(5, op.request.body)
      .bind(6, op.attempts)
      .bind(7, to_epoch_ms(op.created))
      .bind(8, to_epoch_ms(letter.failed))
      .text(9, letter.reason)
      .text(13, letter.last_error);
  if (letter.last_response) {
    insert.bind(10, letter.last_response->status)
        .blob(11, detail::encode_headers(letter.last_response->headers))
        .blob(12, letter.last_response->body);
  } else {
    insert.null(10).null(11).null(12);
  }
  if (auto r = impl_->run(insert, "bury operation"); !r) return r;
  Stmt remove(db, "DELETE FROM pending WHERE key = ?1");
  remove.text(1, op.key);
  if (auto r = impl_->run(remove, "bury operation"); !r) return r;
  if (const int rc = tx.commit(); rc != SQLITE_OK) return storage_error("commit", db, rc);
  return {};
}

JournalResult<std::vector<Operation>> Journal::pending() {
  std::lock_guard lock(impl_->mutex);
  sqlite3* db = impl_->db.get();
  Stmt s(db, "SELECT key, method, url, headers, body, attempts, created_ms FROM pending ORDER BY created_ms, rowid");
  if (!s.ok()) return storage_error("list pending", db, s.prepare_rc());
  std::vector<Operation> out;
  int rc;
  while ((rc = s.step()) == SQLITE_ROW) {
    auto op = read_operation(s);
    if (!op) return std::unexpected(op.error());
    out.push_back(std::move(*op));
  }
  if (rc != SQLITE_DONE) return storage_error("list pending", db, rc);
  return out;
}

JournalResult<std::vector<DeadLetter>> Journal::dead_letters() {
  std::lock_guard lock(impl_->mutex);
  sqlite3* db = impl_->db.get();
  Stmt s(db,
         "SELECT key, method, url, headers, body, attempts, created_ms, failed_ms, reason, last_status, "
         "last_headers, last_body, last_error FROM dead_letters ORDER BY failed_ms, rowid");
  if (!s.ok()) return storage_error("list dead letters", db, s.prepare_rc());
  std::vector<DeadLetter> out;
  int rc;
  while ((rc = s.step()) == SQLITE_ROW) {
    auto op = read_operation(s);
    if (!op) return std::unexpected(op.error());
    DeadLetter letter;
    letter.operation = std::move(*op);
    letter.failed = from_epoch_ms(s.int64(7));
    letter.reason = s.str(8);
    if (!s.is_null(9)) {
      HttpResponse response;
      response.status = static_cast<int>(s.int64(9));
      auto headers = detail::decode_headers(s.str(10));
      if (!headers) {
        return std::unexpected(
            JournalError{JournalErrc::storage, "journal: unreadable answer headers of key " + letter.operation.key});
      }
      response.headers = std::move(*headers);
      response.body = s.str(11);
      letter.last_response = std::move(response);
    }
    letter.last_error = s.str(12);
    out.push_back(std::move(letter));
  }
  if (rc != SQLITE_DONE) return storage_error("list dead letters", db, rc);
  return out;
}

JournalResult<Operation> Journal::revive(std::string_view key) {
  std::lock_guard lock(impl_->mutex);
  sqlite3* db = impl_->db.get();
  Transaction tx(db);
  if (const int rc = tx.begin(); rc != SQLITE_OK) return storage_error("begin", db, rc);
  Stmt select(db,
              "SELECT key, method, url, headers, body, attempts, created_ms FROM dead_letters WHERE key = ?1");
  select.text(1, key);
  if (!select.ok()) return storage_error("revive", db, select.prepare_rc());
  const int rc = select.step();
  if (rc == SQLITE_DONE) return not_found("dead letter", key);
  if (rc != SQLITE_ROW) return storage_error("revive", db, rc);
  auto op = read_operation(select);
  if (!op) return std::unexpected(op.error());

  Stmt insert(db,
              "INSERT INTO pending (key, method, url, headers, body, attempts, created_ms) "
              "SELECT key, method, url, headers, body, attempts, created_ms FROM dead_letters WHERE key = ?1 "
              "ON CONFLICT (key) DO NOTHING");
  insert.text(1, key);
  if (auto r = impl_->run(insert, "revive"); !r) return std::unexpected(r.error());
  Stmt remove(db, "DELETE FROM dead_letters WHERE key = ?1");
  remove.text(1, key);
  if (auto r = impl_->run(remove, "revive"); !r) return std::unexpected(r.error());
  if (const int commit_rc = tx.commit(); commit_rc != SQLITE_OK) return storage_error("commit", db, commit_rc);
  return op;
}

JournalResult<void> Journal::drop_dead_letter(std::string_view key) {
  std::lock_guard lock(impl_->mutex);
  Stmt s(impl_->db.get(), "DELETE FROM dead_letters WHERE key = ?1");
  s.text(1, key);
  if (auto r = impl_->run(s, "drop dead letter"); !r) return r;
  if (sqlite3_changes(impl_->db.get()) == 0) return not_found("dead letter", key);
  return {};
}

JournalResult<void> Journal::drop_pending(std::string_view key) {
  std::lock_guard lock(impl_->mutex);
  Stmt s(impl_->db.get(), "DELETE FROM pending WHERE key = ?1");
  s.text(1, key);
  if (auto r = impl_->run(s, "drop pending operation"); !r) return r;
  if (sqlite3_changes(impl_->db.get()) == 0) return not_found("pending operation", key);
  return {};
}

}  // namespace idem::client
