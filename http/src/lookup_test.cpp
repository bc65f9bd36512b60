#include "idem/http/lookup.hpp"

#include <gtest/gtest.h>

namespace idem::http {
namespace {

const std::string kKey = "8f14e45f-ceea-467f-a9f0-0b1f7e3a1c2d";

LookupReply reply(int status, Headers headers, std::string body = "") {
  return LookupReply{status, std::move(headers), std::move(body), false};
}

LookupResult read(const LookupReply& r, const LookupRules& rules = {}) { return interpret_lookup(r, kKey, rules); }

TEST(ParseLookup, TakesAGetWithPlaceholders) {
  auto l = parse_lookup("GET /v1/payments/by-idempotency-key/{key}?tenant={tenant}");
  ASSERT_TRUE(l) << l.error();
  EXPECT_EQ(l->target, "/v1/payments/by-idempotency-key/{key}?tenant={tenant}");
  EXPECT_TRUE(parse_lookup("GET /lookup"));  // the key may travel in the header only
}

TEST(ParseLookup, RefusesWhatCouldChangeSomethingOrBreakThePath) {
  for (const char* bad : {"POST /v1/payments/{key}", "get /x/{key}", "GET", "GET x/{key}", "GET /x/{id}",
                          "GET /x/{key", "GET /x/key}", "GET /x y/{key}", "GET /x#frag", "DELETE /x/{key}"}) {
    auto l = parse_lookup(bad);
    ASSERT_FALSE(l) << bad;
    EXPECT_FALSE(l.error().empty());
  }
  EXPECT_FALSE(parse_lookup("GET /" + std::string(3000, 'a')));
}

TEST(LookupTarget, PercentEncodesTheKeyAndTheTenant) {
  const Lookup l{"/v1/p/{key}?tenant={tenant}&k={key}"};
  EXPECT_EQ(lookup_target(l, "auth:ab12", "a/b?c#d%e f~_.-"),
            "/v1/p/a%2Fb%3Fc%23d%25e%20f~_.-?tenant=auth%3Aab12&k=a%2Fb%3Fc%23d%25e%20f~_.-");
  EXPECT_EQ(lookup_target(l, "", kKey), "/v1/p/" + kKey + "?tenant=&k=" + kKey);
}

TEST(LookupRequestHeaders, CarryKeyTenantAndAttempt) {
  LookupHeaders names;
  names.key = "X-Key";
  EXPECT_EQ(lookup_request_headers(names, "acme", kKey, 3),
            (Headers{{"X-Key", kKey}, {"Idempotency-Tenant", "acme"}, {"Idempotency-Attempt", "3"}}));
}

TEST(InterpretLookup, A2xxNamingTheKeyIsTheOriginalResponse) {
  auto r = read(reply(200,
                      {{"Content-Type", "application/json"},
                       {"Idempotency-Key", kKey},
                       {"Idempotency-Original-Status", "201"},
                       {"Idempotency-Tenant", "acme"},
                       {"Location", "/v1/payments/pay_1"},
                       {"Connection", "keep-alive, X-Hop"},
                       {"X-Hop", "1"},
                       {"Content-Length", "12"},
                       {"Transfer-Encoding", "chunked"}},
                      R"({"id":"p1"})"));
  ASSERT_EQ(r.answer, LookupAnswer::happened) << r.detail;
  EXPECT_FALSE(r.oversized);
  EXPECT_EQ(r.response.status, 201);
  EXPECT_EQ(r.response.headers, (Headers{{"Content-Type", "application/json"}, {"Location", "/v1/payments/pay_1"}}));
  EXPECT_EQ(r.response.body, R"({"id":"p1"})");
  // Without Idempotency-Original-Status the lookup's own status is the original's.
  auto plain = read(reply(202, {{"idempotency-key", kKey}}, "queued"));
  ASSERT_EQ(plain.answer, LookupAnswer::happened);
  EXPECT_EQ(plain.response.status, 202);
  // A 4xx that was stored (402 insufficient funds) is an outcome too.
  auto refused = read(reply(200, {{"Idempotency-Key", kKey}, {"Idempotency-Original-Status", "402"}}));
  ASSERT_EQ(refused.answer, LookupAnswer::happened);
  EXPECT_EQ(refused.response.status, 402);
}

TEST(InterpretLookup, AnOversizedAnswerHappenedButIsNotStoredAsItIs) {
  LookupReply r = reply(200, {{"Idempotency-Key", kKey}, {"Idempotency-Original-Status", "201"}}, "partial");
  r.truncated = true;
  auto result = read(r);
  ASSERT_EQ(result.answer, LookupAnswer::happened);
  EXPECT_TRUE(result.oversized);
  EXPECT_EQ(result.response.status, 201);
  EXPECT_TRUE(result.response.body.empty());
}

TEST(InterpretLookup, OnlyTheMarkedNotFoundSaysItNeverHappened) {
  EXPECT_EQ(read(reply(404, {{"Idempotency-Lookup", "not_found"}, {"Idempotency-Key", kKey}})).answer,
            LookupAnswer::not_found);
  EXPECT_EQ(read(reply(404, {{"idempotency-lookup", "NOT_FOUND"}, {"Idempotency-Key", kKey}})).answer,
            LookupAnswer::not_found);
  auto unmarked = read(reply(404, {{"Idempotency-Key", kKey}}, "Not Found"));
  EXPECT_EQ(unmarked.answer, LookupAnswer::unknown);
  EXPECT_NE(unmarked.detail.find("404 without Idempotency-Lookup"), std::string::npos) << unmarked.detail;
  EXPECT_EQ(read(reply(404, {{"Idempotency-Lookup", "gone"}, {"Idempotency-Key", kKey}})).answer,
            LookupAnswer::malformed);
  EXPECT_EQ(read(reply(404, {{"Idempotency-Lookup", "not_found"}})).answer, LookupAnswer::malformed);
}

TEST(InterpretLookup, AnAnswerAboutAnotherKeyIsRefused) {
  auto other = read(reply(200, {{"Idempotency-Key", "someone-elses-key-000001"}}, "{}"));
  EXPECT_EQ(other.answer, LookupAnswer::mismatch);
  EXPECT_NE(other.detail.find("someone-elses-key-000001"), std::string::npos);
  EXPECT_EQ(read(reply(404, {{"Idempotency-Lookup", "not_found"}, {"Idempotency-Key", kKey + "x"}})).answer,
            LookupAnswer::mismatch);
  EXPECT_EQ(read(reply(200, {{"Idempotency-Key", kKey}, {"Idempotency-Key", kKey}})).answer, LookupAnswer::malformed);
  EXPECT_EQ(read(reply(200, {}, "{}")).answer, LookupAnswer::malformed);  // names no key at all
  LookupRules renamed;
  renamed.key_header = "X-Request-Key";
  EXPECT_EQ(read(reply(200, {{"Idempotency-Key", kKey}}), renamed).answer, LookupAnswer::malformed);
  EXPECT_EQ(read(reply(200, {{"x-request-key", kKey}}), renamed).answer, LookupAnswer::happened);
}

TEST(InterpretLookup, AnythingElseIsUnknown) {
  for (int status : {500, 502, 503, 301, 400, 401, 409, 429, 100}) {
    auto r = read(reply(status, {{"Idempotency-Key", kKey}}));
    EXPECT_EQ(r.answer, LookupAnswer::unknown) << status;
    EXPECT_NE(r.detail.find(std::to_string(status)), std::string::npos) << r.detail;
  }
}

TEST(InterpretLookup, TheOriginalStatusMustBeAStoredOutcome) {
  for (const char* bad : {"2o1", "20", "2010", "199", "600", "", "201, 202"}) {
    EXPECT_EQ(read(reply(200, {{"Idempotency-Key", kKey}, {"Idempotency-Original-Status", bad}})).answer,
              LookupAnswer::malformed)
        << bad;
  }
  for (const char* not_stored : {"409", "429", "408", "425", "500", "503"}) {
    EXPECT_EQ(read(reply(200, {{"Idempotency-Key", kKey}, {"Idempotency-Original-Status", not_stored}})).answer,
              LookupAnswer::malformed)
        << not_stored;
  }
  LookupRules stripe;
  stripe.store_server_errors = true;
  EXPECT_EQ(read(reply(200, {{"Idempotency-Key", kKey}, {"Idempotency-Original-Status", "500"}}), stripe).answer,
            LookupAnswer::happened);
  EXPECT_EQ(read(reply(200, {{"Idempotency-Key", kKey},
                             {"Idempotency-Original-Status", "201"},
                             {"Idempotency-Original-Status", "201"}}))
                .answer,
            LookupAnswer::malformed);
}

}  // namespace
}  // namespace idem::http
