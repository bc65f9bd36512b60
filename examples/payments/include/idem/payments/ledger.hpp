#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "idem/outbox.hpp"

struct sqlite3;

// The payments example's business logic: plain functions over an SQLite connection, no HTTP.
//
// Every write is split in two so that the same logic serves both modes of the service:
//   plan_*  reads the ledger and decides the answer (and the writes it needs), without writing;
//   apply   performs the planned writes, each guarded so that it refuses (Applied::stale) when
//           the ledger changed since planning (e.g. the balance dropped below the amount).
// Off mode runs plan and apply in one BEGIN IMMEDIATE transaction (never stale). In-process
// mode plans on the service's read connection and applies inside the idempotency store's
// transaction (SqliteStore::complete_in_transaction), re-planning when apply reports stale.
namespace idem::payments {

/// What the service answers: an HTTP status and a JSON body (application/json for 2xx,
/// application/problem+json otherwise).
struct Outcome {
  int status = 200;
  std::string body;
  /// Whether the body is an RFC 9457 problem.
  bool problem() const { return status >= 400; }
};

/// The writes a plan needs.
enum class Op : std::uint8_t { none, open_account, transfer, order, bonus, refund };

/// A decided request: the answer to give once its writes (if any) are applied.
struct Plan {
  Outcome outcome;
  Op op = Op::none;
  std::string id;           ///< the new row's id (acct_..., pay_..., ord_..., bon_..., re_...)
  /// open_account/order/bonus: the account; transfer: the payer; refund: the refunded payment's
  /// payee, whose account the money leaves again
  std::string account;
  std::string to;           ///< transfer: the payee; refund: the payment's payer, credited back
  std::string payment;      ///< refund: the payment refunded (pay_...)
  std::int64_t amount = 0;  ///< minor units
  std::string currency;     ///< ISO 4217, upper case
  std::string description;  ///< order only
  std::int64_t created = 0; ///< Unix seconds
  std::string request_key;  ///< the Idempotency-Key the request came with ("" if none)
  std::string request_tenant;  ///< the tenant that key belongs to (the gateway's Idempotency-Tenant)
  /// The events apply enqueues in the outbox (idem_outbox, docs/outbox.md), in the same
  /// transaction as its writes; with_events fills them (a transfer's payment.succeeded, a
  /// refund's payment.refunded), checked already, so that the store's writer only inserts them.
  std::vector<CheckedOutboxMessage> events;
};

/// The result of apply.
enum class Applied : std::uint8_t {
  ok,     ///< every write done
  stale,  ///< a guard failed: nothing written by this call; plan again
  error,  ///< SQLite failed; `error` says why
};

/// Creates the ledger's tables if missing. Returns false with `error` set on failure.
bool migrate(sqlite3* db, std::string& error);

/// POST /v1/accounts {"currency", "balance"?}: balance is the opening balance (default 0).
Plan plan_open_account(sqlite3* db, std::string_view body, std::string id, std::int64_t now);
/// POST /v1/payments {"from","to","amount","currency"}: 201; 402 insufficient_funds;
/// 404 account_not_found; 422 currency_mismatch; 400 for malformed input.
Plan plan_payment(sqlite3* db, std::string_view body, std::string id, std::int64_t now);
/// POST /v1/orders {"account","amount","currency","description"?}: records an order (no money moves).
Plan plan_order(sqlite3* db, std::string_view body, std::string id, std::int64_t now);
/// POST /v1/bonuses {"account","amount","currency"}: credits the account (an accrual).
Plan plan_bonus(sqlite3* db, std::string_view body, std::string id, std::int64_t now);
/// POST /v1/refunds {"payment"}: refunds the whole payment, once (the refunds table holds at most
/// one row per payment): the payee is debited, the payer credited. 201 the refund
/// {"id","object":"refund","payment","amount","currency","created"}; 404 payment_not_found;
/// 409 payment_already_refunded; 402 insufficient_funds when the payee no longer holds the
/// amount; 400 for malformed input.
Plan plan_refund(sqlite3* db, std::string_view body, std::string id, std::int64_t now);

/// The event a succeeded payment publishes: id "<pay_id>/payment.succeeded" (stable, so that
/// consumers dedupe by it), body {"type": "payment.succeeded", "payment": {...the 201 body...}},
/// header event-type, ordering key the payment id: the relay publishes a payment's events one at a
/// time in commit order (docs/outbox.md, "Order, per ordering key").
OutboxMessage payment_succeeded(const Plan& plan);

/// The event a refund publishes: id "<pay_id>/payment.refunded" (a payment is refunded at most
/// once), body {"type": "payment.refunded", "refund": {...the 201 body...}}, header event-type,
/// ordering key the payment id, as its payment.succeeded's: the relay never publishes a
/// payment's refund before its success.
OutboxMessage payment_refunded(const Plan& plan);

/// Fills plan.events with what its writes publish (a transfer: payment_succeeded; a refund:
/// payment_refunded). The service calls it where it plans, not inside apply, so that building
/// and checking the events stays off the store's single writer thread. An event the outbox would
/// refuse (a bug of this service's, not the client's) turns the plan into a 500 that writes nothing.
void with_events(Plan& plan);

/// Performs a plan's writes on `db`, inside the caller's transaction, and enqueues its events
/// (Plan::events) in the same transaction.
Applied apply(sqlite3* db, const Plan& plan, std::string& error);

/// One keyed request's attempt, as the gateway tells it (docs/security.md): Idempotency-Tenant,
/// the key, Idempotency-Attempt. `attempt` 0: none (the request did not come through a gateway).
struct AttemptFence {
  std::string tenant;
  std::string key;
  std::uint32_t attempt = 0;
};

/// What check_attempt found.
enum class FenceCheck : std::uint8_t {
  passed,  ///< no higher attempt of this key was seen; this one is now the highest
  stale,   ///< a higher attempt was seen: this request's holder was fenced out; write nothing
  error,   ///< SQLite failed; `error` says why
};

/// Records `fence.attempt` as seen for (tenant, key) unless a higher one was, inside the caller's
/// transaction (so that the check and the writes it guards commit together).
FenceCheck check_attempt(sqlite3* db, const AttemptFence& fence, std::string& error);

/// 409 idempotency_attempt_stale: what a fenced-out request is answered (a retry gets the outcome).
Outcome stale_attempt(const AttemptFence& fence);

/// Plans and applies in one BEGIN IMMEDIATE transaction on `db` (the service without in-process
/// idempotency), unless `fence` is stale (409, nothing written). `make_plan` is one of the plan_*
/// functions bound to its arguments.
template <class MakePlan>
Outcome execute_now(sqlite3* db, const AttemptFence& fence, MakePlan&& make_plan);

/// GET /v1/payments/by-idempotency-key/{key}, the gateway's lookup (on_lease_expiry = "ask"):
/// records `fence.attempt` as seen and reads the payment made by (fence.tenant, fence.key), in one
/// transaction. 200 with the payment (the body its 201 had), 404 payment_not_found when none was
/// made, 503 when the ledger failed.
Outcome lookup_payment(sqlite3* db, const AttemptFence& fence);

/// GET /v1/accounts/{id}: 200 with the balance, or 404.
Outcome get_account(sqlite3* db, std::string_view id);
/// GET /v1/payments/{id}: 200, or 404.
Outcome get_payment(sqlite3* db, std::string_view id);

/// A fresh id with the given prefix: 12 hex digits of the time in ms, then 16 random ones, e.g.
/// "pay_01a22c3cb2a3e6701c60ae75d084" (time-ordered, so that new rows append to their indexes).
std::string new_id(std::string_view prefix);

/// A problem outcome: {"type","title","status","detail","code"}.
Outcome problem(int status, std::string_view code, std::string_view title, std::string_view detail);

// ---- implementation of the template -----------------------------------------------------------

/// BEGIN IMMEDIATE / COMMIT / ROLLBACK helpers for execute_now; false with `error` on failure.
bool begin_immediate(sqlite3* db, std::string& error);
bool commit(sqlite3* db, std::string& error);
void rollback(sqlite3* db);

template <class MakePlan>
Outcome execute_now(sqlite3* db, const AttemptFence& fence, MakePlan&& make_plan) {
  std::string error;
  if (!begin_immediate(db, error)) return problem(503, "ledger_unavailable", "The ledger is unavailable", error);
  // Before planning: a fenced-out holder must not even answer from the ledger (a 402 planned on
  // balances the newer attempt already changed would tell its client the wrong outcome).
  if (const FenceCheck checked = check_attempt(db, fence, error); checked != FenceCheck::passed) {
    rollback(db);
    if (checked == FenceCheck::stale) return stale_attempt(fence);
    return problem(503, "ledger_unavailable", "The ledger is unavailable", error);
  }
  Plan plan = make_plan(db);
  const Applied applied = apply(db, plan, error);
  if (applied != Applied::ok || !commit(db, error)) {
    rollback(db);
    return problem(503, "ledger_unavailable", "The ledger is unavailable",
                   applied == Applied::stale ? "the ledger changed during the request" : error);
  }
  return std::move(plan.outcome);
}

}  // namespace idem::payments
