#include "idem/client/client.hpp"

#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "fakes.hpp"
#include "idem/client/key.hpp"

namespace idem::client {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::failure;
using testing::FakeTimer;
using testing::Outcome;
using testing::problem;
using testing::response;
using testing::ScriptedTransport;
using testing::sent_key;

HttpRequest charge() {
  return HttpRequest{"POST", "https://api.example.com/v1/charges", {{"Content-Type", "application/json"}},
                     R"({"amount":100})"};
}

// A client over fakes, with seeded jitter and (unless a test wants it) no budget in the way.
struct Fixture {
  explicit Fixture(std::vector<Outcome> script = {}, ClientOptions options = base_options())
      : transport(std::make_shared<ScriptedTransport>(std::move(script))),
        timer(std::make_shared<FakeTimer>()),
        client(std::move(options), transport, nullptr, timer) {
    transport->timer = timer.get();
  }

  static ClientOptions base_options() {
    ClientOptions options;
    options.jitter_seed = 1;
    options.budget.enabled = false;
    return options;
  }

  std::shared_ptr<ScriptedTransport> transport;
  std::shared_ptr<FakeTimer> timer;
  Client client;
};

TEST(Client, SendsOnceWithANewUuidKeyAndReturnsTheAnswer) {
  Fixture f({response(201, {{"Location", "/v1/charges/1"}}, "created")});
  const SendResult r = f.client.send(charge());
  EXPECT_EQ(r.stop, StopReason::success);
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(r.attempts, 1);
  EXPECT_TRUE(is_uuid_v4(r.key)) << r.key;
  ASSERT_TRUE(r.response);
  EXPECT_EQ(r.response->status, 201);
  EXPECT_EQ(r.response->body, "created");
  EXPECT_FALSE(r.replayed);
  EXPECT_FALSE(r.error);

  const auto sent = f.transport->requests();
  ASSERT_EQ(sent.size(), 1u);
  EXPECT_EQ(sent_key(sent[0]), r.key);
  EXPECT_EQ(sent[0].method, "POST");
  EXPECT_EQ(sent[0].url, "https://api.example.com/v1/charges");
  EXPECT_EQ(sent[0].body, R"({"amount":100})");
  EXPECT_EQ(find_header(sent[0].headers, "Content-Type"), "application/json");
  EXPECT_TRUE(f.timer->sleeps().empty());
}

TEST(Client, EveryOperationGetsItsOwnKey) {
  Fixture f;
  std::set<std::string> keys;
  for (int i = 0; i < 50; ++i) keys.insert(f.client.send(charge()).key);
  EXPECT_EQ(keys.size(), 50u);
}

TEST(Client, UsesTheCallersKey) {
  Fixture f;
  const SendResult r = f.client.send(charge(), "order-4711-payment-1");
  EXPECT_EQ(r.key, "order-4711-payment-1");
  EXPECT_EQ(sent_key(f.transport->requests().at(0)), "order-4711-payment-1");
}

TEST(Client, AdoptsAKeyHeaderAlreadyInTheRequestAndSendsItOnce) {
  Fixture f;
  HttpRequest request = charge();
  request.headers.push_back({"idempotency-key", "\"order-4711-payment-1\""});  // the quoted IETF form
  const SendResult r = f.client.send(request);
  EXPECT_EQ(r.key, "order-4711-payment-1");
  EXPECT_EQ(sent_key(f.transport->requests().at(0)), "order-4711-payment-1");
}

TEST(Client, RefusesBadKeysWithoutSending) {
  Fixture f;
  EXPECT_EQ(f.client.send(charge(), "short").stop, StopReason::invalid_request);
  EXPECT_EQ(f.client.send(charge(), "has a space in the middle").stop, StopReason::invalid_request);
  EXPECT_EQ(f.client.send(charge(), "comma,is,a,list,in,bare,form").stop, StopReason::invalid_request);
  EXPECT_EQ(f.client.send(charge(), std::string(257, 'k')).stop, StopReason::invalid_request);

  HttpRequest two = charge();
  two.headers.push_back({"Idempotency-Key", "key-number-one-0001"});
  two.headers.push_back({"Idempotency-Key", "key-number-two-0002"});
  EXPECT_EQ(f.client.send(two).stop, StopReason::invalid_request);

  HttpRequest differs = charge();
  differs.headers.push_back({"Idempotency-Key", "key-number-one-0001"});
  const SendResult r = f.client.send(differs, "key-number-two-0002");
  EXPECT_EQ(r.stop, StopReason::invalid_request);
  EXPECT_FALSE(r.detail.empty());
  EXPECT_EQ(f.transport->calls(), 0u);
}

TEST(Client, QuotesTheKeyAsAStructuredFieldStringWhenAsked) {
  ClientOptions options = Fixture::base_options();
  options.quote_key = true;
  options.key_header = "X-Request-Key";
  Fixture f({}, options);
  const SendResult r = f.client.send(charge(), "commas,are,fine,when,quoted");
  EXPECT_EQ(r.stop, StopReason::success);
  EXPECT_EQ(sent_key(f.transport->requests().at(0), "X-Request-Key"), "\"commas,are,fine,when,quoted\"");
}

class RetriedStatus : public ::testing::TestWithParam<int> {};

TEST_P(RetriedStatus, IsRetriedWithTheSameKey) {
  Fixture f({response(GetParam()), response(200, {}, "done")});
  const SendResult r = f.client.send(charge());
  EXPECT_EQ(r.stop, StopReason::success);
  EXPECT_EQ(r.attempts, 2);
  EXPECT_EQ(r.response->body, "done");
  const auto sent = f.transport->requests();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent_key(sent[0]), r.key);
  EXPECT_EQ(sent_key(sent[1]), r.key);
  EXPECT_EQ(sent[0], sent[1]);
  EXPECT_EQ(f.timer->sleeps().size(), 1u);
}

