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
