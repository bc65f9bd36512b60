#pragma once

// The schema (SPEC §6) and its versioned migrations, and the statements the store prepares on
// every connection.

#include <chrono>
#include <string>

#include "connection.hpp"

namespace idem::postgres_detail {

/// The version the last migration brings a schema to.
int latest_schema_version();

/// Brings `schema` to `target` (the latest version but in the migration tests, which make
/// schemas of older versions), creating it if missing, when `run_migrations`, under a
/// transaction-level advisory lock so that replicas starting at once migrate it once; otherwise
/// only checks it. A schema newer than this build is StoreErrc::corrupt.
std::expected<Done, Failure> migrate(PGconn* conn, const std::string& schema, bool run_migrations,
                                     std::chrono::milliseconds silence, int target = latest_schema_version());

/// Makes sure `schema` has the outbox table (migration 2's), for an outbox reader on a database
/// that may hold no idem store: when it has none, creates it (and the schema) under the
/// migration lock if `create`, else fails (StoreErrc::internal). Refuses a schema whose idem
/// version is newer than this build. Takes no lock when the table is there.
std::expected<Done, Failure> ensure_outbox(PGconn* conn, const std::string& schema, bool create,
                                           std::chrono::milliseconds silence);

/// The statements every connection prepares, by name.
enum class Stmt : unsigned char {
  claim,
  complete,
  fail,
  release,
  get,
  ping,
  purge,
  list_all,
  list_after,
  list_tenant,
  list_tenant_after,
  count,
  lock_fenced,
  lock_record,
  mark_retryable,
  resolve,
  abandon,
};
inline constexpr int kStatementCount = static_cast<int>(Stmt::abandon) + 1;

/// The prepared statement's name on the connection.
const char* statement_name(Stmt stmt);

/// The statement's SQL for tables in `schema`.
std::string statement_sql(Stmt stmt, const std::string& schema);

/// How many columns describe a record in the statements' results: state, request_hash,
/// fencing_token, lease_expires_ms, response_status, response_headers, response_body, created_ms,
/// completed_ms, expires_ms, attempt, lookup (the table's order, after any leading tenant_id, key).
inline constexpr int kRecordColumnCount = 12;

}  // namespace idem::postgres_detail
