#include "idem/sqlite_outbox.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "connection.hpp"
#include "idem/error_envelope.hpp"
#include "relay_lock.hpp"
#include "schema.hpp"
#include "writer_transaction.hpp"

namespace idem {
namespace {

using sqlite_detail::map_error;
using sqlite_detail::ResetOnExit;
using sqlite_detail::Statement;
using sqlite_detail::WriterTransaction;

StoreError internal_error(std::string message) { return StoreError{StoreErrc::internal, std::move(message)}; }

// ["a","b"]: the claim's list of destinations, for json_each.
std::string json_array(const std::vector<std::string>& items) {
  std::string out = "[";
  for (const std::string& item : items) {
    if (out.size() > 1) out += ',';
    append_json_string(out, item);
  }
  return out + "]";
}

std::int64_t to_db(std::size_t n) {
  return static_cast<std::int64_t>(std::min<std::size_t>(n, std::numeric_limits<std::int64_t>::max()));
}

// ---- SQL --------------------------------------------------------------------------------------

// created_ms comes from the caller's clock, like every time the store writes; next_attempt_ms
// keeps its default 0 ("due at once"), so that a relay whose clock is behind the service's still
// publishes the row now.
constexpr std::string_view kInsert =
    "INSERT INTO idem_outbox (message_id, destination, content_type, headers, body, created_ms, ordering_key) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7) ON CONFLICT (message_id) DO NOTHING";
// An outbox made before schema version 8 (by an older relay, in an application's own database)
// has no ordering_key column: messages without a key still go in.
constexpr std::string_view kInsertWithoutKey =
    "INSERT INTO idem_outbox (message_id, destination, content_type, headers, body, created_ms) "
    "VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (message_id) DO NOTHING";

// What decode_row reads, in this order; a file before schema version 8 has no ordering key.
#define IDEM_OUTBOX_COLUMNS_BUT_KEY                                                                       \
  "id, message_id, destination, content_type, headers, body, state, created_ms, attempts, next_attempt_ms, " \
  "last_error, sent_ms, "
std::string columns(bool ordering) {
  return std::string(IDEM_OUTBOX_COLUMNS_BUT_KEY) + (ordering ? "ordering_key" : "NULL");
}
#undef IDEM_OUTBOX_COLUMNS_BUT_KEY

// Where the relay looks for pending rows. From schema version 7 on, by id from the low-water mark
// in idem_outbox_scan (every row below it is sent or dead; schema.cpp, migration 7), the table
// having no index of its pending rows. On an older file (a relay newer than the service's store)
// the pending rows' index finds them. A constant bound, so that SQLite seeks to it.
#define IDEM_OUTBOX_FROM_SCAN "id >= (SELECT from_id FROM idem_outbox_scan) AND "

// One relay per file (the relay lock), so a lease held by anyone else is a dead relay's: it is
// recorded for operators, not obeyed. A row with an ordering key waits while an earlier row of its
// key (by id: SQLite commits its one writer's transactions in id order) is pending, in flight
// included, or dead outside the destinations whose dead rows let the key go on (?5, a JSON
// array); the ordering index finds those rows.
std::string claim_sql(bool scan, bool ordering) {
  std::string sql = "UPDATE idem_outbox SET lease_owner = ?1, lease_expires_ms = ?2 WHERE id IN (SELECT id FROM idem_outbox o WHERE ";
  if (scan) sql += IDEM_OUTBOX_FROM_SCAN;
  sql += "state = 'pending' AND next_attempt_ms <= ?3 ";
  if (ordering) {
    sql +=
        "AND (ordering_key IS NULL OR NOT EXISTS (SELECT 1 FROM idem_outbox e WHERE e.ordering_key = o.ordering_key "
        "AND e.id < o.id AND e.state <> 'sent' AND (e.state = 'pending' OR (e.state = 'dead' AND e.destination NOT IN "
        "(SELECT value FROM json_each(?5)) AND '*' NOT IN (SELECT value FROM json_each(?5)))))) ";
  }
  return sql + "ORDER BY id LIMIT ?4) RETURNING " + columns(ordering);
}

// The low-water mark up to the first pending row, or past the newest row when none is pending
// (an empty table keeps it). Run at the end of the relay's claim and settle transactions: it
// walks only the rows settled since it last moved. Written only when it moves: an idle relay's
// claim then writes nothing, and its commit costs no WAL frame and no fsync.
constexpr std::string_view kAdvanceScan =
    "UPDATE idem_outbox_scan SET from_id = next.id FROM (SELECT coalesce("
    "(SELECT id FROM idem_outbox WHERE " IDEM_OUTBOX_FROM_SCAN "state = 'pending' ORDER BY id LIMIT 1), "
    "(SELECT max(id) + 1 FROM idem_outbox), (SELECT from_id FROM idem_outbox_scan)) AS id) AS next "
    "WHERE from_id <> next.id";
// A dead row made pending again (?1) may be below the mark.
constexpr std::string_view kLowerScanTo = "UPDATE idem_outbox_scan SET from_id = min(from_id, ?1)";
// After dropping the newest row, its id is the next row's (max(id) + 1): the mark must not be
// above it.
constexpr std::string_view kLowerScanToNewest =
    "UPDATE idem_outbox_scan SET from_id = min(from_id, coalesce((SELECT max(id) FROM idem_outbox), 0) + 1)";
constexpr std::string_view kMarkUnreadable =
    "UPDATE idem_outbox SET state = 'dead', last_error = ?2, lease_owner = NULL, lease_expires_ms = NULL "
    "WHERE id = ?1";

// Settling touches only rows still pending and leased to the settling relay (?2).
constexpr std::string_view kSettleSent =
    "UPDATE idem_outbox SET state = 'sent', sent_ms = ?3, lease_owner = NULL, lease_expires_ms = NULL "
    "WHERE id = ?1 AND state = 'pending' AND lease_owner = ?2";
constexpr std::string_view kSettleRetry =
    "UPDATE idem_outbox SET attempts = attempts + 1, next_attempt_ms = ?3, last_error = NULLIF(?4, ''), "
    "lease_owner = NULL, lease_expires_ms = NULL WHERE id = ?1 AND state = 'pending' AND lease_owner = ?2";
constexpr std::string_view kSettlePostpone =
    "UPDATE idem_outbox SET next_attempt_ms = ?3, last_error = NULLIF(?4, ''), lease_owner = NULL, "
    "lease_expires_ms = NULL WHERE id = ?1 AND state = 'pending' AND lease_owner = ?2";
constexpr std::string_view kSettleDead =
    "UPDATE idem_outbox SET state = 'dead', attempts = attempts + 1, last_error = NULLIF(?4, ''), "
    "lease_owner = NULL, lease_expires_ms = NULL WHERE id = ?1 AND state = 'pending' AND lease_owner = ?2";

// The newest row stays, whatever its age: a new row's id is max(id) + 1 (the table has no
// AUTOINCREMENT, schema.cpp), so keeping it is what keeps a purged id from being given again.
// `state <> 'pending'` lets SQLite use the settled rows' index (schema.cpp, migration 6).
constexpr std::string_view kPurgeSent =
    "DELETE FROM idem_outbox WHERE id IN "
    "(SELECT id FROM idem_outbox WHERE state <> 'pending' AND state = 'sent' AND sent_ms < ?1 "
    "AND id < (SELECT max(id) FROM idem_outbox) LIMIT ?2)";

// Pending rows from the low-water mark (or on their index, before version 7); sent and dead ones
// on the settled rows' index. From version 8, the ordering keys held by a dead row (one with a
// pending row of its key after it) and the oldest row so held, off the ordering index.
std::string count_sql(bool scan, bool ordering) {
  const std::string from = scan ? IDEM_OUTBOX_FROM_SCAN : "";
  std::string sql = "SELECT (SELECT count(*) FROM idem_outbox WHERE " + from + "state = 'pending'), "
                    "(SELECT count(*) FROM idem_outbox WHERE state <> 'pending' AND state = 'sent'), "
                    "(SELECT count(*) FROM idem_outbox WHERE state <> 'pending' AND state = 'dead'), "
                    "(SELECT min(created_ms) FROM idem_outbox WHERE " + from + "state = 'pending')";
  if (!ordering) return sql + ", 0, NULL";
  // From the dead rows (few, off the settled index), each looking for the first row after it of
  // its key that is not sent (the ordering index): a walk over the pending rows instead looked at
  // every earlier row of each one's key, quadratic in a key's backlog.
  const std::string dead_keyed = "FROM idem_outbox d WHERE d.state <> 'pending' AND d.state = 'dead' AND d.ordering_key IS NOT NULL";
  const std::string next_pending =
      "(SELECT p.created_ms FROM idem_outbox p WHERE p.ordering_key = d.ordering_key AND p.id > d.id AND p.state <> 'sent' "
      "AND p.state = 'pending' ORDER BY p.id LIMIT 1)";
  return sql + ", (SELECT count(DISTINCT d.ordering_key) " + dead_keyed + " AND " + next_pending + " IS NOT NULL), "
         "(SELECT min(" + next_pending + ") " + dead_keyed + ")";
}

// The state is written into the SQL (not bound) so that SQLite can use a partial index. Pending
// rows come in id order from the low-water mark (one bound: SQLite seeks to the larger of the two)
// or, before version 7, off their index. Dead rows are few: the settled rows' index finds them
// and SQLite sorts them. Sent rows are most of the table, so they are read in id order off the
// table itself rather than all sorted (no `state <> 'pending'`: the index stays out of it).
std::string list_sql(std::optional<OutboxState> state, bool scan, bool ordering) {
  std::string sql = "SELECT " + columns(ordering) + " FROM idem_outbox WHERE ";
  sql += state == OutboxState::pending && scan ? "id >= max(?1 + 1, (SELECT from_id FROM idem_outbox_scan))"
                                               : "id > ?1";
  if (state == OutboxState::dead) sql += " AND state <> 'pending'";
  if (state) sql += " AND state = '" + std::string(to_string(*state)) + "'";
  return sql + " ORDER BY id LIMIT ?2";
}

std::string get_sql(bool ordering) { return "SELECT " + columns(ordering) + " FROM idem_outbox WHERE id = ?1"; }
constexpr std::string_view kRetryDead =
    "UPDATE idem_outbox SET state = 'pending', attempts = 0, next_attempt_ms = ?2, lease_owner = NULL, "
    "lease_expires_ms = NULL WHERE id = ?1 AND state = 'dead'";
constexpr std::string_view kDropDead = "DELETE FROM idem_outbox WHERE id = ?1 AND state = 'dead'";
constexpr std::string_view kPing = "SELECT 1 FROM idem_outbox LIMIT 1";

#undef IDEM_OUTBOX_FROM_SCAN

std::optional<OutboxState> parse_state(std::string_view s) {
  if (s == "pending") return OutboxState::pending;
  if (s == "sent") return OutboxState::sent;
  if (s == "dead") return OutboxState::dead;
  return std::nullopt;
}

// The row at the statement's cursor, or why it cannot be read. A row that reads but cannot be
// published (the table leaves a foreign writer's id and header values to the relay: schema.cpp,
// migration 5) comes back with `unreadable` set.
std::expected<OutboxRow, std::string> decode_row(const Statement& q) {
  OutboxRow row;
  row.id = q.int64(0);
  row.message.message_id = std::string(q.text(1));
  row.message.destination = std::string(q.text(2));
  row.message.content_type = std::string(q.text(3));
  read_outbox_headers(row, q.text(4));
  row.message.body = std::string(q.blob(5));
  const auto state = parse_state(q.text(6));
  if (!state) return std::unexpected("unknown state \"" + std::string(q.text(6)) + "\"");
  row.state = *state;
  row.created = from_epoch_ms(q.int64(7));
  const std::int64_t attempts = q.int64(8);
  row.attempts = static_cast<std::uint32_t>(std::clamp<std::int64_t>(attempts, 0, std::numeric_limits<std::uint32_t>::max()));
  row.next_attempt = from_epoch_ms(q.int64(9));
  row.last_error = std::string(q.text(10));
  if (!q.is_null(11)) row.sent = from_epoch_ms(q.int64(11));
  if (!q.is_null(12)) {
    row.message.ordering_key = std::string(q.text(12));
    row.key_seq = row.id;  // ids are commit order here
  }
  return row;
}

StoreError unreadable(std::int64_t id, const std::string& why) {
  return StoreError{StoreErrc::corrupt, "sqlite: outbox row " + std::to_string(id) + " cannot be read: " + why};
}

// Every statement a reader runs, prepared once at open. `scan` says whether the file has the
// low-water mark (schema version 7); without it the mark's three statements stay empty.
// `ordering` whether it has ordering keys (version 8); without them every row is keyless.
struct Statements {
  bool scan = false;
  bool ordering = false;
  Statement begin, commit, rollback;
  Statement claim, mark_unreadable, sent, retry, postpone, dead;
  Statement advance_scan, lower_scan_to, lower_scan_to_newest;
  Statement purge, count, list_all, list_pending, list_sent, list_dead, get, retry_dead, drop_dead, ping;
};

StoreResult<Statements> prepare_statements(sqlite3* db) {
  Statements s;
  auto scan = sqlite_detail::has_table(db, "idem_outbox_scan");
  if (!scan) return std::unexpected(scan.error());
  s.scan = *scan;
  auto ordering = sqlite_detail::has_column(db, "idem_outbox", "ordering_key");
  if (!ordering) return std::unexpected(ordering.error());
  s.ordering = *ordering;
  const bool o = s.ordering;
  const std::string all_sql = list_sql(std::nullopt, s.scan, o), pending_sql = list_sql(OutboxState::pending, s.scan, o),
                    sent_sql = list_sql(OutboxState::sent, s.scan, o), dead_sql = list_sql(OutboxState::dead, s.scan, o),
                    claim = claim_sql(s.scan, o), count = count_sql(s.scan, o), get = get_sql(o);
  std::vector<std::pair<Statement*, std::string_view>> all = {
      {&s.begin, "BEGIN IMMEDIATE"},  {&s.commit, "COMMIT"},        {&s.rollback, "ROLLBACK"},
      {&s.claim, claim},              {&s.mark_unreadable, kMarkUnreadable},
      {&s.sent, kSettleSent},         {&s.retry, kSettleRetry},     {&s.postpone, kSettlePostpone},
      {&s.dead, kSettleDead},         {&s.purge, kPurgeSent},       {&s.count, count},
      {&s.list_all, all_sql},         {&s.list_pending, pending_sql}, {&s.list_sent, sent_sql},
      {&s.list_dead, dead_sql},       {&s.get, get},               {&s.retry_dead, kRetryDead},
      {&s.drop_dead, kDropDead},      {&s.ping, kPing},
  };
  if (s.scan) {
    all.insert(all.end(), {{&s.advance_scan, kAdvanceScan},
                           {&s.lower_scan_to, kLowerScanTo},
                           {&s.lower_scan_to_newest, kLowerScanToNewest}});
  }
  for (const auto& [statement, sql] : all) {
    auto prepared = Statement::prepare(db, sql);
    if (!prepared) return std::unexpected(prepared.error());
    *statement = std::move(*prepared);
  }
  return s;
}

}  // namespace

// ---- enqueue ----------------------------------------------------------------------------------

StoreResult<Done> SqliteOutbox::create_table(sqlite3* db) {
  return sqlite_detail::ensure_outbox(db, /*create=*/true, sqlite3_db_filename(db, "main"));
}

namespace {

// enqueue's INSERT of a checked message whose headers are `headers_json`.
bool insert_message(sqlite3* db, const OutboxMessage& message, std::string_view headers_json, TimePoint now,
                    std::string& error) {
  if (db == nullptr) {
    error = "outbox: enqueue got no database connection";
    return false;
  }
  // Outside a transaction the row would commit on its own, whatever happens to the business
  // writes it belongs with: exactly what the outbox is there to prevent.
  if (sqlite3_get_autocommit(db)) {
    error =
        "outbox: enqueue must run inside the transaction it belongs to (complete_in_transaction's work, or a "
        "transaction of the application's); none is open on this connection";
    return false;
  }
  // On the store's writer connection the INSERT is prepared once (writer_transaction.hpp);
  // elsewhere it is prepared for this call.
  Statement* cached = WriterTransaction::outbox_insert_for(db);
  Statement local;
  bool with_key = true;
  if (cached == nullptr || cached->get() == nullptr) {
    auto prepared = Statement::prepare(db, kInsert);
    if (!prepared && message.ordering_key.empty() && prepared.error().message.find("ordering_key") != std::string::npos) {
      prepared = Statement::prepare(db, kInsertWithoutKey);  // an outbox from before schema version 8
      with_key = false;
      cached = nullptr;  // the writer's cache holds the statement with the key only
    }
    if (!prepared) {
      error = prepared.error().message;
      if (error.find("no such table") != std::string::npos) {
        error += " (the outbox table is made by SqliteStore::open or by an outbox reader on this file)";
      } else if (error.find("ordering_key") != std::string::npos) {
        error += " (the outbox predates ordering keys: open an idem store on this file once, which moves its schema "
                 "forward)";
      }
      return false;
    }
    (cached != nullptr ? *cached : local) = std::move(*prepared);
  }
  Statement& q = cached != nullptr ? *cached : local;
  ResetOnExit reset(q);  // the bindings point into `message`: none may outlive this call
  q.bind_text(1, message.message_id);
  q.bind_text(2, message.destination);
  q.bind_text(3, message.content_type);
  q.bind_text(4, headers_json);
  q.bind_blob(5, message.body);
  q.bind(6, to_epoch_ms(now));
  if (with_key) {
    if (message.ordering_key.empty()) {
      q.bind_null(7);
    } else {
      q.bind_text(7, message.ordering_key);
    }
  }
  if (const int rc = q.step(); rc != SQLITE_DONE) {
    error = map_error(rc, "enqueue message \"" + message.message_id + "\"", db).message;
    return false;
  }
  if (sqlite3_changes(db) == 0) {
    error = "message id " + message.message_id + " is already in the outbox";
    return false;
  }
  return true;
}

}  // namespace

bool SqliteOutbox::enqueue(sqlite3* db, const OutboxMessage& message, TimePoint now, std::string& error) {
  if (auto problem = outbox_message_problem(message)) {
    error = "outbox: cannot enqueue the message: " + *problem;
    return false;
  }
  return insert_message(db, message, outbox_headers_to_json(message.headers), now, error);
}

bool SqliteOutbox::enqueue(sqlite3* db, const CheckedOutboxMessage& checked, TimePoint now, std::string& error) {
  return insert_message(db, checked.message(), checked.headers_json(), now, error);
}

// ---- the writer's cached INSERT ---------------------------------------------------------------

namespace sqlite_detail {
namespace {
thread_local WriterTransaction* current_writer_transaction = nullptr;
}  // namespace

WriterTransaction::WriterTransaction(sqlite3* db, Statement& outbox_insert)
    : db_(db), outbox_insert_(outbox_insert), previous_(current_writer_transaction) {
  current_writer_transaction = this;
}

WriterTransaction::~WriterTransaction() { current_writer_transaction = previous_; }

Statement* WriterTransaction::outbox_insert_for(sqlite3* db) {
  for (WriterTransaction* t = current_writer_transaction; t != nullptr; t = t->previous_) {
    if (t->db_ == db) return &t->outbox_insert_;
  }
  return nullptr;
}
}  // namespace sqlite_detail

// ---- the reader -------------------------------------------------------------------------------

// synchronous = NORMAL for the connection's commits while it lives, FULL again after. Only a
// matter of speed: a PRAGMA that fails leaves the commits durable.
class RelaxedSync {
 public:
  explicit RelaxedSync(sqlite3* db) : db_(db) { (void)sqlite3_exec(db_, "PRAGMA synchronous = NORMAL", nullptr, nullptr, nullptr); }
  ~RelaxedSync() { (void)sqlite3_exec(db_, "PRAGMA synchronous = FULL", nullptr, nullptr, nullptr); }
  RelaxedSync(const RelaxedSync&) = delete;
  RelaxedSync& operator=(const RelaxedSync&) = delete;

