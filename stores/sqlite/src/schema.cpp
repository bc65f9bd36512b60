#include "schema.hpp"

#include <span>
#include <string>

namespace idem::sqlite_detail {
namespace {

// The version lives in a table of its own rather than in PRAGMA user_version: in library mode
// the application keeps its own tables in the same file (SPEC §4.4) and may well version them
// with user_version.
constexpr const char* kVersionTable = R"sql(
  CREATE TABLE IF NOT EXISTS idem_schema_version (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    version INTEGER NOT NULL
  );
)sql";

struct Migration {
  int version;
  const char* sql;
};

// Append only: a released migration is never edited, a change is a new entry.
constexpr Migration kMigrations[] = {
    {1, R"sql(
      CREATE TABLE idempotency_keys (
        tenant_id        TEXT    NOT NULL,
        key              TEXT    NOT NULL,
        state            TEXT    NOT NULL
                                 CHECK (state IN ('in_progress', 'completed', 'failed_retryable')),
        request_hash     TEXT    NOT NULL,
        fencing_token    INTEGER NOT NULL,  -- the uint64 token's bits, as a signed 64-bit integer
        lease_expires_ms INTEGER NOT NULL,
        response_status  INTEGER,           -- set once completed
        response_headers BLOB,              -- headers_codec.hpp
        response_body    BLOB,
        created_ms       INTEGER NOT NULL,
        completed_ms     INTEGER,
        expires_ms       INTEGER NOT NULL,
        PRIMARY KEY (tenant_id, key)
      );
      CREATE INDEX idempotency_keys_expires ON idempotency_keys (expires_ms);
    )sql"},
};

}  // namespace

int latest_schema_version() { return std::span(kMigrations).back().version; }

StoreResult<int> read_schema_version(sqlite3* db) {
  auto exists = Statement::prepare(
      db, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'idem_schema_version'");
  if (!exists) return std::unexpected(exists.error());
  if (exists->step() != SQLITE_ROW) return std::unexpected(map_error(sqlite3_errcode(db), "read schema", db));
  if (exists->int64(0) == 0) return 0;
  auto select = Statement::prepare(db, "SELECT version FROM idem_schema_version WHERE id = 1");
  if (!select) return std::unexpected(select.error());
  const int rc = select->step();
  if (rc == SQLITE_DONE) return 0;
  if (rc != SQLITE_ROW) return std::unexpected(map_error(rc, "read schema version", db));
  return static_cast<int>(select->int64(0));
}

StoreResult<Done> migrate(sqlite3* db) {
  // BEGIN IMMEDIATE: two processes opening a fresh file at once must not both migrate it.
  if (auto begun = exec(db, "BEGIN IMMEDIATE", "begin migration"); !begun) return begun;
  auto result = [&]() -> StoreResult<Done> {
    auto current = read_schema_version(db);
    if (!current) return std::unexpected(current.error());
    const int latest = latest_schema_version();
    if (*current > latest) {
      return std::unexpected(
          StoreError{StoreErrc::corrupt, "sqlite: the database's idem schema is version " + std::to_string(*current) +
                                             ", newer than this build understands (" + std::to_string(latest) +
                                             "); open it with a newer idem, or use another file"});
    }
    if (*current == latest) return Done{};
    if (auto made = exec(db, kVersionTable, "create idem_schema_version"); !made) return made;
    for (const auto& m : kMigrations) {
      if (m.version <= *current) continue;
      if (auto applied = exec(db, m.sql, "apply migration " + std::to_string(m.version)); !applied) return applied;
    }
    const std::string record = "INSERT INTO idem_schema_version (id, version) VALUES (1, " + std::to_string(latest) +
                               ") ON CONFLICT (id) DO UPDATE SET version = excluded.version";
    return exec(db, record.c_str(), "record schema version");
  }();
  if (!result) {
    (void)exec(db, "ROLLBACK", "roll back migration");
    return result;
  }
  if (auto committed = exec(db, "COMMIT", "commit migration"); !committed) {
    (void)exec(db, "ROLLBACK", "roll back migration");
    return committed;
  }
  return Done{};
}

}  // namespace idem::sqlite_detail
