#include "idem/payments/ledger.hpp"

#include <sqlite3.h>

#include <nlohmann/json.hpp>
#include <openssl/rand.h>

#include <cctype>
#include <chrono>
#include <optional>

#include "idem/problem.hpp"
#include "idem/sqlite_outbox.hpp"

namespace idem::payments {
namespace {

using json = nlohmann::json;

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS accounts (
  id TEXT PRIMARY KEY, currency TEXT NOT NULL, balance INTEGER NOT NULL CHECK (balance >= 0),
  opening INTEGER NOT NULL, created INTEGER NOT NULL, request_key TEXT);
CREATE TABLE IF NOT EXISTS payments (
  id TEXT PRIMARY KEY, from_account TEXT NOT NULL, to_account TEXT NOT NULL,
  amount INTEGER NOT NULL CHECK (amount > 0), currency TEXT NOT NULL, created INTEGER NOT NULL,
  request_key TEXT);
CREATE TABLE IF NOT EXISTS orders (
  id TEXT PRIMARY KEY, account TEXT NOT NULL, amount INTEGER NOT NULL, currency TEXT NOT NULL,
  description TEXT NOT NULL, created INTEGER NOT NULL, request_key TEXT);
CREATE TABLE IF NOT EXISTS bonuses (
  id TEXT PRIMARY KEY, account TEXT NOT NULL, amount INTEGER NOT NULL CHECK (amount > 0),
  currency TEXT NOT NULL, created INTEGER NOT NULL, request_key TEXT);
-- A payment is refunded at most once, and in full: payment_id is UNIQUE, whatever the service
-- planned (apply's guard relies on it).
CREATE TABLE IF NOT EXISTS refunds (
  id TEXT PRIMARY KEY, payment_id TEXT NOT NULL UNIQUE REFERENCES payments (id),
  amount INTEGER NOT NULL CHECK (amount > 0), currency TEXT NOT NULL, created INTEGER NOT NULL,
  request_key TEXT, request_tenant TEXT);
-- The highest Idempotency-Attempt seen for each (tenant, key) (docs/security.md): a request of a
-- lower attempt is a holder the gateway has fenced out, and writes nothing.
CREATE TABLE IF NOT EXISTS request_attempts (
  tenant TEXT NOT NULL, key TEXT NOT NULL, attempt INTEGER NOT NULL CHECK (attempt >= 1),
  PRIMARY KEY (tenant, key));
)sql";

// Added after the first release of the schema: the tenant a payment's key belongs to (the
// gateway's Idempotency-Tenant), which the lookup by key is scoped by, and the index it uses.
constexpr const char* kPaymentTenant = "ALTER TABLE payments ADD COLUMN request_tenant TEXT";
constexpr const char* kPaymentKeyIndex =
    "CREATE INDEX IF NOT EXISTS payments_request ON payments (request_tenant, request_key)";

// A prepared statement finalized on scope exit.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) { rc_ = sqlite3_prepare_v2(db, sql, -1, &s_, nullptr); }
  ~Stmt() { sqlite3_finalize(s_); }
  Stmt(const Stmt&) = delete;
  Stmt& operator=(const Stmt&) = delete;
  bool ok() const { return rc_ == SQLITE_OK; }
  Stmt& text(int i, std::string_view v) {
    sqlite3_bind_text(s_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Stmt& integer(int i, std::int64_t v) {
    sqlite3_bind_int64(s_, i, v);
    return *this;
  }
  int step() { return sqlite3_step(s_); }
  std::string col_text(int i) {
    const auto* p = sqlite3_column_text(s_, i);
    return p ? std::string(reinterpret_cast<const char*>(p), sqlite3_column_bytes(s_, i)) : std::string();
  }
  std::int64_t col_int(int i) { return sqlite3_column_int64(s_, i); }

 private:
  sqlite3_stmt* s_ = nullptr;
  int rc_ = SQLITE_ERROR;
};

struct Account {
  std::string id, currency;
  std::int64_t balance = 0;
};

// nullopt: absent (or the read failed, reported as absent only when `failed` is left false).
std::optional<Account> read_account(sqlite3* db, std::string_view id, bool& failed) {
  Stmt q(db, "SELECT id, currency, balance FROM accounts WHERE id = ?1");
  if (!q.ok()) {
    failed = true;
    return std::nullopt;
  }
  q.text(1, id);
  const int rc = q.step();
  if (rc == SQLITE_ROW) return Account{q.col_text(0), q.col_text(1), q.col_int(2)};
  if (rc != SQLITE_DONE) failed = true;
  return std::nullopt;
}

Plan refuse(Outcome outcome) {
  Plan p;
  p.outcome = std::move(outcome);
  return p;
}

Outcome bad_request(std::string_view detail) {
  return problem(400, "invalid_request", "The request is invalid", detail);
}
Outcome unavailable(sqlite3* db) {
  return problem(503, "ledger_unavailable", "The ledger is unavailable", sqlite3_errmsg(db));
}

// The request body as a JSON object, or the 400 to answer.
std::optional<json> parse_object(std::string_view body, Outcome& error) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    error = bad_request("the body must be a JSON object");
    return std::nullopt;
  }
  return j;
}

bool get_string(const json& j, const char* name, std::string& out, Outcome& error, bool required = true) {
  const auto it = j.find(name);
  if (it == j.end()) {
    if (required) error = bad_request(std::string("\"") + name + "\" is required");
    return !required;
  }
  if (!it->is_string() || it->get_ref<const std::string&>().empty() ||
      it->get_ref<const std::string&>().size() > 128) {
    error = bad_request(std::string("\"") + name + "\" must be a non-empty string of at most 128 characters");
    return false;
  }
  out = it->get<std::string>();
  return true;
}

// Amounts are integers in minor units; `min` is 1 for movements, 0 for an opening balance.
bool get_amount(const json& j, const char* name, std::int64_t min, std::int64_t& out, Outcome& error,
                bool required = true) {
  const auto it = j.find(name);
  if (it == j.end()) {
    if (required) error = bad_request(std::string("\"") + name + "\" is required");
    return !required;
  }
  constexpr std::int64_t kMax = 1'000'000'000'000'000;  // 10^15 minor units: far from overflow
  if (!it->is_number_integer() || it->get<std::int64_t>() < min || it->get<std::int64_t>() > kMax ||
      (it->is_number_unsigned() && it->get<std::uint64_t>() > static_cast<std::uint64_t>(kMax))) {
    error = bad_request(std::string("\"") + name + "\" must be an integer amount in minor units, at least " +
                        std::to_string(min));
    return false;
  }
  out = it->get<std::int64_t>();
  return true;
}

bool get_currency(const json& j, std::string& out, Outcome& error) {
  if (!get_string(j, "currency", out, error)) return false;
  const bool ok = out.size() == 3 && std::all_of(out.begin(), out.end(), [](char c) { return std::isalpha(static_cast<unsigned char>(c)); });
  if (!ok) {
    error = bad_request("\"currency\" must be a three-letter ISO 4217 code");
    return false;
  }
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return true;
}

// 402: `account` cannot pay `amount` for the `what` ("payment", "refund").
Outcome insufficient_funds(const Account& account, std::int64_t amount, std::string_view what) {
  return problem(402, "insufficient_funds", "Insufficient funds",
                 "account " + account.id + " has " + std::to_string(account.balance) + ", the " + std::string(what) +
                     " needs " + std::to_string(amount));
}

Outcome not_found(std::string_view what, std::string_view id) {
  return problem(404, std::string(what) + "_not_found", "Not found",
                 "no " + std::string(what) + " " + std::string(id));
}

// Common checks for one account and an amount in its currency; nullopt when the plan may proceed.
std::optional<Outcome> check_account(sqlite3* db, const std::string& id, const std::string& currency) {
  bool failed = false;
  auto a = read_account(db, id, failed);
  if (failed) return unavailable(db);
  if (!a) return not_found("account", id);
  if (a->currency != currency) {
    return problem(422, "currency_mismatch", "Currency mismatch",
                   "account " + id + " holds " + a->currency + ", not " + currency);
  }
  return std::nullopt;
}

bool exec(sqlite3* db, const char* sql, std::string& error) {
  char* msg = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &msg) == SQLITE_OK) return true;
  error = msg ? msg : sqlite3_errmsg(db);
  sqlite3_free(msg);
  return false;
}

