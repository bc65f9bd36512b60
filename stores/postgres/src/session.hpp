#pragma once

// The store's side of an interactive transaction (complete_in_transaction, the operator's
// actions): one connection taken out of pipeline mode for the transaction's round trips.

#include <chrono>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "connection.hpp"
#include "idem/postgres_store.hpp"
#include "schema.hpp"

namespace idem {

namespace pd = postgres_detail;

/// The store's side of a PostgresTransaction: one connection outside pipeline mode, for an
/// interactive transaction. A failure that poisons the connection makes every later call fail.
class PostgresTransaction::Session {
 public:
  Session(PGconn* conn, std::chrono::milliseconds silence, const std::string& schema)
      : conn_(conn), silence_(silence), schema_(schema) {}

  PGconn* conn() const { return conn_; }
  const std::string& schema() const { return schema_; }
  bool poisoned() const { return poison_.has_value(); }
  const StoreError& poison_error() const { return *poison_; }

  StoreResult<pd::Result> run(pd::Stmt stmt, const pd::Params& params, const pd::Exchange& ex) {
    if (poison_) return std::unexpected(*poison_);
    return settle(pd::exec_prepared(conn_, pd::statement_name(stmt), params, silence_, ex));
  }
  StoreResult<pd::Result> sql(const std::string& sql, const pd::Params& params, int result_format,
                              const pd::Exchange& ex) {
    if (poison_) return std::unexpected(*poison_);
    return settle(pd::exec(conn_, sql, params, result_format, silence_, ex));
  }
  /// An application's statement (PostgresTransaction::exec). A server's error that left the
  /// connection alive with only the transaction aborted (a missing table, a constraint) does not
  /// poison the session, whatever it would mean for the store's own statements: a savepoint can
  /// undo it (complete_many_in_transaction's items), or the transaction rolls back.
  StoreResult<pd::Result> application_sql(const std::string& sql, const pd::Params& params, const pd::Exchange& ex) {
    if (poison_) return std::unexpected(*poison_);
    auto r = pd::exec(conn_, sql, params, 0, silence_, ex);
    if (!r && r.error().poison && PQstatus(conn_) == CONNECTION_OK && PQtransactionStatus(conn_) == PQTRANS_INERROR) {
      r.error().poison = false;
    }
    return settle(std::move(r));
  }
  StoreResult<Done> begin(std::string_view what) { return simple("BEGIN", {what, false, false}); }
  StoreResult<Done> commit(std::string_view what) { return simple("COMMIT", {what, true, true}); }
  // Rolls back; a failure here leaves the connection poisoned, which is all that matters.
  void rollback() {
    if (!poison_ && PQtransactionStatus(conn_) != PQTRANS_IDLE) (void)simple("ROLLBACK", {"rollback", false, false});
  }

  /// Runs statements without parameters in one round trip (simple protocol): e.g. releasing one
  /// savepoint and opening the next.
  StoreResult<Done> script(const std::string& sql, const pd::Exchange& ex) {
    if (poison_) return std::unexpected(*poison_);
    auto r = pd::exec_script(conn_, sql, silence_, ex);
    if (r) return Done{};
    if (r.error().poison) poison_ = r.error().error;
    return std::unexpected(r.error().error);
  }

  std::optional<StoreError> app_failure;  // the first failure of the application's statements

 private:
  StoreResult<Done> simple(const char* sql, const pd::Exchange& ex) {
    auto r = this->sql(sql, pd::Params{}, 0, ex);
    if (!r) return std::unexpected(r.error());
    return Done{};
  }
  StoreResult<pd::Result> settle(std::expected<pd::Result, pd::Failure> r) {
    if (r) return std::move(*r);
    if (r.error().poison) poison_ = r.error().error;
    return std::unexpected(r.error().error);
  }

  PGconn* conn_;
  std::chrono::milliseconds silence_;
  const std::string& schema_;  // the store's options outlive every transaction
  std::optional<StoreError> poison_;
};

namespace postgres_detail {

using Session = PostgresTransaction::Session;

// Runs `step` between BEGIN and COMMIT. It returns the answer and whether to commit it (false:
// roll back, e.g. nothing to change); an error rolls back.
template <class T, class Step>
StoreResult<T> in_transaction(Session& s, std::string_view what, Step&& step) {
  if (auto begun = s.begin(what); !begun) return std::unexpected(begun.error());
  StoreResult<std::pair<T, bool>> answer = step();
  if (!answer || !answer->second) {
    s.rollback();
    if (!answer) return std::unexpected(answer.error());
    return std::move(answer->first);
  }
  if (auto committed = s.commit(what); !committed) return std::unexpected(committed.error());
  return std::move(answer->first);
}

}  // namespace postgres_detail
}  // namespace idem