INSTANTIATE_TEST_SUITE_P(Spec, RetriedStatus, ::testing::Values(408, 429, 500, 502, 503, 504));

TEST(Client, RetriesKeyInUse) {
  Fixture f({problem(409, "idempotency_key_in_use", {{"Retry-After", "1"}}), response(201)});
  const SendResult r = f.client.send(charge());
  EXPECT_EQ(r.stop, StopReason::success);
  EXPECT_EQ(r.attempts, 2);
  EXPECT_EQ(f.timer->sleeps(), std::vector<Millis>{seconds(1)});
}

TEST(Client, RetriesConnectionErrorsBothBeforeAndAfterSending) {
  Fixture f({failure(TransportErrc::could_not_connect), failure(TransportErrc::no_answer), response(201)});
  const SendResult r = f.client.send(charge());
  EXPECT_EQ(r.stop, StopReason::success);
  EXPECT_EQ(r.attempts, 3);
  EXPECT_FALSE(r.error);
  const auto sent = f.transport->requests();
  EXPECT_EQ(sent_key(sent[2]), sent_key(sent[0]));
}

TEST(Client, StopsOnATransportErrorARetryCannotFix) {
  Fixture f({failure(TransportErrc::failed)});
  const SendResult r = f.client.send(charge());
  EXPECT_EQ(r.stop, StopReason::transport_failed);
  EXPECT_EQ(r.attempts, 1);
  ASSERT_TRUE(r.error);
  EXPECT_EQ(r.error->code, TransportErrc::failed);
}

class FinalStatus : public ::testing::TestWithParam<int> {};

TEST_P(FinalStatus, IsNeverRetried) {
  // A Retry-After changes nothing, except that it makes a bare 409 a temporary conflict.
  Headers headers;
  if (GetParam() != 409) headers.push_back({"Retry-After", "1"});
  Fixture f({response(GetParam(), headers, "no")});
  const SendResult r = f.client.send(charge());
  EXPECT_EQ(r.stop, StopReason::non_retryable);
  EXPECT_EQ(r.attempts, 1);
  EXPECT_EQ(r.response->status, GetParam());
  EXPECT_TRUE(f.timer->sleeps().empty());
}

INSTANTIATE_TEST_SUITE_P(Spec, FinalStatus,
                         ::testing::Values(301, 400, 401, 403, 404, 405, 409, 410, 413, 415, 422, 425, 501, 505));