// Runs a write; `changes_expected` rows must change, else stale.
Applied run(Stmt& s, sqlite3* db, int changes_expected, std::string& error) {
  if (!s.ok()) {
    error = sqlite3_errmsg(db);
    return Applied::error;
  }
  const int rc = s.step();
  if (rc != SQLITE_DONE) {
    error = sqlite3_errmsg(db);
    return Applied::error;
  }
  return sqlite3_changes(db) == changes_expected ? Applied::ok : Applied::stale;
}

}  // namespace

Outcome problem(int status, std::string_view code, std::string_view title, std::string_view detail) {
  return Outcome{status, problem_json(make_problem(status, std::string(code), std::string(title), std::string(detail)))};
}

// Time-ordered: the creation time in milliseconds (12 hex digits), then 64 random bits. A new
// payment's row, and its event's message id in the outbox's unique index, then land at the end of
// their b-trees instead of on a random page each, so that a batch's commit writes a few pages
// rather than one per row (docs/benchmarks.md measures it). The time is no secret: the body
// carries "created".
std::string new_id(std::string_view prefix) {
  unsigned char bytes[8];
  if (RAND_bytes(bytes, sizeof bytes) != 1) throw std::runtime_error("RAND_bytes failed");
  static constexpr char kHex[] = "0123456789abcdef";
  const auto ms = static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count());
  std::string id(prefix);
  for (int shift = 44; shift >= 0; shift -= 4) id += kHex[(ms >> shift) & 15];
  for (unsigned char b : bytes) {
    id += kHex[b >> 4];
    id += kHex[b & 15];
  }
  return id;
}

