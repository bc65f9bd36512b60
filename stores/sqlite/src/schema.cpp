#include "schema.hpp"

#include <span>
#include <string>
#include <string_view>

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

// The transactional outbox (docs/outbox.md), created by migration 2 and by an outbox reader
// (ensure_outbox) on a file that holds no idem store. Every statement is IF NOT EXISTS for that
// reason, and a later change to the outbox must be written so that it applies to a table either
// of them made. Its columns are what a service in any language fills with one INSERT; the
// defaults make (message_id, body) enough. Migrations 4 to 6 rebuilt it to make each insert cheaper.
constexpr const char* kOutbox = R"sql(
  CREATE TABLE IF NOT EXISTS idem_outbox (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,  -- enqueue order; never reused after a purge
    message_id       TEXT    NOT NULL UNIQUE
                             CHECK (typeof(message_id) = 'text' AND length(message_id) BETWEEN 1 AND 256
                                    AND message_id NOT GLOB '*[^!-~]*'),
    destination      TEXT    NOT NULL DEFAULT '' CHECK (length(destination) <= 256),
    content_type     TEXT    NOT NULL DEFAULT 'application/json',
    headers          TEXT    NOT NULL DEFAULT '{}'
                             CHECK (json_valid(headers) AND json_type(headers) = 'object'),
    body             BLOB    NOT NULL DEFAULT x'',
    created_ms       INTEGER NOT NULL
                             DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    state            TEXT    NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'sent', 'dead')),
    attempts         INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_ms  INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    sent_ms          INTEGER,
    lease_owner      TEXT,
    lease_expires_ms INTEGER
  );
  -- The relay's claim: pending rows in id order, due ones only.
  CREATE INDEX IF NOT EXISTS idem_outbox_pending ON idem_outbox (id, next_attempt_ms) WHERE state = 'pending';
  -- purge_sent: sent rows by sent time.
  CREATE INDEX IF NOT EXISTS idem_outbox_sent ON idem_outbox (sent_ms) WHERE state = 'sent';
  -- An operator's list of dead rows, and their count.
  CREATE INDEX IF NOT EXISTS idem_outbox_dead ON idem_outbox (id) WHERE state = 'dead';
  -- A CHECK cannot hold the subquery that looks at each member.
  CREATE TRIGGER IF NOT EXISTS idem_outbox_headers_insert BEFORE INSERT ON idem_outbox
    WHEN json_valid(NEW.headers) AND EXISTS (SELECT 1 FROM json_each(NEW.headers) WHERE type <> 'text')
    BEGIN SELECT RAISE(ABORT, 'idem_outbox.headers must be a JSON object of string values'); END;
  CREATE TRIGGER IF NOT EXISTS idem_outbox_headers_update BEFORE UPDATE OF headers ON idem_outbox
    WHEN json_valid(NEW.headers) AND EXISTS (SELECT 1 FROM json_each(NEW.headers) WHERE type <> 'text')
    BEGIN SELECT RAISE(ABORT, 'idem_outbox.headers must be a JSON object of string values'); END;
)sql";