TEST(Client, MismatchIsFinal) {
  Fixture f({problem(422, "idempotency_key_mismatch", {{"X-Idempotency-Conflict", "true"}})});
  const SendResult r = f.client.send(charge());
  EXPECT_EQ(r.stop, StopReason::non_retryable);
  EXPECT_EQ(r.attempts, 1);
}

TEST(Client, OutcomeUnknownStopsForAnOperator) {
  Fixture f({problem(409, "idempotency_outcome_unknown")});
  const SendResult r = f.client.send(charge());
  EXPECT_EQ(r.stop, StopReason::outcome_unknown);
  EXPECT_EQ(r.attempts, 1);
}

TEST(Client, ReportsAReplay) {
  Fixture f({failure(TransportErrc::no_answer), response(201, {{"Idempotent-Replayed", "true"}}, "created")});
  const SendResult r = f.client.send(charge());
  EXPECT_EQ(r.stop, StopReason::success);
  EXPECT_TRUE(r.replayed);
  for (const char* name : {"idempotency-replayed", "X-Idempotent-Replayed"}) {
    Fixture g({response(200, {{name, "TRUE"}})});
    EXPECT_TRUE(g.client.send(charge()).replayed) << name;
  }
}

TEST(Client, GivesUpAfterMaxAttemptsUsingOneKeyThroughout) {
  Fixture f;
  f.transport->fallback = response(503, {}, "down");
  const SendResult r = f.client.send(charge());
  EXPECT_EQ(r.stop, StopReason::attempts_exhausted);
  EXPECT_EQ(r.attempts, 5);
  EXPECT_EQ(r.response->status, 503);
  const auto sent = f.transport->requests();
  ASSERT_EQ(sent.size(), 5u);
  for (const auto& request : sent) EXPECT_EQ(sent_key(request), r.key);
  EXPECT_EQ(f.timer->sleeps().size(), 4u);  // no pointless wait after the last attempt
}

TEST(Client, HonoursMaxAttempts) {
  ClientOptions options = Fixture::base_options();
  options.retry.max_attempts = 3;
  Fixture f({}, options);
  f.transport->fallback = failure(TransportErrc::no_answer);
  const SendResult r = f.client.send(charge());
  EXPECT_EQ(r.stop, StopReason::attempts_exhausted);
  EXPECT_EQ(r.attempts, 3);
  ASSERT_TRUE(r.error);
  EXPECT_FALSE(r.response);
}

TEST(Client, BacksOffExponentiallyWithFullJitterUnderTheCap) {
  ClientOptions options = Fixture::base_options();
  options.retry.max_attempts = 10;
  options.retry.deadline = std::chrono::hours(1);
  for (std::uint64_t seed = 1; seed <= 30; ++seed) {
    options.jitter_seed = seed;
    Fixture f({}, options);
    f.transport->fallback = response(500);
    ASSERT_EQ(f.client.send(charge()).attempts, 10);
    const auto sleeps = f.timer->sleeps();
    ASSERT_EQ(sleeps.size(), 9u);
    for (std::size_t i = 0; i < sleeps.size(); ++i) {
      const Millis ceiling = std::min<Millis>(seconds(30), seconds(1) * (1LL << i));
      EXPECT_GE(sleeps[i].count(), 0);
      EXPECT_LE(sleeps[i], ceiling) << "retry " << i + 1 << " seed " << seed;
    }
  }
}

TEST(Client, SeededJitterIsReproducible) {
  Fixture a, b;
  a.transport->fallback = b.transport->fallback = response(503);
  a.client.send(charge());
  b.client.send(charge());
  EXPECT_EQ(a.timer->sleeps(), b.timer->sleeps());
}

TEST(Client, RetryAfterSecondsBeatsTheBackoff) {
  Fixture f({response(503, {{"Retry-After", "7"}}), response(429, {{"Retry-After", "0"}}), response(200)});
  const SendResult r = f.client.send(charge());
  EXPECT_EQ(r.stop, StopReason::success);
  EXPECT_EQ(f.timer->sleeps(), (std::vector<Millis>{seconds(7), seconds(0)}));
}