bool migrate(sqlite3* db, std::string& error) {
  if (!exec(db, kSchema, error)) return false;
  Stmt has(db, "SELECT count(*) FROM pragma_table_info('payments') WHERE name = 'request_tenant'");
  if (!has.ok() || has.step() != SQLITE_ROW) {
    error = sqlite3_errmsg(db);
    return false;
  }
  if (has.col_int(0) == 0 && !exec(db, kPaymentTenant, error)) return false;
  return exec(db, kPaymentKeyIndex, error);
}

FenceCheck check_attempt(sqlite3* db, const AttemptFence& fence, std::string& error) {
  if (fence.attempt == 0) return FenceCheck::passed;
  // Raises the stored number, or leaves it when it is higher: then this request is stale.
  Stmt s(db,
         "INSERT INTO request_attempts (tenant, key, attempt) VALUES (?1, ?2, ?3) "
         "ON CONFLICT (tenant, key) DO UPDATE SET attempt = excluded.attempt "
         "WHERE excluded.attempt >= request_attempts.attempt");
  s.text(1, fence.tenant).text(2, fence.key).integer(3, fence.attempt);
  if (!s.ok() || s.step() != SQLITE_DONE) {
    error = sqlite3_errmsg(db);
    return FenceCheck::error;
  }
  return sqlite3_changes(db) == 1 ? FenceCheck::passed : FenceCheck::stale;
}

Outcome stale_attempt(const AttemptFence& fence) {
  return problem(409, "idempotency_attempt_stale", "A later attempt of this request has been seen",
                 "attempt " + std::to_string(fence.attempt) +
                     " of this key was overtaken by a later one (its holder's lease ran out); nothing was "
                     "written: retry with the same key to get the outcome");
}