// Migration 4: the outbox's state CHECK as comparisons. SQLite evaluates `state IN ('pending',
// 'sent', 'dead')` by building a temporary b-tree of the three values on every INSERT (EXPLAIN
// shows OpenEphemeral), about a third of what enqueue cost the writer (docs/benchmarks.md). A
// CHECK cannot be altered in place, so the table is rebuilt (SQLite's documented procedure:
// create, copy, drop, rename) with its indexes and triggers. AUTOINCREMENT's high-water mark is
// carried over so that an id is still never reused; the rename moves its sqlite_sequence row.
// Everything else is as migration 2 made it. ensure_outbox runs it after creating the table too.
constexpr const char* kOutboxStateCheck = R"sql(
  CREATE TABLE idem_outbox_rebuilt (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id       TEXT    NOT NULL UNIQUE
                             CHECK (typeof(message_id) = 'text' AND length(message_id) BETWEEN 1 AND 256
                                    AND message_id NOT GLOB '*[^!-~]*'),
    destination      TEXT    NOT NULL DEFAULT '' CHECK (length(destination) <= 256),
    content_type     TEXT    NOT NULL DEFAULT 'application/json',
    headers          TEXT    NOT NULL DEFAULT '{}'
                             CHECK (json_valid(headers) AND json_type(headers) = 'object'),
    body             BLOB    NOT NULL DEFAULT x'',
    created_ms       INTEGER NOT NULL
                             DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    state            TEXT    NOT NULL DEFAULT 'pending'
                             CHECK (state = 'pending' OR state = 'sent' OR state = 'dead'),
    attempts         INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_ms  INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    sent_ms          INTEGER,
    lease_owner      TEXT,
    lease_expires_ms INTEGER
  );
  INSERT INTO idem_outbox_rebuilt (id, message_id, destination, content_type, headers, body, created_ms, state,
                                   attempts, next_attempt_ms, last_error, sent_ms, lease_owner, lease_expires_ms)
    SELECT id, message_id, destination, content_type, headers, body, created_ms, state, attempts, next_attempt_ms,
           last_error, sent_ms, lease_owner, lease_expires_ms
    FROM idem_outbox ORDER BY id;
  DELETE FROM sqlite_sequence WHERE name = 'idem_outbox_rebuilt';
  INSERT INTO sqlite_sequence (name, seq) SELECT 'idem_outbox_rebuilt', seq FROM sqlite_sequence WHERE name = 'idem_outbox';
  DROP TABLE idem_outbox;
  ALTER TABLE idem_outbox_rebuilt RENAME TO idem_outbox;
  CREATE INDEX idem_outbox_pending ON idem_outbox (id, next_attempt_ms) WHERE state = 'pending';
  CREATE INDEX idem_outbox_sent ON idem_outbox (sent_ms) WHERE state = 'sent';
  CREATE INDEX idem_outbox_dead ON idem_outbox (id) WHERE state = 'dead';
  CREATE TRIGGER idem_outbox_headers_insert BEFORE INSERT ON idem_outbox
    WHEN json_valid(NEW.headers) AND EXISTS (SELECT 1 FROM json_each(NEW.headers) WHERE type <> 'text')
    BEGIN SELECT RAISE(ABORT, 'idem_outbox.headers must be a JSON object of string values'); END;
  CREATE TRIGGER idem_outbox_headers_update BEFORE UPDATE OF headers ON idem_outbox
    WHEN json_valid(NEW.headers) AND EXISTS (SELECT 1 FROM json_each(NEW.headers) WHERE type <> 'text')
    BEGIN SELECT RAISE(ABORT, 'idem_outbox.headers must be a JSON object of string values'); END;
)sql";