 private:
  sqlite3* db_;
};

class SqliteOutbox::Impl {
 public:
  Impl(SqliteOutboxOptions options, std::optional<sqlite_detail::RelayLock> lock, sqlite_detail::Connection db,
       Statements st)
      : options_(std::move(options)), lock_(std::move(lock)), db_(std::move(db)), st_(std::move(st)) {}

  StoreResult<std::vector<OutboxRow>> claim(const OutboxClaim& c) {
    if (auto refused = relay_only("claim")) return std::unexpected(*refused);
    if (c.owner.empty()) return std::unexpected(internal_error("sqlite: outbox claim: OutboxClaim::owner is empty"));
    if (c.lease <= Millis::zero()) return std::unexpected(internal_error("sqlite: outbox claim: the lease must be positive"));
    if (c.limit == 0) return std::vector<OutboxRow>{};
    // A claim need not reach the disk before the publish: one lost to a power cut leaves its rows
    // pending, and publishing them again is what consumers dedupe anyway (as after a relay killed
    // between publish and settle). With WAL, synchronous = NORMAL commits it without an fsync;
    // the settle after the publish (FULL) syncs the log, the claim with it. One fsync a batch
    // instead of two: idem-relay to Kafka went from 0.58x to 0.72x of a raw produce loop
    // (bench/consumers/run.py --outbox-only).
    const RelaxedSync relaxed(db_.get());
    return in_transaction<std::vector<OutboxRow>>("outbox claim", [&]() -> StoreResult<std::vector<OutboxRow>> {
      std::vector<OutboxRow> rows;
      std::vector<std::pair<std::int64_t, std::string>> bad;
      {
        Statement& q = st_.claim;
        ResetOnExit reset(q);
        q.bind_text(1, c.owner);
        q.bind(2, to_epoch_ms(c.now + c.lease));
        q.bind(3, to_epoch_ms(c.now));
        q.bind(4, to_db(c.limit));
        const std::string passing = json_array(c.dead_rows_pass);
        if (st_.ordering) q.bind_text(5, passing);
        int rc;
        while ((rc = q.step()) == SQLITE_ROW) {
          auto row = decode_row(q);
          if (!row) {
            bad.emplace_back(q.int64(0), std::move(row.error()));
          } else if (!row->unreadable.empty()) {
            bad.emplace_back(row->id, std::move(row->unreadable));
          } else {
            rows.push_back(std::move(*row));
          }
        }
        if (rc != SQLITE_DONE) return std::unexpected(map_error(rc, "outbox claim", db_.get()));
      }
      // A row nobody can publish must not stop the ones behind it: dead, with the reason.
      for (const auto& [id, why] : bad) {
        Statement& q = st_.mark_unreadable;
        q.bind(1, id);
        const std::string reason = "the row cannot be read: " + why;
        q.bind_text(2, reason);
        if (auto done = q.run("outbox claim: mark an unreadable row dead"); !done) return std::unexpected(done.error());
      }
      if (auto moved = advance_scan("outbox claim"); !moved) return std::unexpected(moved.error());
      // RETURNING gives rows in no promised order.
      std::sort(rows.begin(), rows.end(), [](const OutboxRow& a, const OutboxRow& b) { return a.id < b.id; });
      return rows;
    });
  }