TEST(Client, RetryAfterHttpDateBeatsTheBackoff) {
  // 12 s after the fake timer's wall clock (2026-01-01T00:00:00Z), then 40 s after it.
  Fixture f({response(503, {{"Retry-After", "Thu, 01 Jan 2026 00:00:12 GMT"}}),
               response(503, {{"Retry-After", "Thursday, 01-Jan-26 00:00:40 GMT"}}), response(200)});
  const SendResult r = f.client.send(charge());
  EXPECT_EQ(r.stop, StopReason::success);
  EXPECT_EQ(f.timer->sleeps(), (std::vector<Millis>{seconds(12), seconds(28)}));
}

TEST(Client, AnUnreadableRetryAfterFallsBackToTheBackoff) {
  Fixture f({response(503, {{"Retry-After", "soon"}}), response(200)});
  f.client.send(charge());
  ASSERT_EQ(f.timer->sleeps().size(), 1u);
  EXPECT_LE(f.timer->sleeps()[0], seconds(1));
}

TEST(Client, RetryAfterCanBeIgnoredByOption) {
  ClientOptions options = Fixture::base_options();
  options.retry.honor_retry_after = false;
  Fixture f({response(503, {{"Retry-After", "20"}}), response(200)}, options);
  f.client.send(charge());
  ASSERT_EQ(f.timer->sleeps().size(), 1u);
  EXPECT_LE(f.timer->sleeps()[0], seconds(1));
}

TEST(Client, ARetryAfterBeyondTheDeadlineStopsInsteadOfRetryingEarly) {
  Fixture f({response(503, {{"Retry-After", "3600"}})});
  const SendResult r = f.client.send(charge());
  EXPECT_EQ(r.stop, StopReason::deadline);
  EXPECT_EQ(r.attempts, 1);
  EXPECT_TRUE(f.timer->sleeps().empty());
}

TEST(Client, StopsWhenTheNextWaitWouldCrossTheDeadline) {
  ClientOptions options = Fixture::base_options();
  options.retry.deadline = seconds(10);
  options.retry.max_attempts = 100;
  Fixture f({}, options);
  f.transport->fallback = response(503, {{"Retry-After", "4"}});
  const SendResult r = f.client.send(charge());
  // Attempts at 0 s, 4 s and 8 s; a fourth would start at 12 s.
  EXPECT_EQ(r.stop, StopReason::deadline);
  EXPECT_EQ(r.attempts, 3);
  EXPECT_EQ(f.timer->sleeps().size(), 2u);
}

TEST(Client, EveryAttemptHasATimeout) {
  ClientOptions options = Fixture::base_options();
  options.retry.attempt_timeout = seconds(3);
  Fixture f({}, options);
  f.transport->latency = seconds(3);  // every attempt times out
  f.transport->fallback = failure(TransportErrc::no_answer);
  EXPECT_EQ(f.client.send(charge()).stop, StopReason::attempts_exhausted);
  EXPECT_EQ(f.transport->timeouts(), std::vector<Millis>(5, seconds(3)));
}

TEST(Client, AttemptTimeoutNeverExceedsTheRemainingDeadline) {
  ClientOptions options = Fixture::base_options();
  options.retry.deadline = seconds(10);
  options.retry.attempt_timeout = seconds(30);
  Fixture f({response(503, {{"Retry-After", "4"}}), response(503, {{"Retry-After", "4"}}), response(200)}, options);
  f.transport->latency = milliseconds(500);
  EXPECT_EQ(f.client.send(charge()).stop, StopReason::success);
  EXPECT_EQ(f.transport->timeouts(), (std::vector<Millis>{seconds(10), milliseconds(5500), milliseconds(1000)}));
}

TEST(Client, ABudgetShortOfTokensStopsRetriesAcrossCalls) {
  ClientOptions options = Fixture::base_options();
  options.budget = {.enabled = true, .retry_ratio = 0.0, .min_retries_per_second = 0.0, .max_tokens = 3};
  Fixture f({}, options);
  f.transport->fallback = response(503, {{"Retry-After", "0"}});

  const SendResult first = f.client.send(charge());
  EXPECT_EQ(first.stop, StopReason::budget_exhausted);
  EXPECT_EQ(first.attempts, 4);  // three retries paid for
  EXPECT_EQ(first.response->status, 503);

  const SendResult second = f.client.send(charge());  // same Client: same bucket
  EXPECT_EQ(second.stop, StopReason::budget_exhausted);
  EXPECT_EQ(second.attempts, 1);
  EXPECT_NEAR(f.client.retry_tokens(), 0.0, 1e-9);
}

