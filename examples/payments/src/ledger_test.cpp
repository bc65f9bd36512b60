#include "idem/payments/ledger.hpp"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <nlohmann/json.hpp>

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
  Outcome run(F plan_fn, const json& body, std::string_view prefix = "x_") {
    const std::string text = body.dump();
    return execute_now(db_, [&](sqlite3* db) { return plan_fn(db, text, new_id(prefix), 1700000000); });
  }
  std::string open(std::int64_t balance, std::string currency = "EUR") {
    Outcome o = run(plan_open_account, json{{"currency", currency}, {"balance", balance}}, "acct_");
    EXPECT_EQ(o.status, 201) << o.body;
    return json::parse(o.body)["id"];
  }
  std::int64_t balance(const std::string& id) { return json::parse(get_account(db_, id).body)["balance"]; }
  std::string code(const Outcome& o) { return json::parse(o.body).value("code", ""); }

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
  const Outcome bad = execute_now(db_, [](sqlite3* db) { return plan_payment(db, "{not json", "p", 0); });
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

}  // namespace
}  // namespace idem::payments