  StoreResult<Done> settle(const std::vector<OutboxResult>& results, TimePoint now, const std::string& owner) {
    if (auto refused = relay_only("settle")) return std::unexpected(*refused);
    if (results.empty()) return Done{};
    return in_transaction<Done>("outbox settle", [&]() -> StoreResult<Done> {
      for (const OutboxResult& r : results) {
        Statement* q = nullptr;
        switch (r.kind) {
          case OutboxResult::Kind::sent: q = &st_.sent; break;
          case OutboxResult::Kind::retry: q = &st_.retry; break;
          case OutboxResult::Kind::postpone: q = &st_.postpone; break;
          case OutboxResult::Kind::dead: q = &st_.dead; break;
        }
        if (q == nullptr) return std::unexpected(internal_error("sqlite: outbox settle: unknown result kind"));
        q->bind(1, r.id);
        q->bind_text(2, owner);
        q->bind(3, to_epoch_ms(r.kind == OutboxResult::Kind::sent ? now : r.next_attempt));
        if (r.kind != OutboxResult::Kind::sent) q->bind_text(4, r.error);
        if (auto done = q->run("outbox settle"); !done) return std::unexpected(done.error());
      }
      return advance_scan("outbox settle");
    });
  }

  StoreResult<std::size_t> purge_sent(TimePoint before, std::size_t limit) {
    if (limit == 0) return std::size_t{0};
    Statement& q = st_.purge;
    q.bind(1, to_epoch_ms(before));
    q.bind(2, to_db(limit));
    if (auto done = q.run("outbox purge"); !done) return std::unexpected(done.error());
    return static_cast<std::size_t>(sqlite3_changes64(db_.get()));
  }