// Migration 5: the outbox's per-row costs down to what a row needs. On every payment the
// headers trigger, the message id's character check (`NOT GLOB '*[^!-~]*'`) and AUTOINCREMENT
// (a read and an update of sqlite_sequence, one more page in each savepoint's journal and in
// the commit) were about half of what enqueue cost the store's writer (docs/benchmarks.md; a
// trigger runs as a subprogram even when its WHEN is false).
//  - The two checks only ever stopped a foreign writer's bad row: SqliteOutbox::enqueue checks
//    the same in C++ before its INSERT. The relay makes such a row dead with the reason when it
//    claims it (docs/outbox.md), as it did for a row damaged past the checks. What stays is what
//    costs little: types and lengths, the headers being a JSON object, the state.
//  - Without AUTOINCREMENT a new row's id is still above every id in the table (SQLite's
//    max(rowid) + 1). The relay's purge keeps the newest row, so a purge never lets an id come
//    back; only the newest row dropped by an operator can see its id given again. The old
//    high-water mark is not kept: ids above the newest row that were purged before this
//    migration can be given once more.
// Rebuilt as migration 4 was, keeping rows and ids (dropping the old table deletes its
// sqlite_sequence row); ensure_outbox runs it after creating the table too.
constexpr const char* kOutboxLeanChecks = R"sql(
  CREATE TABLE idem_outbox_rebuilt (
    id               INTEGER PRIMARY KEY,
    message_id       TEXT    NOT NULL UNIQUE
                             CHECK (typeof(message_id) = 'text' AND length(message_id) BETWEEN 1 AND 256),
    destination      TEXT    NOT NULL DEFAULT '' CHECK (length(destination) <= 256),
    content_type     TEXT    NOT NULL DEFAULT 'application/json',
    headers          TEXT    NOT NULL DEFAULT '{}'
                             CHECK (json_valid(headers) AND json_type(headers) = 'object'),
    body             BLOB    NOT NULL DEFAULT x'',
    created_ms       INTEGER NOT NULL
                             DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    state            TEXT    NOT NULL DEFAULT 'pending'
                             CHECK (state = 'pending' OR state = 'sent' OR state = 'dead'),
    attempts         INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_ms  INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    sent_ms          INTEGER,
    lease_owner      TEXT,
    lease_expires_ms INTEGER
  );
  INSERT INTO idem_outbox_rebuilt (id, message_id, destination, content_type, headers, body, created_ms, state,
                                   attempts, next_attempt_ms, last_error, sent_ms, lease_owner, lease_expires_ms)
    SELECT id, message_id, destination, content_type, headers, body, created_ms, state, attempts, next_attempt_ms,
           last_error, sent_ms, lease_owner, lease_expires_ms
    FROM idem_outbox ORDER BY id;
  DROP TABLE idem_outbox;
  ALTER TABLE idem_outbox_rebuilt RENAME TO idem_outbox;
  CREATE INDEX idem_outbox_pending ON idem_outbox (id, next_attempt_ms) WHERE state = 'pending';
  CREATE INDEX idem_outbox_sent ON idem_outbox (sent_ms) WHERE state = 'sent';
  CREATE INDEX idem_outbox_dead ON idem_outbox (id) WHERE state = 'dead';
)sql";

// Migration 6: two more per-row costs of enqueue out (docs/benchmarks.md: a C loop of the
// INSERT under callgrind, 32.5k instructions a row before, 29.4k after).
//  - The headers' JSON CHECK (2.3k a row): SqliteOutbox::enqueue writes the headers itself, and
//    the relay already makes a foreign row dead, with the reason, when its headers are not an
//    object of strings (migration 5); now also when they are not JSON at all.
//  - The sent and the dead rows' partial indexes become one (0.8k a row: an INSERT opens a cursor
//    on every index of the table, even a partial one its row does not enter). Queries that want
//    it name `state <> 'pending'`, since SQLite uses a partial index only when the query's WHERE
//    contains the index's own; on a file at an older version the same queries use the two old
//    indexes, so a relay newer than the service's store still runs.
// Rebuilt as migration 5 was, keeping rows and ids; ensure_outbox runs it after creating the
// table too.
constexpr const char* kOutboxSettledIndex = R"sql(
  CREATE TABLE idem_outbox_rebuilt (
    id               INTEGER PRIMARY KEY,
    message_id       TEXT    NOT NULL UNIQUE
                             CHECK (typeof(message_id) = 'text' AND length(message_id) BETWEEN 1 AND 256),
    destination      TEXT    NOT NULL DEFAULT '' CHECK (length(destination) <= 256),
    content_type     TEXT    NOT NULL DEFAULT 'application/json',
    headers          TEXT    NOT NULL DEFAULT '{}',
    body             BLOB    NOT NULL DEFAULT x'',
    created_ms       INTEGER NOT NULL
                             DEFAULT (CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)),
    state            TEXT    NOT NULL DEFAULT 'pending'
                             CHECK (state = 'pending' OR state = 'sent' OR state = 'dead'),
    attempts         INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_ms  INTEGER NOT NULL DEFAULT 0,
    last_error       TEXT,
    sent_ms          INTEGER,
    lease_owner      TEXT,
    lease_expires_ms INTEGER
  );
  INSERT INTO idem_outbox_rebuilt (id, message_id, destination, content_type, headers, body, created_ms, state,
                                   attempts, next_attempt_ms, last_error, sent_ms, lease_owner, lease_expires_ms)
    SELECT id, message_id, destination, content_type, headers, body, created_ms, state, attempts, next_attempt_ms,
           last_error, sent_ms, lease_owner, lease_expires_ms
    FROM idem_outbox ORDER BY id;
  DROP TABLE idem_outbox;
  ALTER TABLE idem_outbox_rebuilt RENAME TO idem_outbox;
  -- The relay's claim: pending rows in id order, due ones only.
  CREATE INDEX idem_outbox_pending ON idem_outbox (id, next_attempt_ms) WHERE state = 'pending';
  -- Sent rows by sent time (purge_sent); dead rows, for operators and their count.
  CREATE INDEX idem_outbox_settled ON idem_outbox (state, sent_ms) WHERE state <> 'pending';
)sql";