Outcome lookup_payment(sqlite3* db, const AttemptFence& fence) {
  std::string error;
  if (!begin_immediate(db, error)) return problem(503, "ledger_unavailable", "The ledger is unavailable", error);
  // The lookup's attempt is recorded before the answer, in one transaction with the read: a
  // holder of a lower attempt still running here can no longer write once the asker is told
  // "not found", so "not found" stays true.
  if (check_attempt(db, fence, error) == FenceCheck::error) {
    rollback(db);
    return problem(503, "ledger_unavailable", "The ledger is unavailable", error);
  }
  Outcome outcome;
  {
    Stmt q(db, "SELECT id FROM payments WHERE request_tenant = ?1 AND request_key = ?2 ORDER BY created, id LIMIT 1");
    q.text(1, fence.tenant).text(2, fence.key);
    const int rc = q.ok() ? q.step() : SQLITE_ERROR;
    if (rc == SQLITE_ROW) {
      outcome = get_payment(db, q.col_text(0));
    } else if (rc == SQLITE_DONE) {
      outcome = problem(404, "payment_not_found", "Not found", "no payment was made with this key");
    } else {
      outcome = unavailable(db);
    }
  }
  if (!commit(db, error)) {
    rollback(db);
    return problem(503, "ledger_unavailable", "The ledger is unavailable", error);
  }
  return outcome;
}

bool begin_immediate(sqlite3* db, std::string& error) { return exec(db, "BEGIN IMMEDIATE", error); }
bool commit(sqlite3* db, std::string& error) { return exec(db, "COMMIT", error); }
void rollback(sqlite3* db) {
  std::string ignored;
  if (!sqlite3_get_autocommit(db)) exec(db, "ROLLBACK", ignored);
}

Plan plan_open_account(sqlite3*, std::string_view body, std::string id, std::int64_t now) {
  Outcome error;
  auto j = parse_object(body, error);
  Plan p;
  p.amount = 0;
  if (!j || !get_currency(*j, p.currency, error) || !get_amount(*j, "balance", 0, p.amount, error, false)) {
    return refuse(error);
  }
  p.op = Op::open_account;
  p.id = std::move(id);
  p.account = p.id;
  p.created = now;
  p.outcome = Outcome{201, json{{"id", p.id}, {"object", "account"}, {"currency", p.currency},
                                {"balance", p.amount}, {"created", now}}.dump()};
  return p;
}

Plan plan_payment(sqlite3* db, std::string_view body, std::string id, std::int64_t now) {
  Outcome error;
  auto j = parse_object(body, error);
  Plan p;
  if (!j || !get_string(*j, "from", p.account, error) || !get_string(*j, "to", p.to, error) ||
      !get_amount(*j, "amount", 1, p.amount, error) || !get_currency(*j, p.currency, error)) {
    return refuse(error);
  }
  if (p.account == p.to) return refuse(bad_request("\"from\" and \"to\" must be different accounts"));
  bool failed = false;
  auto from = read_account(db, p.account, failed);
  auto to = read_account(db, p.to, failed);
  if (failed) return refuse(unavailable(db));
  if (!from) return refuse(not_found("account", p.account));
  if (!to) return refuse(not_found("account", p.to));
  if (from->currency != p.currency || to->currency != p.currency) {
    return refuse(problem(422, "currency_mismatch", "Currency mismatch",
                          "the payment is in " + p.currency + "; " + from->id + " holds " + from->currency +
                              " and " + to->id + " holds " + to->currency));
  }
  if (from->balance < p.amount) return refuse(insufficient_funds(*from, p.amount, "payment"));
  p.op = Op::transfer;
  p.id = std::move(id);
  p.created = now;
  p.outcome = Outcome{201, json{{"id", p.id}, {"object", "payment"}, {"from", p.account}, {"to", p.to},
                                {"amount", p.amount}, {"currency", p.currency}, {"status", "succeeded"},
                                {"created", now}}.dump()};
  return p;
}

