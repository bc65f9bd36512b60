#include "errors.hpp"

#include <string>

namespace idem::postgres_detail {

Failure map_error(Cause cause, std::string_view sqlstate, std::string_view detail, const Exchange& exchange) {
  Failure f;
  std::string message = "postgres: " + std::string(exchange.what) + ": " + std::string(detail);
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
  // Whether a write may have committed although we got no answer saying so.
  bool maybe_committed = exchange.writes && exchange.commit_sent;

  switch (cause) {
    case Cause::connection_lost:
      // Whatever was sent may or may not have been executed and committed.
      f.error.code = StoreErrc::unavailable;
      f.poison = true;
      break;
    case Cause::client_timeout:
      // The server may still be working on (and commit) what we sent; we stop listening.
      f.error.code = StoreErrc::timeout;
      f.poison = true;
      message += " (no answer in time; connection abandoned)";
      break;
    case Cause::server: {
      message += " (SQLSTATE " + std::string(sqlstate) + ")";
      const std::string_view cls = sqlstate.substr(0, 2);
      // A server error for a statement means its transaction aborted: nothing of it committed.
      // Only the errors that end the session may arrive after a commit (a shutdown signal caught
      // between the commit and the answer), so only those keep the doubt.
      bool ends_session = false;
      if (sqlstate == "40001" || sqlstate == "40P01") {
        // serialization_failure, deadlock_detected: the transaction rolled back; run it again.
        f.error.code = StoreErrc::unavailable;
        f.retry = true;
      } else if (sqlstate == "57014" || sqlstate == "55P03") {
        // query_canceled (statement_timeout), lock_not_available (lock_timeout).
        f.error.code = StoreErrc::timeout;
      } else if (cls == "08" || cls == "57") {
        // Connection exceptions; admin/crash shutdown, cannot connect now, database dropped.
        f.error.code = StoreErrc::unavailable;
        f.poison = true;
        ends_session = true;
      } else if (sqlstate == "25P03") {
        // idle_in_transaction_session_timeout: the server closed the session.
        f.error.code = StoreErrc::unavailable;
        f.poison = true;
        ends_session = true;
      } else if (sqlstate == "25006") {
        // read_only_sql_transaction: we reached a standby (e.g. after a failover); a new
        // connection may find the primary (target_session_attrs=read-write in the conninfo).
        f.error.code = StoreErrc::unavailable;
        f.poison = true;
      } else if (cls == "53" || cls == "58") {
        // Insufficient resources (disk full, too many connections), system/I/O errors: the server's
        // trouble, which an operator can fix; the same call may succeed later.
        f.error.code = StoreErrc::unavailable;
      } else if (cls == "28" || sqlstate == "3D000" || sqlstate == "3F000" || sqlstate == "42501") {
        // The server refuses this role, database, schema or privilege: a configuration problem,
        // fixed outside; until then the store is as good as unreachable.
        f.error.code = StoreErrc::unavailable;
      } else if (sqlstate == "XX001" || sqlstate == "XX002") {
        f.error.code = StoreErrc::corrupt;  // data_corrupted, index_corrupted
      } else if (cls == "42" || sqlstate == "0A000" || sqlstate == "26000") {
        // The schema changed under us (a dropped table, a cached plan that no longer fits): a new
        // connection prepares its statements afresh.
        f.error.code = StoreErrc::internal;
        f.poison = true;
        f.isolate = true;
      } else {
        // Data exceptions, constraint violations, anything else: this statement is refused; in a
        // batch, the others deserve to run without it.
        f.error.code = StoreErrc::internal;
        f.isolate = true;
      }
      maybe_committed = maybe_committed && ends_session;
      break;
    }
  }
  f.error.in_doubt = maybe_committed;
  if (maybe_committed) message += "; the write may or may not have been committed";
  f.error.message = std::move(message);
  return f;
}

}  // namespace idem::postgres_detail
