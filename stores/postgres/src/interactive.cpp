#include "interactive.hpp"

#include <algorithm>
#include <exception>
#include <optional>
#include <tuple>
#include <utility>

namespace idem {

namespace pd = postgres_detail;
using pd::Session;
using pd::Stmt;

StoreResult<PostgresResult> PostgresTransaction::exec(std::string_view sql,
                                                      std::span<const std::optional<std::string>> params) {
  pd::Params p;
  for (const auto& value : params) p.text_form(value ? value->c_str() : nullptr);
  auto r = session_.application_sql(std::string(sql), p, pd::Exchange{"application statement", true, false});
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

namespace {

// Runs the application's work in the session's open transaction: nullopt when it succeeded,
// else why not (its message; a failed statement aborts the transaction, whatever it returned).
// An error means the transaction as a whole is gone or unusable: the connection failed, or the
// work ended the transaction or left the connection busy.
StoreResult<std::optional<std::string>> run_work(Session& s, PostgresWork& work, std::string_view what) {
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
      StoreError error = internal_error(std::string("postgres: ").append(what) + ": work ended the store's transaction");
      error.in_doubt = true;
      return std::unexpected(error);
    }
    default:
      return std::unexpected(internal_error(std::string("postgres: ").append(what) + ": work left the connection busy"));
  }
  if (ok) return std::nullopt;
  return message.empty() ? std::string("(no message)") : message;
}

// The completion's UPDATE: ok, or lost when the record no longer carries the caller's token.
StoreResult<FenceStatus> write_completion(Session& s, const CompleteWrite& w, std::string_view what) {
  Params p;
  bind_complete(w, p);
  auto updated = s.run(Stmt::complete, p, {what, true, false});
  if (!updated) return std::unexpected(updated.error());
  return affected_rows(updated->get()) == 1 ? FenceStatus::ok : FenceStatus::lost;
}

}  // namespace

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

  auto failed = run_work(s, work, kWhat);
  if (!failed) return std::unexpected(failed.error());
  if (*failed) {
    if (s.app_failure) {
      StoreError error = *s.app_failure;  // keep its code: a timeout stays retryable
      error.message += "; work: " + **failed;
      return fail(error);
    }
    return fail(internal_error("postgres: complete_in_transaction: work failed: " + **failed));
  }

  auto completed = write_completion(s, w, kWhat);
  if (!completed) return fail(completed.error());
  if (*completed == FenceStatus::lost) {
    s.rollback();  // `work` changed the record itself: undo both
    return FenceStatus::lost;
  }
  if (auto committed = s.commit(kWhat); !committed) return std::unexpected(committed.error());
  return FenceStatus::ok;
}

namespace {

constexpr std::string_view kMany = "complete_many_in_transaction";

// Locks the fenced record of every item, in (tenant, key) order, the order every transaction of
// the store locks several records in, so none waits for another in a cycle; whether each item's
// caller still holds its record. From here to the commit nobody can take them over.
StoreResult<std::vector<bool>> lock_fenced_records(Session& s, const std::vector<WorkWrite>& items) {
  std::vector<std::size_t> order(items.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&items](std::size_t i, std::size_t j) {
    const RecordId& x = items[i].completion.req.fence.id;
    const RecordId& y = items[j].completion.req.fence.id;
    return std::tie(x.tenant, x.key, i) < std::tie(y.tenant, y.key, j);
  });
  std::vector<bool> held(items.size(), false);
  for (std::size_t i : order) {
    Params p;
    bind_fence(items[i].completion.req.fence, p);
    auto locked = s.run(Stmt::lock_fenced, p, {kMany, false, false});
    if (!locked) return std::unexpected(locked.error());
    held[i] = PQntuples(locked->get()) > 0;
  }
  return held;
}

// Why an item's work was declined: the failed statement's error (if one failed) and its message.
std::string declined_message(const Session& s, const std::string& message) {
  return s.app_failure ? s.app_failure->message + "; work: " + message : message;
}

}  // namespace

BatchResults<WorkResult> run_complete_many_in_transaction(Session& s, std::vector<WorkWrite>& items) {
  BatchResults<WorkResult> results(items.size());
  // The transaction as a whole failed while item `current` ran (items.size(): at the commit): it
  // rolls back, and every item fails with `cause`, in doubt only for those whose writes would
  // have committed (a work that ended the transaction itself may have committed them). Items that
  // failed on their own keep their error.
  auto abort_with = [&](StoreError cause, std::size_t current) {
    s.rollback();
    for (std::size_t j = 0; j < results.size(); ++j) {
      if (j < current && !results[j]) continue;
      const bool wrote = j == current || (j < current && results[j]->status == WorkStatus::committed);
      StoreError error = cause;
      error.in_doubt = cause.in_doubt && wrote;
      results[j] = std::unexpected(std::move(error));
    }
    return std::move(results);
  };
  auto roll_back_item = [&]() { return s.script("ROLLBACK TO SAVEPOINT idem_item", {kMany, false, false}); };

  // Before any item ran, nothing of them can be in doubt.
  auto nothing_ran = [&](StoreError cause) {
    s.rollback();
    cause.in_doubt = false;
    return BatchResults<WorkResult>(items.size(), std::unexpected(std::move(cause)));
  };
  if (auto begun = s.begin(kMany); !begun) return nothing_ran(begun.error());
  auto held = lock_fenced_records(s, items);
  if (!held) return nothing_ran(held.error());
  bool savepoint_open = false;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (!(*held)[i]) {
      results[i] = WorkResult{WorkStatus::lost};  // `work` must not run for a lost lease
      continue;
    }
    // The previous item's savepoint is released (its writes stay in the transaction) and this
    // item's opened, in one round trip.
    const char* savepoint_sql =
        savepoint_open ? "RELEASE SAVEPOINT idem_item; SAVEPOINT idem_item" : "SAVEPOINT idem_item";
    if (auto opened = s.script(savepoint_sql, {kMany, false, false}); !opened) return abort_with(opened.error(), i);
    savepoint_open = true;
    s.app_failure.reset();

    auto failed = run_work(s, items[i].work, kMany);
    if (!failed) return abort_with(failed.error(), i);
    if (*failed) {
      results[i] = WorkResult{WorkStatus::declined, declined_message(s, **failed)};
      if (auto undone = roll_back_item(); !undone) return abort_with(undone.error(), i);
      continue;
    }
    auto completed = write_completion(s, items[i].completion, kMany);
    if (!completed && s.poisoned()) return abort_with(completed.error(), i);
    if (!completed || *completed == FenceStatus::lost) {
      // A failed completion fails its item alone; a lost one means `work` changed the record
      // itself: undo both.
      results[i] = completed ? StoreResult<WorkResult>(WorkResult{WorkStatus::lost})
                             : StoreResult<WorkResult>(std::unexpected(completed.error()));
      if (auto undone = roll_back_item(); !undone) return abort_with(undone.error(), i);
      continue;
    }
    results[i] = WorkResult{WorkStatus::committed};
  }
  if (auto committed = s.commit(kMany); !committed) return abort_with(committed.error(), items.size());
  return results;
}

}  // namespace postgres_detail
}  // namespace idem