Plan plan_order(sqlite3* db, std::string_view body, std::string id, std::int64_t now) {
  Outcome error;
  auto j = parse_object(body, error);
  Plan p;
  if (!j || !get_string(*j, "account", p.account, error) || !get_amount(*j, "amount", 1, p.amount, error) ||
      !get_currency(*j, p.currency, error) || !get_string(*j, "description", p.description, error, false)) {
    return refuse(error);
  }
  if (auto refused = check_account(db, p.account, p.currency)) return refuse(std::move(*refused));
  p.op = Op::order;
  p.id = std::move(id);
  p.created = now;
  p.outcome = Outcome{201, json{{"id", p.id}, {"object", "order"}, {"account", p.account}, {"amount", p.amount},
                                {"currency", p.currency}, {"description", p.description}, {"status", "placed"},
                                {"created", now}}.dump()};
  return p;
}

Plan plan_bonus(sqlite3* db, std::string_view body, std::string id, std::int64_t now) {
  Outcome error;
  auto j = parse_object(body, error);
  Plan p;
  if (!j || !get_string(*j, "account", p.account, error) || !get_amount(*j, "amount", 1, p.amount, error) ||
      !get_currency(*j, p.currency, error)) {
    return refuse(error);
  }
  if (auto refused = check_account(db, p.account, p.currency)) return refuse(std::move(*refused));
  p.op = Op::bonus;
  p.id = std::move(id);
  p.created = now;
  p.outcome = Outcome{201, json{{"id", p.id}, {"object", "bonus"}, {"account", p.account}, {"amount", p.amount},
                                {"currency", p.currency}, {"created", now}}.dump()};
  return p;
}

Plan plan_refund(sqlite3* db, std::string_view body, std::string id, std::int64_t now) {
  Outcome error;
  auto j = parse_object(body, error);
  Plan p;
  // Only whole refunds: an amount, if the client sends one, must be the payment's (a partial
  // refund asked for must not become a full one). 0: none sent.
  std::int64_t asked = 0;
  if (!j || !get_string(*j, "payment", p.payment, error) || !get_amount(*j, "amount", 1, asked, error, false)) {
    return refuse(error);
  }
  // The payment, and its refund if it has one (one read: payments never change once made).
  Stmt q(db,
         "SELECT from_account, to_account, amount, currency, (SELECT id FROM refunds WHERE payment_id = ?1) "
         "FROM payments WHERE id = ?1");
  if (!q.ok()) return refuse(unavailable(db));
  q.text(1, p.payment);
  const int rc = q.step();
  if (rc == SQLITE_DONE) return refuse(not_found("payment", p.payment));
  if (rc != SQLITE_ROW) return refuse(unavailable(db));
  p.to = q.col_text(0);       // the payer gets the money back
  p.account = q.col_text(1);  // from the payee
  p.amount = q.col_int(2);
  p.currency = q.col_text(3);
  if (asked != 0 && asked != p.amount) {
    return refuse(bad_request("a refund returns the whole payment: \"amount\" may only be " + std::to_string(p.amount)));
  }
  if (const std::string refund = q.col_text(4); !refund.empty()) {
    return refuse(problem(409, "payment_already_refunded", "The payment is already refunded",
                          "payment " + p.payment + " was refunded by " + refund));
  }
  bool failed = false;
  auto payee = read_account(db, p.account, failed);
  if (failed) return refuse(unavailable(db));
  if (!payee) return refuse(not_found("account", p.account));
  if (payee->balance < p.amount) return refuse(insufficient_funds(*payee, p.amount, "refund"));
  p.op = Op::refund;
  p.id = std::move(id);
  p.created = now;
  p.outcome = Outcome{201, json{{"id", p.id}, {"object", "refund"}, {"payment", p.payment}, {"amount", p.amount},
                                {"currency", p.currency}, {"created", now}}.dump()};
  return p;
}