  StoreResult<OutboxCounts> count() {
    Statement& q = st_.count;
    ResetOnExit reset(q);
    if (const int rc = q.step(); rc != SQLITE_ROW) return std::unexpected(map_error(rc, "outbox count", db_.get()));
    OutboxCounts counts;
    counts.pending = static_cast<std::uint64_t>(q.int64(0));
    counts.sent = static_cast<std::uint64_t>(q.int64(1));
    counts.dead = static_cast<std::uint64_t>(q.int64(2));
    if (!q.is_null(3)) counts.oldest_pending = from_epoch_ms(q.int64(3));
    counts.held_keys = static_cast<std::uint64_t>(q.int64(4));
    if (!q.is_null(5)) counts.oldest_held = from_epoch_ms(q.int64(5));
    return counts;
  }

  StoreResult<std::vector<OutboxRow>> list(const OutboxQuery& query) {
    Statement* q = &st_.list_all;
    if (query.state) {
      switch (*query.state) {
        case OutboxState::pending: q = &st_.list_pending; break;
        case OutboxState::sent: q = &st_.list_sent; break;
        case OutboxState::dead: q = &st_.list_dead; break;
      }
    }
    ResetOnExit reset(*q);
    q->bind(1, query.after_id);
    q->bind(2, to_db(query.limit));
    std::vector<OutboxRow> rows;
    int rc;
    while ((rc = q->step()) == SQLITE_ROW) {
      auto row = decode_row(*q);
      if (!row) return std::unexpected(unreadable(q->int64(0), row.error()));
      rows.push_back(std::move(*row));
    }
    if (rc != SQLITE_DONE) return std::unexpected(map_error(rc, "outbox list", db_.get()));
    return rows;
  }

