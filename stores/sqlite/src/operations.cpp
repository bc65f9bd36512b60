#include "operations.hpp"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <limits>

#include "idem/headers_codec.hpp"
#include "writer_transaction.hpp"

namespace idem::sqlite_detail {
namespace {

// ---- SQL --------------------------------------------------------------------------------------

// What decode_record reads, in this order.
constexpr std::string_view kRecordColumns =
    "state, request_hash, fencing_token, lease_expires_ms, response_status, response_headers, response_body, "
    "created_ms, completed_ms, expires_ms, attempt, lookup";
constexpr int kRecordColumnCount = 12;

const std::string kSelectRecord =
    "SELECT " + std::string(kRecordColumns) + " FROM idempotency_keys WHERE tenant_id = ?1 AND key = ?2";

// A new key: the common case is this one statement.
constexpr std::string_view kInsertClaim =
    "INSERT INTO idempotency_keys "
    "(tenant_id, key, state, request_hash, fencing_token, lease_expires_ms, created_ms, expires_ms, attempt, lookup) "
    "VALUES (?1, ?2, 'in_progress', ?3, ?4, ?5, ?6, ?7, 1, ?8) "
    "ON CONFLICT (tenant_id, key) DO NOTHING";

// A takeover, conditional on the record being exactly the one decide_claim looked at.
constexpr std::string_view kTakeover =
    "UPDATE idempotency_keys SET state = 'in_progress', request_hash = ?3, fencing_token = ?4, "
    "lease_expires_ms = ?5, response_status = NULL, response_headers = NULL, response_body = NULL, "
    "created_ms = ?6, completed_ms = NULL, expires_ms = ?7, attempt = ?10, lookup = ?11 "
    "WHERE tenant_id = ?1 AND key = ?2 AND fencing_token = ?8 AND state = ?9";

// Fenced writes: they apply only while the caller's token is on an in-progress record.
constexpr std::string_view kComplete =
    "UPDATE idempotency_keys SET state = 'completed', response_status = ?4, response_headers = ?5, "
    "response_body = ?6, completed_ms = ?7, expires_ms = ?8 "
    "WHERE tenant_id = ?1 AND key = ?2 AND fencing_token = ?3 AND state = 'in_progress'";
constexpr std::string_view kFail =
    "UPDATE idempotency_keys SET state = 'failed_retryable', expires_ms = ?4 "
    "WHERE tenant_id = ?1 AND key = ?2 AND fencing_token = ?3 AND state = 'in_progress'";
constexpr std::string_view kRelease =
    "DELETE FROM idempotency_keys "
    "WHERE tenant_id = ?1 AND key = ?2 AND fencing_token = ?3 AND state = 'in_progress'";
constexpr std::string_view kAbandon =
    "UPDATE idempotency_keys SET lease_expires_ms = ?4 "
    "WHERE tenant_id = ?1 AND key = ?2 AND fencing_token = ?3 AND state = 'in_progress'";
constexpr std::string_view kCheckFence =
    "SELECT 1 FROM idempotency_keys "
    "WHERE tenant_id = ?1 AND key = ?2 AND fencing_token = ?3 AND state = 'in_progress'";

constexpr std::string_view kPurge =
    "DELETE FROM idempotency_keys WHERE rowid IN "
    "(SELECT rowid FROM idempotency_keys WHERE expires_ms <= ?1 LIMIT ?2)";

constexpr std::string_view kPing = "SELECT version FROM idem_schema_version";

// Operator actions (StoreAdmin): not fenced, they install a new token to fence any holder out.
constexpr std::string_view kAdminMarkRetryable =
    "UPDATE idempotency_keys SET state = 'failed_retryable', fencing_token = ?3 WHERE tenant_id = ?1 AND key = ?2";
constexpr std::string_view kAdminResolve =
    "UPDATE idempotency_keys SET state = 'completed', fencing_token = ?3, response_status = ?4, "
    "response_headers = ?5, response_body = ?6, completed_ms = ?7, expires_ms = ?8 "
    "WHERE tenant_id = ?1 AND key = ?2";
constexpr std::string_view kAdminCount =
    "SELECT coalesce(sum(expires_ms > ?1 AND state = 'in_progress'), 0), "
    "coalesce(sum(expires_ms > ?1 AND state = 'completed'), 0), "
    "coalesce(sum(expires_ms > ?1 AND state = 'failed_retryable'), 0), "
    "coalesce(sum(expires_ms <= ?1), 0) FROM idempotency_keys";

}  // namespace

StoreResult<Statements> prepare_statements(sqlite3* db) {
  Statements s;
  const std::pair<Statement*, std::string_view> all[] = {
      {&s.begin_immediate, "BEGIN IMMEDIATE"},
      {&s.begin_deferred, "BEGIN DEFERRED"},
      {&s.commit, "COMMIT"},
      {&s.rollback, "ROLLBACK"},
      {&s.savepoint, "SAVEPOINT idem_op"},
      {&s.release_savepoint, "RELEASE idem_op"},
      {&s.rollback_to_savepoint, "ROLLBACK TO idem_op"},
      {&s.select_record, kSelectRecord},
      {&s.insert_claim, kInsertClaim},
      {&s.takeover, kTakeover},
      {&s.complete, kComplete},
      {&s.fail, kFail},
      {&s.release, kRelease},
      {&s.abandon, kAbandon},
      {&s.check_fence, kCheckFence},
      {&s.purge, kPurge},
      {&s.ping, kPing},
      {&s.admin_mark_retryable, kAdminMarkRetryable},
      {&s.admin_resolve, kAdminResolve},
      {&s.admin_count, kAdminCount},
  };
  for (const auto& [statement, sql] : all) {
    auto prepared = Statement::prepare(db, sql);
    if (!prepared) return std::unexpected(prepared.error());
    *statement = std::move(*prepared);
  }
  return s;
}

namespace ops {
namespace {

// Decodes the record columns (kRecordColumns, from column 0) of the current row.
StoreResult<Record> decode_record(const Statement& q, RecordId id) {
  auto corrupt = [&](std::string_view what) {
    return std::unexpected(StoreError{
        StoreErrc::corrupt, "sqlite: record (\"" + id.tenant + "\", \"" + id.key + "\"): " + std::string(what)});
  };
  Record r;
  const auto state = parse_record_state(q.text(0));
  if (!state) return corrupt("unknown state \"" + std::string(q.text(0)) + "\"");
  r.state = *state;
  r.request_hash = std::string(q.text(1));
  r.fencing_token = token_from_db(q.int64(2));
  r.lease_expires = from_epoch_ms(q.int64(3));
  r.created = from_epoch_ms(q.int64(7));
  if (!q.is_null(8)) r.completed = from_epoch_ms(q.int64(8));
  r.expires = from_epoch_ms(q.int64(9));
  // Migration 3 gave every older record attempt 1 and no lookup.
  const std::int64_t attempt = q.int64(10);
  if (attempt < 1 || attempt > UINT32_MAX) return corrupt("attempt " + std::to_string(attempt) + " out of range");
  r.attempt = static_cast<std::uint32_t>(attempt);
  r.lookup = std::string(q.text(11));
  if (r.state == RecordState::completed) {
    if (q.is_null(4)) return corrupt("completed without a response status");
    auto headers = decode_headers(q.blob(5));
    if (!headers) return corrupt("response_headers cannot be decoded");
    r.response = StoredResponse{static_cast<int>(q.int64(4)), std::move(*headers), std::string(q.blob(6))};
  }
  r.tenant = std::move(id.tenant);
  r.key = std::move(id.key);
  return r;
}

// Runs a fenced UPDATE or DELETE whose parameters are bound; lost when it matched no row.
StoreResult<FenceStatus> fenced_write(Db& db, Statement& q, Effects& fx, std::string_view what) {
  ResetOnExit reset(q);
  const int rc = q.step();
  if (rc != SQLITE_DONE) return std::unexpected(map_error(rc, what, db.raw));
  if (sqlite3_changes(db.raw) == 0) return FenceStatus::lost;
  fx.wrote = true;
  return FenceStatus::ok;
}

void bind_fence(Statement& q, const Fence& fence) {
  q.bind_text(1, fence.id.tenant);
  q.bind_text(2, fence.id.key);
  q.bind(3, token_to_db(fence.token));
}

}  // namespace

StoreResult<std::optional<Record>> read_record(Db& db, const RecordId& id) {
  Statement& q = db.st.select_record;
  ResetOnExit reset(q);
  q.bind_text(1, id.tenant);
  q.bind_text(2, id.key);
  const int rc = q.step();
  if (rc == SQLITE_DONE) return std::nullopt;
  if (rc != SQLITE_ROW) return std::unexpected(map_error(rc, "read record", db.raw));
  return decode_record(q, id);
}

// ---- operations -------------------------------------------------------------------------------

StoreResult<ClaimResult> run_claim(Db& db, const ClaimRequest& req, Effects& fx) {
  {
    // No record at all: decide_claim(nullopt) is always a fresh claim, so the INSERT decides.
    const Record fresh = claimed_record(req, std::nullopt);
    Statement& q = db.st.insert_claim;
    ResetOnExit reset(q);
    q.bind_text(1, fresh.tenant);
    q.bind_text(2, fresh.key);
    q.bind_text(3, fresh.request_hash);
    q.bind(4, token_to_db(fresh.fencing_token));
    q.bind(5, to_epoch_ms(fresh.lease_expires));
    q.bind(6, to_epoch_ms(fresh.created));
    q.bind(7, to_epoch_ms(fresh.expires));
    q.bind_text(8, fresh.lookup);
    const int rc = q.step();
    if (rc != SQLITE_DONE) return std::unexpected(map_error(rc, "insert claim", db.raw));
    if (sqlite3_changes(db.raw) == 1) {
      fx.wrote = true;
      return ClaimResult{ClaimStatus::claimed, ClaimKind::fresh, fresh};
    }
  }
  auto current = read_record(db, req.id);
  if (!current) return std::unexpected(current.error());
  if (!*current) return std::unexpected(internal_error("sqlite: claim: the conflicting record vanished"));
  const ClaimDecision decision = decide_claim(*current, req);
  if (decision.status != ClaimStatus::claimed) return ClaimResult{decision.status, decision.kind, std::move(**current)};

  Record next = claimed_record(req, *current);
  Statement& q = db.st.takeover;
  ResetOnExit reset(q);
  q.bind_text(1, next.tenant);
  q.bind_text(2, next.key);
  q.bind_text(3, next.request_hash);
  q.bind(4, token_to_db(next.fencing_token));
  q.bind(5, to_epoch_ms(next.lease_expires));
  q.bind(6, to_epoch_ms(next.created));
  q.bind(7, to_epoch_ms(next.expires));
  q.bind(8, token_to_db((*current)->fencing_token));
  q.bind_text(9, to_string((*current)->state));
  q.bind(10, static_cast<std::int64_t>(next.attempt));
  q.bind_text(11, next.lookup);
  const int rc = q.step();
  if (rc != SQLITE_DONE) return std::unexpected(map_error(rc, "take over claim", db.raw));
  // We hold the write lock since the read above, so the record cannot have changed.
  if (sqlite3_changes(db.raw) != 1) return std::unexpected(internal_error("sqlite: claim: takeover matched no row"));
  fx.wrote = true;
  return ClaimResult{ClaimStatus::claimed, decision.kind, std::move(next)};
}

StoreResult<FenceStatus> run_complete(Db& db, const CompleteRequest& req, Effects& fx) {
  Statement& q = db.st.complete;
  const std::string headers = encode_headers(req.response.headers);
  bind_fence(q, req.fence);
  q.bind(4, req.response.status);
  q.bind_blob(5, headers);
  q.bind_blob(6, req.response.body);
  q.bind(7, to_epoch_ms(req.now));
  q.bind(8, to_epoch_ms(req.expires));
  return fenced_write(db, q, fx, "complete");
}

StoreResult<FenceStatus> run_fail(Db& db, const FailRequest& req, Effects& fx) {
  Statement& q = db.st.fail;
  bind_fence(q, req.fence);
  q.bind(4, to_epoch_ms(req.expires));
  return fenced_write(db, q, fx, "fail");
}

StoreResult<FenceStatus> run_release(Db& db, const Fence& fence, Effects& fx) {
  Statement& q = db.st.release;
  bind_fence(q, fence);
  return fenced_write(db, q, fx, "release");
}

StoreResult<FenceStatus> run_abandon(Db& db, const AbandonRequest& req, Effects& fx) {
  Statement& q = db.st.abandon;
  bind_fence(q, req.fence);
  q.bind(4, to_epoch_ms(req.now));
  return fenced_write(db, q, fx, "abandon");
}

StoreResult<std::size_t> run_purge(Db& db, TimePoint now, std::size_t limit, Effects& fx) {
  Statement& q = db.st.purge;
  ResetOnExit reset(q);
  q.bind(1, to_epoch_ms(now));
  q.bind(2, static_cast<std::int64_t>(std::min<std::size_t>(limit, std::numeric_limits<std::int64_t>::max())));
  const int rc = q.step();
  if (rc != SQLITE_DONE) return std::unexpected(map_error(rc, "purge expired", db.raw));
  const auto deleted = static_cast<std::size_t>(sqlite3_changes64(db.raw));
  fx.wrote = deleted > 0;
  return deleted;
}

StoreResult<Done> run_ping(Db& db) {
  Statement& q = db.st.ping;
  return q.run("ping");
}

namespace {

// Whether the caller still holds the record: in progress under its token.
StoreResult<bool> holds(Db& db, const Fence& fence) {
  Statement& q = db.st.check_fence;
  ResetOnExit reset(q);
  bind_fence(q, fence);
  const int rc = q.step();
  if (rc == SQLITE_DONE) return false;
  if (rc != SQLITE_ROW) return std::unexpected(map_error(rc, "check fence", db.raw));
  return true;
}

// Runs the application's work; nullopt when it succeeded, else why not (its message, or what it
// threw).
std::optional<std::string> run_work(Db& db, SqliteWork& work) {
  std::string error;
  try {
    WriterTransaction marked(db.raw, db.st.outbox_insert);  // enqueue inside `work` reuses its INSERT
    if (work(db.raw, error)) return std::nullopt;
  } catch (const std::exception& e) {
    error = std::string("threw: ") + e.what();
  } catch (...) {
    error = "threw a non-standard exception";
  }
  return error.empty() ? std::string("(no message)") : error;
}

StoreError work_ended_transaction(std::string_view what) {
  return internal_error(std::string("sqlite: ").append(what) + ": work ended the store's transaction");
}

}  // namespace

StoreResult<FenceStatus> run_complete_in_transaction(Db& db, const CompleteRequest& req, SqliteWork& work,
                                                     Effects& fx) {
  auto held = holds(db, req.fence);
  if (!held) return std::unexpected(held.error());
  if (!*held) return FenceStatus::lost;  // `work` must not run for a lost lease
  const auto failed = run_work(db, work);
  if (sqlite3_get_autocommit(db.raw)) return std::unexpected(work_ended_transaction("complete_in_transaction"));
  if (failed) return std::unexpected(internal_error("sqlite: complete_in_transaction: work failed: " + *failed));
  auto status = run_complete(db, req, fx);
  if (status && *status == FenceStatus::lost) fx.rollback = true;  // `work` changed the record: undo both
  return status;
}

StoreResult<WorkResult> run_work_item(Db& db, SqliteWorkItem& item, Effects& fx) {
  auto held = holds(db, item.request.fence);
  if (!held) return std::unexpected(held.error());
  if (!*held) return WorkResult{WorkStatus::lost};  // `work` must not run for a lost lease
  auto failed = run_work(db, item.work);
  // The batch's other items are in this transaction too: the writer fails them all.
  if (sqlite3_get_autocommit(db.raw)) return std::unexpected(work_ended_transaction("complete_many_in_transaction"));
  if (failed) {
    fx.rollback = true;
    return WorkResult{WorkStatus::declined, std::move(*failed)};
  }
  auto status = run_complete(db, item.request, fx);
  if (!status) return std::unexpected(status.error());
  if (*status == FenceStatus::lost) {
    fx.rollback = true;  // `work` changed the record: undo both
    return WorkResult{WorkStatus::lost};
  }
  return WorkResult{WorkStatus::committed};
}

// ---- operator actions ---------------------------------------------------------------------------

StoreResult<std::vector<Record>> run_list(Db& db, const ListQuery& query) {
  // Admin paths are rare: the statement is built for the query's shape, so that paging walks
  // the primary key instead of filtering the whole table.
  std::string sql = "SELECT " + std::string(kRecordColumns) + ", tenant_id, key FROM idempotency_keys WHERE 1";
  if (query.state) sql += " AND state = ?1";
  if (query.after) sql += " AND (tenant_id, key) > (?2, ?3)";
  if (query.tenant) sql += " AND tenant_id = ?5";
  sql += " ORDER BY tenant_id, key LIMIT ?4";
  auto q = Statement::prepare(db.raw, sql);
  if (!q) return std::unexpected(q.error());
  if (query.state) q->bind_text(1, to_string(*query.state));
  if (query.after) {
    q->bind_text(2, query.after->tenant);
    q->bind_text(3, query.after->key);
  }
  if (query.tenant) q->bind_text(5, *query.tenant);
  q->bind(4, static_cast<std::int64_t>(std::min<std::size_t>(query.limit, std::numeric_limits<std::int64_t>::max())));
  std::vector<Record> records;
  int rc;
  while ((rc = q->step()) == SQLITE_ROW) {
    auto record = decode_record(
        *q, RecordId{std::string(q->text(kRecordColumnCount)), std::string(q->text(kRecordColumnCount + 1))});
    if (!record) return std::unexpected(record.error());
    records.push_back(std::move(*record));
  }
  if (rc != SQLITE_DONE) return std::unexpected(map_error(rc, "list records", db.raw));
  return records;
}

// The live record an operator acts on: not_found when absent or expired, wrong_state when
// completed (both actions refuse completed records).
namespace {
StoreResult<std::optional<AdminStatus>> admin_precondition(Db& db, const RecordId& id, TimePoint now) {
  auto current = read_record(db, id);
  if (!current) return std::unexpected(current.error());
  if (!*current || (*current)->expires <= now) return AdminStatus::not_found;
  if ((*current)->state == RecordState::completed) return AdminStatus::wrong_state;
  return std::nullopt;
}

}  // namespace

StoreResult<AdminStatus> run_mark_retryable(Db& db, const RecordId& id, TimePoint now, Effects& fx) {
  auto refused = admin_precondition(db, id, now);
  if (!refused) return std::unexpected(refused.error());
  if (*refused) return **refused;
  Statement& q = db.st.admin_mark_retryable;
  ResetOnExit reset(q);
  q.bind_text(1, id.tenant);
  q.bind_text(2, id.key);
  q.bind(3, token_to_db(new_fencing_token()));
  if (const int rc = q.step(); rc != SQLITE_DONE) return std::unexpected(map_error(rc, "mark retryable", db.raw));
  fx.wrote = true;
  return AdminStatus::done;
}

StoreResult<AdminStatus> run_resolve(Db& db, const RecordId& id, const StoredResponse& response, TimePoint now,
                                     TimePoint expires, Effects& fx) {
  auto refused = admin_precondition(db, id, now);
  if (!refused) return std::unexpected(refused.error());
  if (*refused) return **refused;
  const std::string headers = encode_headers(response.headers);
  Statement& q = db.st.admin_resolve;
  ResetOnExit reset(q);
  q.bind_text(1, id.tenant);
  q.bind_text(2, id.key);
  q.bind(3, token_to_db(new_fencing_token()));
  q.bind(4, response.status);
  q.bind_blob(5, headers);
  q.bind_blob(6, response.body);
  q.bind(7, to_epoch_ms(now));
  q.bind(8, to_epoch_ms(expires));
  if (const int rc = q.step(); rc != SQLITE_DONE) return std::unexpected(map_error(rc, "resolve", db.raw));
  fx.wrote = true;
  return AdminStatus::done;
}

StoreResult<StateCounts> run_count(Db& db, TimePoint now) {
  Statement& q = db.st.admin_count;
  ResetOnExit reset(q);
  q.bind(1, to_epoch_ms(now));
  if (const int rc = q.step(); rc != SQLITE_ROW) return std::unexpected(map_error(rc, "count records", db.raw));
  StateCounts counts;
  counts.in_progress = static_cast<std::uint64_t>(q.int64(0));
  counts.completed = static_cast<std::uint64_t>(q.int64(1));
  counts.failed_retryable = static_cast<std::uint64_t>(q.int64(2));
  counts.expired = static_cast<std::uint64_t>(q.int64(3));
  return counts;
}

}  // namespace ops
}  // namespace idem::sqlite_detail
