#include "idem/payments/ledger.hpp"

#include "idem/sqlite_outbox.hpp"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <set>
#include <string>

namespace idem::payments {
namespace {

using json = nlohmann::json;

class LedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(sqlite3_open(":memory:", &db_), SQLITE_OK);
    std::string error;
    ASSERT_TRUE(migrate(db_, error)) << error;
  }
  void TearDown() override { sqlite3_close(db_); }

  // Plans and applies like the service in off mode; returns the outcome.
  template <class F>
  Outcome run(F plan_fn, const json& body, std::string_view prefix = "x_", const AttemptFence& fence = {}) {
    const std::string text = body.dump();
    return execute_now(db_, fence, [&](sqlite3* db) {
      Plan plan = plan_fn(db, text, new_id(prefix), 1700000000);
      plan.request_key = fence.key;
      plan.request_tenant = fence.tenant;
      return plan;
    });
  }
  // The one integer a query answers; ?1, if the query has it, bound to `arg`.
  std::int64_t scalar(const char* sql, const std::string& arg = {}) {
    sqlite3_stmt* q = nullptr;
    sqlite3_prepare_v2(db_, sql, -1, &q, nullptr);
    if (sqlite3_bind_parameter_count(q) > 0) sqlite3_bind_text(q, 1, arg.c_str(), -1, SQLITE_TRANSIENT);
    sqlite3_step(q);
    const std::int64_t n = sqlite3_column_int64(q, 0);
    sqlite3_finalize(q);
    return n;
  }
  // The one text a query answers ("" for none or NULL); ?1 bound to `arg`.
  std::string text(const char* sql, const std::string& arg) {
    sqlite3_stmt* q = nullptr;
    sqlite3_prepare_v2(db_, sql, -1, &q, nullptr);
    sqlite3_bind_text(q, 1, arg.c_str(), -1, SQLITE_TRANSIENT);
    std::string out;
    if (sqlite3_step(q) == SQLITE_ROW && sqlite3_column_text(q, 0) != nullptr) {
      out = reinterpret_cast<const char*>(sqlite3_column_text(q, 0));
    }
    sqlite3_finalize(q);
    return out;
  }
  std::int64_t payments_with(const std::string& key) {
    return scalar("SELECT count(*) FROM payments WHERE request_key = ?1", key);
  }
  std::string open(std::int64_t balance, std::string currency = "EUR") {
    Outcome o = run(plan_open_account, json{{"currency", currency}, {"balance", balance}}, "acct_");
    EXPECT_EQ(o.status, 201) << o.body;
    return json::parse(o.body)["id"];
  }
  std::int64_t balance(const std::string& id) { return json::parse(get_account(db_, id).body)["balance"]; }
  std::string code(const Outcome& o) { return json::parse(o.body).value("code", ""); }
  std::int64_t outbox_rows() { return scalar("SELECT count(*) FROM idem_outbox"); }
  std::int64_t refunds_of(const std::string& payment) {
    return scalar("SELECT count(*) FROM refunds WHERE payment_id = ?1", payment);
  }
  // A payment of `amount` from `from` to `to`, made; its id.
  std::string pay(const std::string& from, const std::string& to, std::int64_t amount) {
    Outcome o = run(plan_payment, json{{"from", from}, {"to", to}, {"amount", amount}, {"currency", "EUR"}}, "pay_");
    EXPECT_EQ(o.status, 201) << o.body;
    return json::parse(o.body)["id"];
  }
  Outcome refund(const std::string& payment) { return run(plan_refund, json{{"payment", payment}}, "re_"); }
  // Applies `plan` in a transaction of its own, committed when apply says ok, else rolled back
  // (as both modes of the service do).
  Applied apply_alone(const Plan& plan) {
    std::string error;
    EXPECT_EQ(sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
    const Applied applied = apply(db_, plan, error);
    EXPECT_NE(applied, Applied::error) << error;
    EXPECT_EQ(sqlite3_exec(db_, applied == Applied::ok ? "COMMIT" : "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
    return applied;
  }

  sqlite3* db_ = nullptr;
};

TEST_F(LedgerTest, PaymentMovesMoneyAndIsReadable) {
  const std::string a = open(1000), b = open(0);
  Outcome o = run(plan_payment, json{{"from", a}, {"to", b}, {"amount", 250}, {"currency", "eur"}}, "pay_");
  ASSERT_EQ(o.status, 201) << o.body;
  EXPECT_EQ(balance(a), 750);
  EXPECT_EQ(balance(b), 250);
  const std::string id = json::parse(o.body)["id"];
  Outcome got = get_payment(db_, id);
  EXPECT_EQ(got.status, 200);
  EXPECT_EQ(json::parse(got.body)["amount"], 250);
  EXPECT_EQ(json::parse(got.body)["currency"], "EUR");
}

TEST_F(LedgerTest, InsufficientFundsIs402AndMovesNothing) {
  const std::string a = open(100), b = open(0);
  Outcome o = run(plan_payment, json{{"from", a}, {"to", b}, {"amount", 101}, {"currency", "EUR"}});
  EXPECT_EQ(o.status, 402);
  EXPECT_EQ(code(o), "insufficient_funds");
  EXPECT_EQ(balance(a), 100);
  EXPECT_EQ(balance(b), 0);
}

TEST_F(LedgerTest, UnknownAccountIs404) {
  const std::string a = open(100);
  Outcome o = run(plan_payment, json{{"from", a}, {"to", "acct_nope"}, {"amount", 1}, {"currency", "EUR"}});
  EXPECT_EQ(o.status, 404);
  EXPECT_EQ(code(o), "account_not_found");
  EXPECT_EQ(get_account(db_, "acct_nope").status, 404);
  EXPECT_EQ(get_payment(db_, "pay_nope").status, 404);
}

TEST_F(LedgerTest, CurrencyMismatchIs422) {
  const std::string a = open(100, "EUR"), b = open(0, "USD");
  Outcome o = run(plan_payment, json{{"from", a}, {"to", b}, {"amount", 1}, {"currency", "EUR"}});
  EXPECT_EQ(o.status, 422);
  EXPECT_EQ(code(o), "currency_mismatch");
  EXPECT_EQ(run(plan_bonus, json{{"account", b}, {"amount", 5}, {"currency", "EUR"}}).status, 422);
}

TEST_F(LedgerTest, ValidationErrorsAre400Problems) {
  const std::string a = open(100), b = open(0);
  for (const json& body : {json::array(), json{{"from", a}, {"to", b}, {"amount", 1.5}, {"currency", "EUR"}},
                           json{{"from", a}, {"to", b}, {"amount", 0}, {"currency", "EUR"}},
                           json{{"from", a}, {"to", b}, {"amount", -3}, {"currency", "EUR"}},
                           json{{"from", a}, {"to", b}, {"amount", 1}, {"currency", "EURO"}},
                           json{{"from", a}, {"to", a}, {"amount", 1}, {"currency", "EUR"}},
                           json{{"to", b}, {"amount", 1}, {"currency", "EUR"}}}) {
    Outcome o = run(plan_payment, body);
    EXPECT_EQ(o.status, 400) << body.dump();
    EXPECT_EQ(code(o), "invalid_request");
  }
  const Outcome bad = execute_now(db_, AttemptFence{}, [](sqlite3* db) { return plan_payment(db, "{not json", "p", 0); });
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(balance(a), 100);
}

TEST_F(LedgerTest, BonusCreditsAndOrderRecords) {
  const std::string a = open(10);
  EXPECT_EQ(run(plan_bonus, json{{"account", a}, {"amount", 5}, {"currency", "EUR"}}).status, 201);
  EXPECT_EQ(balance(a), 15);
  Outcome order = run(plan_order, json{{"account", a}, {"amount", 99}, {"currency", "EUR"}, {"description", "tea"}});
  EXPECT_EQ(order.status, 201) << order.body;
  EXPECT_EQ(json::parse(order.body)["status"], "placed");
  EXPECT_EQ(balance(a), 15);
}

TEST_F(LedgerTest, StalePlanIsRefusedByApply) {
  const std::string a = open(100), b = open(0);
  const std::string body = json{{"from", a}, {"to", b}, {"amount", 80}, {"currency", "EUR"}}.dump();
  Plan first = plan_payment(db_, body, "pay_1", 0);
  Plan second = plan_payment(db_, body, "pay_2", 0);  // planned from the same balance
  std::string error;
  EXPECT_EQ(apply(db_, first, error), Applied::ok) << error;
  EXPECT_EQ(apply(db_, second, error), Applied::stale);
  EXPECT_EQ(balance(a), 20);
  EXPECT_EQ(balance(b), 80);
}

// ---- the outbox (docs/outbox.md) ----

TEST_F(LedgerTest, APaymentCarriesItsEventAndApplyEnqueuesItInTheSameTransaction) {
  ASSERT_TRUE(SqliteOutbox::create_table(db_)) << "the outbox table";
  const std::string a = open(100), b = open(0);
  const std::string body = json{{"from", a}, {"to", b}, {"amount", 30}, {"currency", "EUR"}}.dump();
  Plan plan = plan_payment(db_, body, "pay_1", 0);
  ASSERT_EQ(plan.outcome.status, 201) << plan.outcome.body;
  EXPECT_TRUE(plan.events.empty()) << "no events until the service asks for them (--outbox off)";
  with_events(plan);
  ASSERT_EQ(plan.events.size(), 1u);
  const OutboxMessage& event = plan.events[0].message();
  EXPECT_EQ(event.message_id, "pay_1/payment.succeeded");
  EXPECT_EQ(event.content_type, "application/json");
  EXPECT_EQ(event.headers, (MessageHeaders{{"event-type", "payment.succeeded"}}));
  EXPECT_EQ(event.ordering_key, "pay_1") << "the payment's events go out one at a time, in commit order";
  const json event_body = json::parse(event.body);
  EXPECT_EQ(event_body["type"], "payment.succeeded");
  EXPECT_EQ(event_body["payment"], json::parse(plan.outcome.body)) << "the 201 body, as the client got it";

  // Rolled back, neither the payment nor its event is left; committed, both are.
  std::string error;
  ASSERT_EQ(sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  ASSERT_EQ(apply(db_, plan, error), Applied::ok) << error;
  ASSERT_EQ(sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
  EXPECT_EQ(balance(a), 100);
  EXPECT_EQ(outbox_rows(), 0);
  ASSERT_EQ(sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  ASSERT_EQ(apply(db_, plan, error), Applied::ok) << error;
  ASSERT_EQ(sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
  EXPECT_EQ(balance(a), 70);
  EXPECT_EQ(outbox_rows(), 1);
  EXPECT_EQ(text("SELECT ordering_key FROM idem_outbox WHERE message_id = ?1", "pay_1/payment.succeeded"), "pay_1");

  // A refused payment moves nothing and announces nothing.
  Plan refused = plan_payment(db_, json{{"from", a}, {"to", b}, {"amount", 1000}, {"currency", "EUR"}}.dump(), "pay_2", 0);
  EXPECT_EQ(refused.outcome.status, 402);
  with_events(refused);
  EXPECT_TRUE(refused.events.empty());
}

TEST_F(LedgerTest, AnEventTheOutboxWouldRefuseTurnsThePaymentIntoA500ThatWritesNothing) {
  ASSERT_TRUE(SqliteOutbox::create_table(db_)) << "the outbox table";
  const std::string a = open(100), b = open(0);
  // An id no consumer could use, as a bug in this service might make: the event's id is built on it.
  Plan plan =
      plan_payment(db_, json{{"from", a}, {"to", b}, {"amount", 30}, {"currency", "EUR"}}.dump(), "has a space", 0);
  ASSERT_EQ(plan.outcome.status, 201);
  with_events(plan);
  EXPECT_EQ(plan.outcome.status, 500);
  EXPECT_NE(plan.outcome.body.find("cannot be enqueued"), std::string::npos) << plan.outcome.body;
  EXPECT_TRUE(plan.events.empty());
  std::string error;
  ASSERT_EQ(sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  EXPECT_EQ(apply(db_, plan, error), Applied::ok) << error;
  ASSERT_EQ(sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr), SQLITE_OK);
  EXPECT_EQ(balance(a), 100);
  EXPECT_EQ(outbox_rows(), 0);
  EXPECT_EQ(get_payment(db_, "has a space").status, 404);
}

// ---- refunds ----

TEST_F(LedgerTest, ARefundMovesThePaymentBackOnce) {
  const std::string a = open(1000), b = open(0);
  const std::string payment = pay(a, b, 250);
  Outcome refunded = refund(payment);
  ASSERT_EQ(refunded.status, 201) << refunded.body;
  const json body = json::parse(refunded.body);
  EXPECT_EQ(body["object"], "refund");
  EXPECT_EQ(body["payment"], payment);
  EXPECT_EQ(body["amount"], 250);
  EXPECT_EQ(body["currency"], "EUR");
  EXPECT_EQ(body["created"], 1700000000);
  EXPECT_TRUE(body["id"].get<std::string>().starts_with("re_")) << body;
  EXPECT_EQ(body.size(), 6u) << body;
  EXPECT_EQ(balance(a), 1000);
  EXPECT_EQ(balance(b), 0);
  EXPECT_EQ(text("SELECT id FROM refunds WHERE payment_id = ?1", payment), body["id"].get<std::string>());

  // Twice is refused, and moves nothing; however much money the payee has again.
  EXPECT_EQ(run(plan_bonus, json{{"account", b}, {"amount", 5000}, {"currency", "EUR"}}).status, 201);
  Outcome again = refund(payment);
  EXPECT_EQ(again.status, 409) << again.body;
  EXPECT_EQ(code(again), "payment_already_refunded");
  EXPECT_NE(again.body.find(body["id"].get<std::string>()), std::string::npos) << "names the refund: " << again.body;
  EXPECT_EQ(balance(a), 1000);
  EXPECT_EQ(balance(b), 5000);
  EXPECT_EQ(refunds_of(payment), 1);
  // The payment itself reads as it did (the lookup replays it byte for byte as its 201).
  EXPECT_EQ(json::parse(get_payment(db_, payment).body)["status"], "succeeded");
}

TEST_F(LedgerTest, ARefundOfAnUnknownPaymentIs404) {
  const std::string a = open(1000);
  Outcome o = refund("pay_nope");
  EXPECT_EQ(o.status, 404);
  EXPECT_EQ(code(o), "payment_not_found");
  EXPECT_EQ(code(refund(a)), "payment_not_found") << "an account is no payment";
  EXPECT_EQ(scalar("SELECT count(*) FROM refunds"), 0);
}

TEST_F(LedgerTest, ARefundNeedsThePayeeToStillHoldTheAmount) {
  const std::string a = open(1000), b = open(0), c = open(0);
  const std::string payment = pay(a, b, 300);
  pay(b, c, 200);  // the payee spent most of it
  Outcome o = refund(payment);
  EXPECT_EQ(o.status, 402) << o.body;
  EXPECT_EQ(code(o), "insufficient_funds");
  EXPECT_EQ(balance(a), 700);
  EXPECT_EQ(balance(b), 100);
  EXPECT_EQ(refunds_of(payment), 0) << "a refused refund is no refund: it may be asked again";
  EXPECT_EQ(run(plan_bonus, json{{"account", b}, {"amount", 200}, {"currency", "EUR"}}).status, 201);
  EXPECT_EQ(refund(payment).status, 201);
  EXPECT_EQ(balance(a), 1000);
  EXPECT_EQ(balance(b), 0);
}

TEST_F(LedgerTest, RefundValidationErrorsAre400Problems) {
  const std::string a = open(1000), b = open(0);
  const std::string payment = pay(a, b, 250);
  for (const json& body : {json::array(), json::object(), json{{"payment", 7}}, json{{"payment", ""}},
                           json{{"payment", std::string(129, 'p')}}, json{{"payment", payment}, {"amount", 0}},
                           json{{"payment", payment}, {"amount", "250"}},
                           json{{"payment", payment}, {"amount", 100}},  // a partial refund: not offered
                           json{{"payment", "pay_nope"}, {"amount", -1}}}) {
    Outcome o = run(plan_refund, body);
    EXPECT_EQ(o.status, 400) << body.dump() << " " << o.body;
    EXPECT_EQ(code(o), "invalid_request") << body.dump();
  }
  EXPECT_EQ(execute_now(db_, AttemptFence{}, [](sqlite3* db) { return plan_refund(db, "{not json", "re_1", 0); }).status, 400);
  EXPECT_EQ(refunds_of(payment), 0);
  EXPECT_EQ(balance(b), 250);
  // The payment's whole amount, named, is the same refund as none named.
  EXPECT_EQ(run(plan_refund, json{{"payment", payment}, {"amount", 250}}, "re_").status, 201);
  EXPECT_EQ(balance(b), 0);
}

TEST_F(LedgerTest, AStaleRefundIsRefusedByApplyAndWritesNothing) {
  const std::string a = open(1000), b = open(0), c = open(0);
  const std::string payment = pay(a, b, 400);
  const std::string body = json{{"payment", payment}}.dump();
  // Two refunds planned from the same ledger (two keys at once, in-process mode): one applies.
  Plan first = plan_refund(db_, body, "re_1", 0);
  Plan second = plan_refund(db_, body, "re_2", 0);
  ASSERT_EQ(first.outcome.status, 201);
  ASSERT_EQ(second.outcome.status, 201);
  EXPECT_EQ(apply_alone(first), Applied::ok);
  EXPECT_EQ(apply_alone(second), Applied::stale);
  EXPECT_EQ(balance(a), 1000);
  EXPECT_EQ(balance(b), 0);
  EXPECT_EQ(text("SELECT id FROM refunds WHERE payment_id = ?1", payment), "re_1");
  // Planned again, the second is told why.
  EXPECT_EQ(code(Outcome{plan_refund(db_, body, "re_2", 0).outcome}), "payment_already_refunded");

  // A refund planned while the payee had the money, applied after it spent it: stale, and the
  // refund's row inserted before the failed debit is rolled back with it.
  const std::string other = pay(a, b, 300);
  Plan late = plan_refund(db_, json{{"payment", other}}.dump(), "re_3", 0);
  ASSERT_EQ(late.outcome.status, 201);
  pay(b, c, 1);
  EXPECT_EQ(apply_alone(late), Applied::stale);
  EXPECT_EQ(refunds_of(other), 0);
  EXPECT_EQ(balance(a), 700);
  EXPECT_EQ(balance(b), 299);
  EXPECT_EQ(code(Outcome{plan_refund(db_, json{{"payment", other}}.dump(), "re_3", 0).outcome}), "insufficient_funds");
}

TEST_F(LedgerTest, TheSchemaHoldsAtMostOneRefundPerPayment) {
  const std::string a = open(1000), b = open(0);
  const std::string payment = pay(a, b, 100);
  ASSERT_EQ(refund(payment).status, 201);
  // Whatever a buggy plan or another writer tries: the second row does not go in.
  const std::string insert = "INSERT INTO refunds (id, payment_id, amount, currency, created) VALUES ('re_x', '" +
                             payment + "', 100, 'EUR', 0)";
  EXPECT_EQ(sqlite3_exec(db_, insert.c_str(), nullptr, nullptr, nullptr), SQLITE_CONSTRAINT);
  EXPECT_EQ(refunds_of(payment), 1);
  // apply's guard without the plan's check: a refund planned as if none existed is stale.
  Plan forged;
  forged.op = Op::refund;
  forged.id = "re_forged";
  forged.payment = payment;
  forged.account = b;
  forged.to = a;
  forged.amount = 100;
  forged.currency = "EUR";
  EXPECT_EQ(run(plan_bonus, json{{"account", b}, {"amount", 100}, {"currency", "EUR"}}).status, 201);
  EXPECT_EQ(apply_alone(forged), Applied::stale);
  EXPECT_EQ(balance(a), 1000);
  EXPECT_EQ(balance(b), 100);
  // Nor does it refund a payment other than the one planned (its amount differs).
  const std::string small = pay(a, b, 10);
  forged.payment = small;
  EXPECT_EQ(apply_alone(forged), Applied::stale);
  EXPECT_EQ(refunds_of(small), 0);
}

TEST_F(LedgerTest, ARefundCarriesPaymentRefundedWithThePaymentAsOrderingKey) {
  ASSERT_TRUE(SqliteOutbox::create_table(db_)) << "the outbox table";
  const std::string a = open(1000), b = open(0);
  Plan payment = plan_payment(db_, json{{"from", a}, {"to", b}, {"amount", 120}, {"currency", "EUR"}}.dump(), "pay_1", 0);
  with_events(payment);
  ASSERT_EQ(apply_alone(payment), Applied::ok);

  Plan plan = plan_refund(db_, json{{"payment", "pay_1"}}.dump(), "re_1", 0);
  ASSERT_EQ(plan.outcome.status, 201) << plan.outcome.body;
  EXPECT_TRUE(plan.events.empty()) << "no events until the service asks for them (--outbox off)";
  with_events(plan);
  ASSERT_EQ(plan.events.size(), 1u);
  const OutboxMessage& event = plan.events[0].message();
  EXPECT_EQ(event.message_id, "pay_1/payment.refunded");
  EXPECT_EQ(event.content_type, "application/json");
  EXPECT_EQ(event.headers, (MessageHeaders{{"event-type", "payment.refunded"}}));
  EXPECT_EQ(event.ordering_key, "pay_1") << "the payment's key: never published before its payment.succeeded";
  const json event_body = json::parse(event.body);
  EXPECT_EQ(event_body["type"], "payment.refunded");
  EXPECT_EQ(event_body["refund"], json::parse(plan.outcome.body)) << "the 201 body, as the client got it";
  EXPECT_EQ(event_body.size(), 2u);

  // Rolled back, neither the refund nor its event is left; committed, both are, after the payment's.
  std::string error;
  ASSERT_EQ(sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  ASSERT_EQ(apply(db_, plan, error), Applied::ok) << error;
  ASSERT_EQ(sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr), SQLITE_OK);
  EXPECT_EQ(balance(b), 120);
  EXPECT_EQ(outbox_rows(), 1);
  ASSERT_EQ(apply_alone(plan), Applied::ok);
  EXPECT_EQ(balance(a), 1000);
  EXPECT_EQ(balance(b), 0);
  EXPECT_EQ(outbox_rows(), 2);
  EXPECT_EQ(scalar("SELECT count(*) FROM idem_outbox WHERE ordering_key = ?1", "pay_1"), 2);
  EXPECT_LT(scalar("SELECT id FROM idem_outbox WHERE message_id = ?1", "pay_1/payment.succeeded"),
            scalar("SELECT id FROM idem_outbox WHERE message_id = ?1", "pay_1/payment.refunded"))
      << "the refund's row after the payment's: the relay publishes a key's rows in that order";

  // A refused refund announces nothing.
  Plan twice = plan_refund(db_, json{{"payment", "pay_1"}}.dump(), "re_2", 0);
  EXPECT_EQ(twice.outcome.status, 409);
  with_events(twice);
  EXPECT_TRUE(twice.events.empty());

  // A refund whose event the outbox would refuse (a payment id no consumer could use, as a bug
  // might make) is a 500 that writes nothing.
  Plan odd = plan_payment(db_, json{{"from", a}, {"to", b}, {"amount", 10}, {"currency", "EUR"}}.dump(), "has a space", 0);
  ASSERT_EQ(apply_alone(odd), Applied::ok);
  Plan bad = plan_refund(db_, json{{"payment", "has a space"}}.dump(), "re_3", 0);
  ASSERT_EQ(bad.outcome.status, 201);
  with_events(bad);
  EXPECT_EQ(bad.outcome.status, 500);
  EXPECT_NE(bad.outcome.body.find("cannot be enqueued"), std::string::npos) << bad.outcome.body;
  EXPECT_EQ(apply_alone(bad), Applied::ok);
  EXPECT_EQ(refunds_of("has a space"), 0);
  EXPECT_EQ(balance(b), 10);
  EXPECT_EQ(outbox_rows(), 2);
}

// ---- the attempt fence and the lookup (docs/security.md, docs/gateway.md) ----

TEST_F(LedgerTest, AStaleAttemptWritesNothingAndIsTold409) {
  const std::string a = open(1000), b = open(0);
  const json pay{{"from", a}, {"to", b}, {"amount", 300}, {"currency", "EUR"}};
  // The takeover (attempt 2) arrives first and pays; the fenced-out first attempt comes late.
  Outcome second = run(plan_payment, pay, "pay_", AttemptFence{"auth:t1", "key-fence-000001", 2});
  ASSERT_EQ(second.status, 201) << second.body;
  Outcome first = run(plan_payment, pay, "pay_", AttemptFence{"auth:t1", "key-fence-000001", 1});
  EXPECT_EQ(first.status, 409);
  EXPECT_EQ(code(first), "idempotency_attempt_stale");
  EXPECT_EQ(balance(a), 700);
  EXPECT_EQ(payments_with("key-fence-000001"), 1);
  // The same attempt again is not stale (the gateway never sends one twice, but it is no lower),
  // nor is a higher one; another tenant's key of the same name has a count of its own.
  EXPECT_EQ(run(plan_bonus, json{{"account", a}, {"amount", 1}, {"currency", "EUR"}}, "bon_",
                AttemptFence{"auth:t1", "key-fence-000001", 2})
                .status,
            201);
  EXPECT_EQ(run(plan_payment, pay, "pay_", AttemptFence{"auth:t2", "key-fence-000001", 1}).status, 201);
  // A stale attempt does not even plan: no 402 from balances the newer attempt changed.
  const json too_much{{"from", b}, {"to", a}, {"amount", 100000}, {"currency", "EUR"}};
  EXPECT_EQ(run(plan_payment, too_much, "pay_", AttemptFence{"auth:t1", "key-fence-000001", 1}).status, 409);
}

TEST_F(LedgerTest, TheLookupFindsThePaymentOfATenantsKeyAsIts201Was) {
  const std::string a = open(1000), b = open(0);
  Outcome paid = run(plan_payment, json{{"from", a}, {"to", b}, {"amount", 250}, {"currency", "EUR"}}, "pay_",
                     AttemptFence{"auth:t1", "key-lookup-000001", 1});
  ASSERT_EQ(paid.status, 201);
  Outcome found = lookup_payment(db_, AttemptFence{"auth:t1", "key-lookup-000001", 2});
  EXPECT_EQ(found.status, 200);
  EXPECT_EQ(found.body, paid.body);  // byte for byte: the replay the gateway stores
  EXPECT_EQ(lookup_payment(db_, AttemptFence{"auth:t2", "key-lookup-000001", 2}).status, 404);
  Outcome none = lookup_payment(db_, AttemptFence{"auth:t1", "key-lookup-never-1", 3});
  EXPECT_EQ(none.status, 404);
  EXPECT_EQ(code(none), "payment_not_found");
  // The lookup recorded attempt 3: the holder of attempt 2 still running can no longer pay, so
  // "not found" stays true.
  Outcome late = run(plan_payment, json{{"from", a}, {"to", b}, {"amount", 1}, {"currency", "EUR"}}, "pay_",
                     AttemptFence{"auth:t1", "key-lookup-never-1", 2});
  EXPECT_EQ(late.status, 409);
  EXPECT_EQ(lookup_payment(db_, AttemptFence{"auth:t1", "key-lookup-never-1", 3}).status, 404);
  EXPECT_EQ(run(plan_payment, json{{"from", a}, {"to", b}, {"amount", 1}, {"currency", "EUR"}}, "pay_",
                AttemptFence{"auth:t1", "key-lookup-never-1", 3})
                .status,
            201);
}

TEST_F(LedgerTest, AnOlderLedgerGainsTheTenantColumn) {
  sqlite3* old = nullptr;
  ASSERT_EQ(sqlite3_open(":memory:", &old), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(old,
                         "CREATE TABLE payments (id TEXT PRIMARY KEY, from_account TEXT NOT NULL, to_account TEXT NOT "
                         "NULL, amount INTEGER NOT NULL CHECK (amount > 0), currency TEXT NOT NULL, created INTEGER "
                         "NOT NULL, request_key TEXT); INSERT INTO payments VALUES ('pay_1', 'a', 'b', 1, 'EUR', 1, 'k');",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  std::string error;
  ASSERT_TRUE(migrate(old, error)) << error;
  ASSERT_TRUE(migrate(old, error)) << error;  // and again: nothing to do
  sqlite3_stmt* q = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(old, "SELECT count(*) FROM payments WHERE request_tenant IS NULL", -1, &q, nullptr),
            SQLITE_OK);
  ASSERT_EQ(sqlite3_step(q), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int64(q, 0), 1);
  sqlite3_finalize(q);
  sqlite3_close(old);
}

TEST(LedgerIds, AreDistinctAndOrderedByTheirTimeDigits) {
  std::set<std::string> seen;
  std::string previous_time;
  for (int i = 0; i < 5000; ++i) {
    const std::string id = new_id("pay_");
    ASSERT_EQ(id.size(), 4u + 28u) << id;
    ASSERT_EQ(id.find_first_not_of("0123456789abcdef", 4), std::string::npos) << id;
    const std::string time = id.substr(4, 12);
    EXPECT_GE(time, previous_time) << id;  // the index of a newer row sorts after the older ones
    previous_time = time;
    EXPECT_TRUE(seen.insert(id).second) << id;
  }
  const auto ms = std::stoull(previous_time, nullptr, 16);
  const auto now = static_cast<unsigned long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                                       std::chrono::system_clock::now().time_since_epoch())
                                                       .count());
  EXPECT_LE(ms, now);
  EXPECT_GT(ms + 60'000, now);
}

}  // namespace
}  // namespace idem::payments