// Migration 7: the pending rows' index goes (docs/benchmarks.md: every INSERT wrote it, one more
// b-tree, one more page in each savepoint's journal and in each commit). The relay finds pending
// rows by id instead, from a low-water mark kept in idem_outbox_scan: every row with an id below
// from_id is sent or dead. It moves only forward as the relay settles rows (in the settle's
// transaction), and back when an operator makes a dead row pending again or drops one (whose id a
// new row may then be given). The service's INSERT never touches it: a new row's id, max(id) + 1,
// is never below it, because the purge keeps the newest row.
// A relay may have made the table and its mark in a service's own database before an idem store
// was opened on it (ensure_outbox): the store's migrations then keep the mark it finds.
constexpr const char* kOutboxScan = R"sql(
  CREATE TABLE IF NOT EXISTS idem_outbox_scan (
    id      INTEGER PRIMARY KEY CHECK (id = 1),
    from_id INTEGER NOT NULL
  );
  INSERT INTO idem_outbox_scan (id, from_id) VALUES (1, coalesce(
    (SELECT min(id) FROM idem_outbox WHERE state = 'pending'), (SELECT max(id) + 1 FROM idem_outbox), 0))
    ON CONFLICT (id) DO NOTHING;
  DROP INDEX IF EXISTS idem_outbox_pending;
)sql";

// Migration 8: ordering keys (docs/outbox.md, "Order"). A row's key is the aggregate it belongs to;
// the relay publishes a key's rows one at a time, in id order, which is commit order with
// SQLite's one writer. The index holds the keyed rows not sent yet (an UPDATE to sent takes a row
// out): for a candidate row, an earlier row of its key is its first entry below the row, however
// many rows of the key were sent before. ADD COLUMN with a NULL default rewrites no row. ensure_outbox runs it after creating
// the table too; a relay on a file still at version 7 reads every row as keyless.
constexpr const char* kOutboxOrdering = R"sql(
  ALTER TABLE idem_outbox ADD COLUMN ordering_key TEXT
    CHECK (ordering_key IS NULL OR length(ordering_key) BETWEEN 1 AND 128);
  CREATE INDEX idem_outbox_ordering ON idem_outbox (ordering_key, id) WHERE ordering_key IS NOT NULL AND state <> 'sent';
)sql";

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
    {2, kOutbox},
    // The attempt number (SPEC §12: a takeover counts one more, the gateway tells the upstream)
    // and the lookup of an "ask" route (idemctl reconcile reads it). Records from before are
    // first attempts without a lookup.
    {3, R"sql(
      ALTER TABLE idempotency_keys ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1 CHECK (attempt >= 1);
      ALTER TABLE idempotency_keys ADD COLUMN lookup TEXT NOT NULL DEFAULT '';
    )sql"},
    {4, kOutboxStateCheck},
    {5, kOutboxLeanChecks},
    {6, kOutboxSettledIndex},
    {7, kOutboxScan},
    {8, kOutboxOrdering},
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

namespace {

StoreResult<Done> check_not_newer(int current) {
  const int latest = latest_schema_version();
  if (current > latest) {
    return std::unexpected(
        StoreError{StoreErrc::corrupt, "sqlite: the database's idem schema is version " + std::to_string(current) +
                                           ", newer than this build understands (" + std::to_string(latest) +
                                           "); open it with a newer idem, or use another file"});
  }
  return Done{};
}

// Runs `body` in a write transaction (BEGIN IMMEDIATE: two processes at it at once take turns,
// and the second finds the first's work done), committing what it did.
template <class Body>
StoreResult<Done> in_write_transaction(sqlite3* db, std::string_view what, Body&& body) {
  if (auto begun = exec(db, "BEGIN IMMEDIATE", "begin " + std::string(what)); !begun) return begun;
  StoreResult<Done> result = body();
  if (!result) {
    (void)exec(db, "ROLLBACK", "roll back " + std::string(what));
    return result;
  }
  if (auto committed = exec(db, "COMMIT", "commit " + std::string(what)); !committed) {
    (void)exec(db, "ROLLBACK", "roll back " + std::string(what));
    return committed;
  }
  return Done{};
}

}  // namespace