OutboxMessage payment_succeeded(const Plan& p) {
  OutboxMessage m;
  m.message_id = p.id + "/payment.succeeded";
  m.content_type = "application/json";
  m.headers = {{"event-type", "payment.succeeded"}};
  // The 201 body is a JSON object this service dumped: it is spliced in as it is, not parsed
  // again, because this runs on the store's single writer thread.
  m.body = R"({"type":"payment.succeeded","payment":)" + p.outcome.body + "}";
  // The payment's events leave one at a time, in commit order: its refund never overtakes it.
  m.ordering_key = p.id;
  return m;
}

OutboxMessage payment_refunded(const Plan& p) {
  OutboxMessage m;
  m.message_id = p.payment + "/payment.refunded";  // one refund per payment: stable and unique
  m.content_type = "application/json";
  m.headers = {{"event-type", "payment.refunded"}};
  m.body = R"({"type":"payment.refunded","refund":)" + p.outcome.body + "}";
  m.ordering_key = p.payment;
  return m;
}

void with_events(Plan& p) {
  OutboxMessage message;
  if (p.op == Op::transfer) {
    message = payment_succeeded(p);
  } else if (p.op == Op::refund) {
    message = payment_refunded(p);
  } else {
    return;
  }
  auto event = CheckedOutboxMessage::check(std::move(message));
  if (!event) {
    const char* what = p.op == Op::transfer ? "the payment's" : "the refund's";
    p.op = Op::none;
    p.outcome = problem(500, "internal_error", "Internal error", std::string(what) + " event cannot be enqueued: " + event.error());
    return;
  }
  p.events.push_back(std::move(*event));
}

namespace {
// The event leaves with its writes or not at all: the same transaction (SPEC §11).
Applied enqueue_events(sqlite3* db, const Plan& p, std::string& error) {
  for (const CheckedOutboxMessage& event : p.events) {
    if (!SqliteOutbox::enqueue(db, event, SystemClock::instance().now(), error)) return Applied::error;
  }
  return Applied::ok;
}
}  // namespace