  StoreResult<std::optional<OutboxRow>> get(std::int64_t id) {
    Statement& q = st_.get;
    ResetOnExit reset(q);
    q.bind(1, id);
    const int rc = q.step();
    if (rc == SQLITE_DONE) return std::nullopt;
    if (rc != SQLITE_ROW) return std::unexpected(map_error(rc, "outbox get", db_.get()));
    auto row = decode_row(q);
    if (!row) return std::unexpected(unreadable(id, row.error()));
    return std::move(*row);
  }

  // An operator's changes: each with the low-water mark in its transaction, so that the relay,
  // whose next claim reads the mark, finds a row made pending again and the row given a dropped
  // newest row's id.
  StoreResult<bool> retry_dead(std::int64_t id, TimePoint now) {
    return in_transaction<bool>("outbox retry", [&]() -> StoreResult<bool> {
      Statement& q = st_.retry_dead;
      q.bind(1, id);
      q.bind(2, to_epoch_ms(now));
      if (auto done = q.run("outbox retry"); !done) return std::unexpected(done.error());
      if (sqlite3_changes(db_.get()) != 1) return false;
      if (st_.scan) {
        st_.lower_scan_to.bind(1, id);
        if (auto lowered = st_.lower_scan_to.run("outbox retry: move the scan back"); !lowered) {
          return std::unexpected(lowered.error());
        }
      }
      return true;
    });
  }