TEST(Client, BudgetRefillsFromTrafficAndTime) {
  ClientOptions options = Fixture::base_options();
  options.budget = {.enabled = true, .retry_ratio = 0.5, .min_retries_per_second = 0.1, .max_tokens = 1};
  Fixture f({}, options);
  f.transport->fallback = response(200);
  EXPECT_NEAR(f.client.retry_tokens(), 1.0, 1e-9);
  f.transport->fallback = response(503, {{"Retry-After", "0"}});
  EXPECT_EQ(f.client.send(charge()).attempts, 2);  // 1 + 0.5 (capped at 1) → one retry
  EXPECT_EQ(f.client.send(charge()).attempts, 1);  // 0.5: not enough
  EXPECT_EQ(f.client.send(charge()).attempts, 2);  // 0.5 + 0.5
  f.timer->advance(seconds(10));                   // the floor: 0.1/s
  EXPECT_EQ(f.client.send(charge()).attempts, 2);
}

TEST(Client, TheDefaultBudgetLetsAFewOperationsRetryFullyButNotAFleet) {
  ClientOptions options;
  options.jitter_seed = 3;
  Fixture f({}, options);
  f.transport->fallback = response(503, {{"Retry-After", "0"}});
  // Ten tokens: the first two operations retry fully (4 each), the third gets two.
  EXPECT_EQ(f.client.send(charge()).attempts, 5);
  EXPECT_EQ(f.client.send(charge()).attempts, 5);
  EXPECT_EQ(f.client.send(charge()).attempts, 3);
  // Then the outage costs about one retry per ten operations.
  int attempts = 0;
  for (int i = 0; i < 100; ++i) attempts += f.client.send(charge()).attempts;
  EXPECT_LE(attempts, 112);
}

TEST(Client, BeforeAttemptDecoratesEveryAttempt) {
  ClientOptions options = Fixture::base_options();
  int calls = 0;
  options.before_attempt = [&](HttpRequest& request) {
    request.headers.push_back({"Authorization", "Bearer token-" + std::to_string(++calls)});
  };
  Fixture f({response(503, {{"Retry-After", "0"}}), response(200)}, options);
  f.client.send(charge());
  const auto sent = f.transport->requests();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(find_header(sent[0].headers, "Authorization"), "Bearer token-1");
  EXPECT_EQ(find_header(sent[1].headers, "Authorization"), "Bearer token-2");
}

TEST(Client, RefusesToSendAKeyAlreadyInFlight) {
  Fixture f;
  SendResult inner;
  f.transport->on_perform = [&](const HttpRequest&) {
    f.transport->on_perform = nullptr;
    inner = f.client.send(charge(), "the-same-key-twice-0001");
  };
  const SendResult outer = f.client.send(charge(), "the-same-key-twice-0001");
  EXPECT_EQ(outer.stop, StopReason::success);
  EXPECT_EQ(inner.stop, StopReason::invalid_request);
  EXPECT_EQ(f.transport->calls(), 1u);
  // Once finished, the key may be sent again (a replay, from the server's point of view).
  EXPECT_EQ(f.client.send(charge(), "the-same-key-twice-0001").stop, StopReason::success);
}

TEST(Client, IsSafeToShareBetweenThreads) {
  ClientOptions options = Fixture::base_options();
  Fixture f({}, options);
  f.transport->fallback = response(200);
  std::vector<std::thread> threads;
  std::mutex mutex;
  std::set<std::string> keys;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) {
        const SendResult r = f.client.send(charge());
        std::lock_guard lock(mutex);
        EXPECT_EQ(r.stop, StopReason::success);
        keys.insert(r.key);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(keys.size(), 800u);
  EXPECT_EQ(f.transport->calls(), 800u);
}

TEST(StopReason, HasStableNames) {
  EXPECT_EQ(to_string(StopReason::success), "success");
  EXPECT_EQ(to_string(StopReason::budget_exhausted), "budget_exhausted");
  EXPECT_EQ(to_string(StopReason::attempts_exhausted), "attempts_exhausted");
  EXPECT_EQ(to_string(StopReason::deadline), "deadline");
}

}  // namespace
}  // namespace idem::client