Applied apply(sqlite3* db, const Plan& p, std::string& error) {
  switch (p.op) {
    case Op::none:
      return Applied::ok;
    case Op::open_account: {
      Stmt s(db, "INSERT INTO accounts (id, currency, balance, opening, created, request_key) VALUES (?1, ?2, ?3, ?3, ?4, ?5)");
      s.text(1, p.id).text(2, p.currency).integer(3, p.amount).integer(4, p.created).text(5, p.request_key);
      return run(s, db, 1, error);
    }
    case Op::transfer: {
      // Both guards are in the WHERE clauses: the payer still has the money, both accounts still
      // hold the currency. A failed guard has changed nothing yet, or is undone by the caller's
      // rollback (the second statement runs only after the first succeeded).
      Stmt debit(db, "UPDATE accounts SET balance = balance - ?2 WHERE id = ?1 AND balance >= ?2 AND currency = ?3");
      debit.text(1, p.account).integer(2, p.amount).text(3, p.currency);
      if (auto r = run(debit, db, 1, error); r != Applied::ok) return r;
      Stmt credit(db, "UPDATE accounts SET balance = balance + ?2 WHERE id = ?1 AND currency = ?3");
      credit.text(1, p.to).integer(2, p.amount).text(3, p.currency);
      if (auto r = run(credit, db, 1, error); r != Applied::ok) return r;
      Stmt row(db, "INSERT INTO payments (id, from_account, to_account, amount, currency, created, request_key, request_tenant) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)");
      row.text(1, p.id).text(2, p.account).text(3, p.to).integer(4, p.amount).text(5, p.currency).integer(6, p.created).text(7, p.request_key).text(8, p.request_tenant);
      if (auto r = run(row, db, 1, error); r != Applied::ok) return r;
      return enqueue_events(db, p, error);
    }
    case Op::order: {
      Stmt s(db, "INSERT INTO orders (id, account, amount, currency, description, created, request_key) SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7 WHERE EXISTS (SELECT 1 FROM accounts WHERE id = ?2 AND currency = ?4)");
      s.text(1, p.id).text(2, p.account).integer(3, p.amount).text(4, p.currency).text(5, p.description).integer(6, p.created).text(7, p.request_key);
      return run(s, db, 1, error);
    }
    case Op::bonus: {
      Stmt credit(db, "UPDATE accounts SET balance = balance + ?2 WHERE id = ?1 AND currency = ?3");
      credit.text(1, p.account).integer(2, p.amount).text(3, p.currency);
      if (auto r = run(credit, db, 1, error); r != Applied::ok) return r;
      Stmt row(db, "INSERT INTO bonuses (id, account, amount, currency, created, request_key) VALUES (?1, ?2, ?3, ?4, ?5, ?6)");
      row.text(1, p.id).text(2, p.account).integer(3, p.amount).text(4, p.currency).integer(5, p.created).text(6, p.request_key);
      return run(row, db, 1, error);
    }
    case Op::refund: {
      // The refund's row first: refunds.payment_id is UNIQUE, so a refund of this payment
      // committed since planning leaves nothing inserted (stale; the new plan answers 409). The
      // row is taken from the payment as planned. Then the money goes back, guarded like a
      // transfer: the payee still has it. A failed guard is undone by the caller's rollback.
      Stmt row(db,
               "INSERT INTO refunds (id, payment_id, amount, currency, created, request_key, request_tenant) "
               "SELECT ?1, id, amount, currency, ?2, ?3, ?4 FROM payments "
               "WHERE id = ?5 AND from_account = ?6 AND to_account = ?7 AND amount = ?8 AND currency = ?9 "
               "ON CONFLICT (payment_id) DO NOTHING");
      row.text(1, p.id).integer(2, p.created).text(3, p.request_key).text(4, p.request_tenant).text(5, p.payment);
      row.text(6, p.to).text(7, p.account).integer(8, p.amount).text(9, p.currency);
      if (auto r = run(row, db, 1, error); r != Applied::ok) return r;
      Stmt debit(db, "UPDATE accounts SET balance = balance - ?2 WHERE id = ?1 AND balance >= ?2 AND currency = ?3");
      debit.text(1, p.account).integer(2, p.amount).text(3, p.currency);
      if (auto r = run(debit, db, 1, error); r != Applied::ok) return r;
      Stmt credit(db, "UPDATE accounts SET balance = balance + ?2 WHERE id = ?1 AND currency = ?3");
      credit.text(1, p.to).integer(2, p.amount).text(3, p.currency);
      if (auto r = run(credit, db, 1, error); r != Applied::ok) return r;
      return enqueue_events(db, p, error);
    }
  }
  error = "unknown operation";
  return Applied::error;
}

Outcome get_account(sqlite3* db, std::string_view id) {
  Stmt q(db, "SELECT id, currency, balance, created FROM accounts WHERE id = ?1");
  if (!q.ok()) return unavailable(db);
  q.text(1, id);
  const int rc = q.step();
  if (rc == SQLITE_DONE) return not_found("account", id);
  if (rc != SQLITE_ROW) return unavailable(db);
  return Outcome{200, json{{"id", q.col_text(0)}, {"object", "account"}, {"currency", q.col_text(1)},
                           {"balance", q.col_int(2)}, {"created", q.col_int(3)}}.dump()};
}

Outcome get_payment(sqlite3* db, std::string_view id) {
  Stmt q(db, "SELECT id, from_account, to_account, amount, currency, created FROM payments WHERE id = ?1");
  if (!q.ok()) return unavailable(db);
  q.text(1, id);
  const int rc = q.step();
  if (rc == SQLITE_DONE) return not_found("payment", id);
  if (rc != SQLITE_ROW) return unavailable(db);
  return Outcome{200, json{{"id", q.col_text(0)}, {"object", "payment"}, {"from", q.col_text(1)},
                           {"to", q.col_text(2)}, {"amount", q.col_int(3)}, {"currency", q.col_text(4)},
                           {"status", "succeeded"}, {"created", q.col_int(5)}}.dump()};
}

}  // namespace idem::payments