  StoreResult<bool> drop_dead(std::int64_t id) {
    return in_transaction<bool>("outbox drop", [&]() -> StoreResult<bool> {
      Statement& q = st_.drop_dead;
      q.bind(1, id);
      if (auto done = q.run("outbox drop"); !done) return std::unexpected(done.error());
      if (sqlite3_changes(db_.get()) != 1) return false;
      if (st_.scan) {
        if (auto lowered = st_.lower_scan_to_newest.run("outbox drop: move the scan back"); !lowered) {
          return std::unexpected(lowered.error());
        }
      }
      return true;
    });
  }

  StoreResult<Done> ping() { return st_.ping.run("outbox ping"); }

 private:
  std::optional<StoreError> relay_only(std::string_view what) const {
    if (options_.relay) return std::nullopt;
    return internal_error("sqlite: outbox " + std::string(what) +
                          ": this reader was opened for an operator (relay = false) and holds no relay lock");
  }

  // Moves the low-water mark past the rows the relay has settled (none to move before version 7).
  StoreResult<Done> advance_scan(std::string_view what) {
    if (!st_.scan) return Done{};
    return st_.advance_scan.run(std::string(what) + ": move the scan");
  }

  // Runs `body` in a write transaction, committing what it did. A failed COMMIT that was not
  // refused a lock may have reached the disk anyway: in doubt.
  template <class T, class Body>
  StoreResult<T> in_transaction(std::string_view what, Body&& body) {
    if (auto begun = st_.begin.run(std::string(what) + ": begin"); !begun) return std::unexpected(begun.error());
    StoreResult<T> result = body();
    if (!result) {
      rollback();
      return result;
    }
    if (auto committed = st_.commit.run(std::string(what) + ": commit"); !committed) {
      StoreError error = committed.error();
      const int primary = sqlite3_errcode(db_.get()) & 0xff;
      error.in_doubt = primary != SQLITE_BUSY && primary != SQLITE_LOCKED;
      rollback();
      return std::unexpected(std::move(error));
    }
    return result;
  }

