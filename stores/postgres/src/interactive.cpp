#include "interactive.hpp"

#include <exception>
#include <utility>

namespace idem {

namespace pd = postgres_detail;
using pd::Session;
using pd::Stmt;

StoreResult<PostgresResult> PostgresTransaction::exec(std::string_view sql,
                                                      std::span<const std::optional<std::string>> params) {
  pd::Params p;
  for (const auto& value : params) p.text_form(value ? value->c_str() : nullptr);
  auto r = session_.sql(std::string(sql), p, 0, pd::Exchange{"application statement", true, false});
  if (!r) {
    if (!session_.app_failure) session_.app_failure = r.error();
    return std::unexpected(r.error());
  }
  PostgresResult out;
  const PGresult* res = r->get();
  out.affected = pd::affected_rows(res);
  const int rows = PQntuples(res), cols = PQnfields(res);
  out.rows.reserve(static_cast<std::size_t>(rows));
  for (int i = 0; i < rows; ++i) {
    PostgresRow row;
    row.reserve(static_cast<std::size_t>(cols));
    for (int j = 0; j < cols; ++j) {
      if (PQgetisnull(res, i, j)) {
        row.emplace_back(std::nullopt);
      } else {
        row.emplace_back(std::string(PQgetvalue(res, i, j), static_cast<std::size_t>(PQgetlength(res, i, j))));
      }
    }
    out.rows.push_back(std::move(row));
  }
  return out;
}

pg_conn* PostgresTransaction::native_handle() const { return session_.conn(); }

const std::string& PostgresTransaction::schema() const { return session_.schema(); }

namespace postgres_detail {
namespace {

// The record's state and expiry, locked until the end of the transaction; nullopt when absent.
StoreResult<std::optional<std::pair<std::string, TimePoint>>> lock_record(Session& s, const RecordId& id,
                                                                         std::string_view what) {
  Params p;
  p.text(id.tenant);
  p.text(id.key);
  auto r = s.run(Stmt::lock_record, p, {what, false, false});
  if (!r) return std::unexpected(r.error());
  if (PQntuples(r->get()) == 0) return std::nullopt;
  Reader in(r->get(), 0);
  std::pair<std::string, TimePoint> found{std::string(in.bytes(0)), from_epoch_ms(in.int8(1))};
  if (!in.ok()) return std::unexpected(StoreError{StoreErrc::corrupt, "postgres: record has a malformed expiry"});
  return found;
}

}  // namespace

StoreResult<AdminStatus> run_mark_retryable(Session& s, const RecordId& id, TimePoint now) {
  return in_transaction<AdminStatus>(s, "mark_retryable", [&]() -> StoreResult<std::pair<AdminStatus, bool>> {
    auto found = lock_record(s, id, "mark_retryable");
    if (!found) return std::unexpected(found.error());
    if (!*found || (*found)->second <= now) return std::pair{AdminStatus::not_found, false};
    if ((*found)->first == "completed") return std::pair{AdminStatus::wrong_state, false};
    Params p;
    p.text(id.tenant);
    p.text(id.key);
    p.int8(token_to_db(new_fencing_token()));  // fences out a holder still running
    if (auto r = s.run(Stmt::mark_retryable, p, {"mark_retryable", true, false}); !r) return std::unexpected(r.error());
    return std::pair{AdminStatus::done, true};
  });
}

StoreResult<AdminStatus> run_resolve(Session& s, const ResolveArgs& a) {
  return in_transaction<AdminStatus>(s, "resolve", [&]() -> StoreResult<std::pair<AdminStatus, bool>> {
    auto found = lock_record(s, a.id, "resolve");
    if (!found) return std::unexpected(found.error());
    if (!*found || (*found)->second <= a.now) return std::pair{AdminStatus::not_found, false};
    if ((*found)->first == "completed") return std::pair{AdminStatus::wrong_state, false};
    Params p;
    p.text(a.id.tenant);
    p.text(a.id.key);
    p.int8(token_to_db(new_fencing_token()));
    p.int4(a.response.status);
    p.bytea(a.headers);
    p.bytea(a.response.body);
    p.int8(to_epoch_ms(a.now));
    p.int8(to_epoch_ms(a.expires));
    if (auto r = s.run(Stmt::resolve, p, {"resolve", true, false}); !r) return std::unexpected(r.error());
    return std::pair{AdminStatus::done, true};
  });
}

StoreResult<FenceStatus> run_complete_in_transaction(Session& s, const CompleteWrite& w, PostgresWork& work) {
  constexpr std::string_view kWhat = "complete_in_transaction";
  if (auto begun = s.begin(kWhat); !begun) return std::unexpected(begun.error());
  auto fail = [&](StoreError error) -> StoreResult<FenceStatus> {
    s.rollback();
    return std::unexpected(std::move(error));
  };

  // Lock the record while we hold it: from here to the commit nobody can take it over.
  Params lock;
  bind_fence(w.req.fence, lock);
  auto locked = s.run(Stmt::lock_fenced, lock, {kWhat, false, false});
  if (!locked) return fail(locked.error());
  if (PQntuples(locked->get()) == 0) {
    s.rollback();
    return FenceStatus::lost;  // `work` must not run for a lost lease
  }

  std::string message;
  bool ok = false;
  try {
    PostgresTransaction tx(s);
    ok = work(tx, message);
  } catch (const std::exception& e) {
    message = std::string("threw: ") + e.what();
  } catch (...) {
    message = "threw a non-standard exception";
  }
  if (s.poisoned()) return std::unexpected(s.poison_error());  // no COMMIT was sent: nothing happened
  switch (PQtransactionStatus(s.conn())) {
    case PQTRANS_INTRANS:
      break;
    case PQTRANS_INERROR:
      ok = false;  // one of its statements failed, whatever it returned
      break;
    case PQTRANS_IDLE: {
      // It committed or rolled back the store's transaction: its own writes may be durable.
      StoreError error = internal_error("postgres: complete_in_transaction: work ended the store's transaction");
      error.in_doubt = true;
      return std::unexpected(error);
    }
    default:
      return std::unexpected(internal_error("postgres: complete_in_transaction: work left the connection busy"));
  }
  if (!ok) {
    if (message.empty()) message = "(no message)";
    if (s.app_failure) {
      StoreError error = *s.app_failure;  // keep its code: a timeout stays retryable
      error.message += "; work: " + message;
      return fail(error);
    }
    return fail(internal_error("postgres: complete_in_transaction: work failed: " + message));
  }

  Params p;
  bind_complete(w, p);
  auto updated = s.run(Stmt::complete, p, {kWhat, true, false});
  if (!updated) return fail(updated.error());
  if (affected_rows(updated->get()) != 1) {
    s.rollback();  // `work` changed the record itself: undo both
    return FenceStatus::lost;
  }
  if (auto committed = s.commit(kWhat); !committed) return std::unexpected(committed.error());
  return FenceStatus::ok;
}

}  // namespace postgres_detail
}  // namespace idem