StoreResult<bool> has_table(sqlite3* db, const char* name) {
  auto q = Statement::prepare(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1");
  if (!q) return std::unexpected(q.error());
  q->bind_text(1, name);
  if (const int rc = q->step(); rc != SQLITE_ROW) return std::unexpected(map_error(rc, "read schema", db));
  return q->int64(0) > 0;
}

StoreResult<bool> has_column(sqlite3* db, const char* table, const char* column) {
  auto q = Statement::prepare(db, "SELECT count(*) FROM pragma_table_info(?1) WHERE name = ?2");
  if (!q) return std::unexpected(q.error());
  q->bind_text(1, table);
  q->bind_text(2, column);
  if (const int rc = q->step(); rc != SQLITE_ROW) return std::unexpected(map_error(rc, "read schema", db));
  return q->int64(0) > 0;
}

StoreResult<Done> migrate(sqlite3* db, int target) {
  return in_write_transaction(db, "migration", [&]() -> StoreResult<Done> {
    auto current = read_schema_version(db);
    if (!current) return std::unexpected(current.error());
    if (auto ok = check_not_newer(*current); !ok) return ok;
    if (*current >= target) return Done{};
    if (auto made = exec(db, kVersionTable, "create idem_schema_version"); !made) return made;
    for (const auto& m : kMigrations) {
      if (m.version <= *current || m.version > target) continue;
      if (auto applied = exec(db, m.sql, "apply migration " + std::to_string(m.version)); !applied) return applied;
    }
    const std::string record = "INSERT INTO idem_schema_version (id, version) VALUES (1, " + std::to_string(target) +
                               ") ON CONFLICT (id) DO UPDATE SET version = excluded.version";
    return exec(db, record.c_str(), "record schema version");
  });
}

StoreResult<Done> ensure_outbox(sqlite3* db, bool create, std::string_view path) {
  // Fast path, no write lock: every open of a file that has the table (a relay restarting, an
  // idem store's file) ends here, and the service's writers never wait for it.
  auto present = has_table(db, "idem_outbox");
  if (!present) return std::unexpected(present.error());
  if (*present) {
    auto version = read_schema_version(db);
    if (!version) return std::unexpected(version.error());
    return check_not_newer(*version);
  }
  if (!create) {
    return std::unexpected(StoreError{
        StoreErrc::internal, "sqlite: " + std::string(path) +
                                 " has no idem_outbox table (an idem store or idem-relay creates it): is it the "
                                 "service's database?"});
  }
  return in_write_transaction(db, "outbox creation", [&]() -> StoreResult<Done> {
    auto version = read_schema_version(db);
    if (!version) return std::unexpected(version.error());
    if (auto ok = check_not_newer(*version); !ok) return ok;
    auto made_meanwhile = has_table(db, "idem_outbox");  // by another creator, while we waited
    if (!made_meanwhile) return std::unexpected(made_meanwhile.error());
    if (*made_meanwhile) return Done{};
    if (auto made = exec(db, kOutbox, "create idem_outbox"); !made) return made;
    if (auto rebuilt = exec(db, kOutboxStateCheck, "create idem_outbox"); !rebuilt) return rebuilt;
    if (auto leaner = exec(db, kOutboxLeanChecks, "create idem_outbox"); !leaner) return leaner;
    if (auto settled = exec(db, kOutboxSettledIndex, "create idem_outbox"); !settled) return settled;
    if (auto scan = exec(db, kOutboxScan, "create idem_outbox"); !scan) return scan;
    return exec(db, kOutboxOrdering, "create idem_outbox");
  });
}

}  // namespace idem::sqlite_detail