  void rollback() {
    if (!sqlite3_get_autocommit(db_.get())) (void)st_.rollback.run("outbox: rollback");
  }

  const SqliteOutboxOptions options_;
  std::optional<sqlite_detail::RelayLock> lock_;  // released last, once the connection is closed
  sqlite_detail::Connection db_;
  Statements st_;  // after db_: finalized before the connection closes
};

std::string SqliteOutbox::lock_path(const std::string& database_path) { return database_path + "-relay.lock"; }

StoreResult<std::unique_ptr<SqliteOutbox>> SqliteOutbox::open_reader(SqliteOutboxOptions options) {
  if (options.path.empty()) return std::unexpected(internal_error("sqlite: SqliteOutboxOptions::path is empty"));
  if (options.path == ":memory:") {
    return std::unexpected(internal_error("sqlite: an outbox lives in a database file, not in :memory:"));
  }
  // SQLite would create a missing file; a relay or idemctl pointed at a mistyped path must not
  // turn it into an empty outbox that has nothing to say.
  struct stat info {};
  if (::stat(options.path.c_str(), &info) != 0) {
    const int err = errno;
    if (err == ENOENT) {
      return std::unexpected(StoreError{StoreErrc::unavailable,
                                        "sqlite: the outbox database " + options.path +
                                            " does not exist (the service makes it; idem-relay and idemctl never do)"});
    }
    return std::unexpected(
        StoreError{StoreErrc::unavailable, "sqlite: cannot open " + options.path + ": " + std::strerror(err)});
  }

  std::optional<sqlite_detail::RelayLock> lock;
  if (options.relay) {
    auto taken = sqlite_detail::RelayLock::acquire(lock_path(options.path), options.path);
    if (!taken) return std::unexpected(taken.error());
    lock.emplace(std::move(*taken));
  }
  auto db = sqlite_detail::open_connection(options.path, static_cast<int>(options.busy_timeout.count()),
                                           /*create=*/false);
  if (!db) return std::unexpected(db.error());
  sqlite3* raw = db->get();
  if (options.relay) {
    // WAL: the relay's reads never block the service's writes, nor its writes the service's reads.
    if (auto wal = sqlite_detail::enable_wal(raw, options.path, static_cast<int>(options.busy_timeout.count()));
        !wal) {
      return std::unexpected(wal.error());
    }
    if (auto sync = sqlite_detail::exec(raw, "PRAGMA synchronous = FULL", "set synchronous"); !sync) {
      return std::unexpected(sync.error());
    }
  }
  if (auto ready = sqlite_detail::ensure_outbox(raw, options.relay, options.path); !ready) {
    return std::unexpected(ready.error());
  }
  auto statements = prepare_statements(raw);
  if (!statements) return std::unexpected(statements.error());
  return std::unique_ptr<SqliteOutbox>(new SqliteOutbox(
      std::make_unique<Impl>(std::move(options), std::move(lock), std::move(*db), std::move(*statements))));
}

SqliteOutbox::SqliteOutbox(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
SqliteOutbox::~SqliteOutbox() = default;

StoreResult<std::vector<OutboxRow>> SqliteOutbox::claim(const OutboxClaim& claim) { return impl_->claim(claim); }
StoreResult<Done> SqliteOutbox::settle(const std::vector<OutboxResult>& results, TimePoint now,
                                       const std::string& owner) {
  return impl_->settle(results, now, owner);
}
StoreResult<std::size_t> SqliteOutbox::purge_sent(TimePoint before, std::size_t limit) {
  return impl_->purge_sent(before, limit);
}
StoreResult<OutboxCounts> SqliteOutbox::count() { return impl_->count(); }
StoreResult<std::vector<OutboxRow>> SqliteOutbox::list(const OutboxQuery& query) { return impl_->list(query); }
StoreResult<std::optional<OutboxRow>> SqliteOutbox::get(std::int64_t id) { return impl_->get(id); }
StoreResult<bool> SqliteOutbox::retry_dead(std::int64_t id, TimePoint now) { return impl_->retry_dead(id, now); }
StoreResult<bool> SqliteOutbox::drop_dead(std::int64_t id) { return impl_->drop_dead(id); }
StoreResult<Done> SqliteOutbox::ping() { return impl_->ping(); }

}  // namespace idem
