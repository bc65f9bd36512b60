#include "idem/client/retry.hpp"

#include <gtest/gtest.h>

#include "fakes.hpp"

namespace idem::client {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::problem;
using testing::response;

constexpr TimePoint kNov1994 = from_epoch_ms(784'111'777'000);  // Sun, 06 Nov 1994 08:49:37 GMT

TEST(Classify, SuccessIs2xx) {
  for (int status : {200, 201, 202, 204, 299}) EXPECT_EQ(classify(response(status)), AnswerClass::success) << status;
}

TEST(Classify, RetriesExactlyTheSpecsStatuses) {
  for (int status : {408, 429, 500, 502, 503, 504}) EXPECT_EQ(classify(response(status)), AnswerClass::retry) << status;
  EXPECT_EQ(classify(problem(409, "idempotency_key_in_use")), AnswerClass::retry);
  EXPECT_EQ(classify(problem(503, "idempotency_store_unavailable")), AnswerClass::retry);
}

TEST(Classify, NeverRetriesOtherStatuses) {
  for (int status : {100, 301, 302, 304, 400, 401, 402, 403, 404, 405, 406, 409, 410, 411, 412, 413, 415, 422, 425,
                     428, 431, 451, 501, 505, 511}) {
    EXPECT_EQ(classify(response(status)), AnswerClass::final) << status;
  }
  EXPECT_EQ(classify(problem(422, "idempotency_key_mismatch")), AnswerClass::final);
  EXPECT_EQ(classify(problem(400, "idempotency_key_invalid")), AnswerClass::final);
  // A Retry-After does not make a 400 or 422 retryable: the request itself must change.
  EXPECT_EQ(classify(response(422, {{"Retry-After", "1"}})), AnswerClass::final);
  EXPECT_EQ(classify(response(400, {{"Retry-After", "1"}})), AnswerClass::final);
}

TEST(Classify, OutcomeUnknownIsForAnOperator) {
  EXPECT_EQ(classify(problem(409, "idempotency_outcome_unknown")), AnswerClass::outcome_unknown);
  // Even with a Retry-After.
  EXPECT_EQ(classify(problem(409, "idempotency_outcome_unknown", {{"Retry-After", "1"}})),
            AnswerClass::outcome_unknown);
}

TEST(Classify, ConflictWithoutIdemCodeIsRetriedOnlyWithRetryAfter) {
  EXPECT_EQ(classify(response(409, {{"Retry-After", "2"}}, "busy")), AnswerClass::retry);
  EXPECT_EQ(classify(response(409, {}, "busy")), AnswerClass::final);
  EXPECT_EQ(classify(problem(409, "order_already_shipped", {{"Retry-After", "2"}})), AnswerClass::final);
  RetryOptions strict;
  strict.retry_conflict_with_retry_after = false;
  EXPECT_EQ(classify(response(409, {{"Retry-After", "2"}}), strict), AnswerClass::final);
  EXPECT_EQ(classify(problem(409, "idempotency_key_in_use"), strict), AnswerClass::retry);
}

TEST(HttpDate, ParsesTheThreeForms) {
  EXPECT_EQ(parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"), kNov1994);
  EXPECT_EQ(parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT"), kNov1994);
  EXPECT_EQ(parse_http_date("Sun Nov  6 08:49:37 1994"), kNov1994);
  EXPECT_EQ(parse_http_date("Sun Nov 16 08:49:37 1994"), kNov1994 + std::chrono::days(10));
  EXPECT_EQ(parse_http_date("  Sun, 06 Nov 1994 08:49:37 GMT "), kNov1994);
  EXPECT_EQ(parse_http_date("Thu, 01 Jan 1970 00:00:00 GMT"), from_epoch_ms(0));
  EXPECT_EQ(parse_http_date("Thu, 29 Feb 2024 23:59:59 GMT"), from_epoch_ms(1'709'251'199'000));
  EXPECT_EQ(parse_http_date("Thursday, 01-Jan-26 00:00:00 GMT"), from_epoch_ms(1'767'225'600'000));
}

TEST(HttpDate, RejectsWhatIsNotADate) {
  for (const char* text : {"", "Sun, 06 Nov 1994 08:49:37", "Sun, 06 Nov 1994 08:49:37 UTC",
                           "Sun, 6 Nov 1994 08:49:37 GMT", "Sun, 31 Feb 1994 08:49:37 GMT", "Sun, 06 Foo 1994 08:49:37 GMT",
                           "Sun, 06 Nov 1994 24:00:00 GMT", "Sun, 06 Nov 1994 08:61:00 GMT", "Xyz, 06 Nov 1994 08:49:37 GMT",
                           "Someday, 06-Nov-94 08:49:37 GMT", "Sun Nov 6 08:49:37 1994", "1994-11-06T08:49:37Z",
                           "Sun, 06 Nov 1994 08:49:37 GMT x"}) {
    EXPECT_FALSE(parse_http_date(text)) << text;
  }
}

TEST(RetryAfter, DeltaSeconds) {
  EXPECT_EQ(parse_retry_after("0", kNov1994), milliseconds(0));
  EXPECT_EQ(parse_retry_after("7", kNov1994), seconds(7));
  EXPECT_EQ(parse_retry_after(" 120 ", kNov1994), seconds(120));
  // Absurd values saturate instead of overflowing (the deadline then stops the retry).
  const auto huge = parse_retry_after("99999999999999999999999999", kNov1994);
  ASSERT_TRUE(huge);
  EXPECT_GT(*huge, std::chrono::hours(24 * 365));
}

TEST(RetryAfter, HttpDateRelativeToNow) {
  EXPECT_EQ(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", kNov1994 - seconds(12)), seconds(12));
  EXPECT_EQ(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", kNov1994 - milliseconds(1500)), milliseconds(1500));
  EXPECT_EQ(parse_retry_after("Sun, 06 Nov 1994 08:49:37 GMT", kNov1994 + seconds(5)), milliseconds(0));
}

TEST(RetryAfter, NothingForGarbage) {
  for (const char* text : {"", "  ", "-1", "1.5", "soon", "5s", "0x10"}) EXPECT_FALSE(parse_retry_after(text, kNov1994)) << text;
}

TEST(Backoff, DoublesFromOneSecondUpToTheCap) {
  const RetryOptions options;
  EXPECT_EQ(backoff_ceiling(1, options), seconds(1));
  EXPECT_EQ(backoff_ceiling(2, options), seconds(2));
  EXPECT_EQ(backoff_ceiling(3, options), seconds(4));
  EXPECT_EQ(backoff_ceiling(5, options), seconds(16));
  EXPECT_EQ(backoff_ceiling(6, options), seconds(30));
  EXPECT_EQ(backoff_ceiling(100, options), seconds(30));
  EXPECT_EQ(backoff_ceiling(100000, options), seconds(30));  // no overflow
}

TEST(Backoff, FullJitterStaysWithinZeroAndTheCeilingAndSpreadsOverIt) {
  std::mt19937_64 rng(42);
  const Millis ceiling = seconds(4);
  Millis low = ceiling, high{0};
  double sum = 0;
  constexpr int kSamples = 20000;
  for (int i = 0; i < kSamples; ++i) {
    const Millis wait = full_jitter(ceiling, rng);
    ASSERT_GE(wait.count(), 0);
    ASSERT_LE(wait, ceiling);
    low = std::min(low, wait);
    high = std::max(high, wait);
    sum += static_cast<double>(wait.count());
  }
  EXPECT_LT(low, milliseconds(50));
  EXPECT_GT(high, milliseconds(3950));
  EXPECT_NEAR(sum / kSamples, 2000.0, 50.0);
  EXPECT_EQ(full_jitter(Millis{0}, rng), Millis{0});
}

TEST(Backoff, SeededJitterIsReproducible) {
  std::mt19937_64 a(7), b(7);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(full_jitter(seconds(30), a), full_jitter(seconds(30), b));
}

TEST(RetryBudget, StartsFullAndEmptiesOneTokenPerRetry) {
  const SteadyTime t0{};
  RetryBudget budget({.enabled = true, .retry_ratio = 0.1, .min_retries_per_second = 0, .max_tokens = 3}, t0);
  EXPECT_TRUE(budget.try_retry(t0));
  EXPECT_TRUE(budget.try_retry(t0));
  EXPECT_TRUE(budget.try_retry(t0));
  EXPECT_FALSE(budget.try_retry(t0));
  EXPECT_FALSE(budget.try_retry(t0 + std::chrono::hours(1)));  // no floor: time alone earns nothing
}

TEST(RetryBudget, TenOperationsEarnOneRetry) {
  const SteadyTime t0{};
  RetryBudget budget({.enabled = true, .retry_ratio = 0.1, .min_retries_per_second = 0, .max_tokens = 10}, t0);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(budget.try_retry(t0));
  EXPECT_FALSE(budget.try_retry(t0));
  for (int i = 0; i < 9; ++i) budget.on_operation(t0);
  EXPECT_FALSE(budget.try_retry(t0));
  budget.on_operation(t0);
  EXPECT_TRUE(budget.try_retry(t0));
  EXPECT_FALSE(budget.try_retry(t0));
}

TEST(RetryBudget, TheFloorRefillsOverTimeUpToTheBucketSize) {
  const SteadyTime t0{};
  RetryBudget budget({.enabled = true, .retry_ratio = 0, .min_retries_per_second = 2, .max_tokens = 4}, t0);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(budget.try_retry(t0));
  EXPECT_FALSE(budget.try_retry(t0));
  EXPECT_FALSE(budget.try_retry(t0 + milliseconds(400)));
  EXPECT_TRUE(budget.try_retry(t0 + milliseconds(500)));  // 0.5 s at 2/s
  EXPECT_NEAR(budget.tokens(t0 + std::chrono::hours(1)), 4.0, 1e-9);
}

TEST(RetryBudget, DisabledAlwaysAllows) {
  const SteadyTime t0{};
  RetryBudget budget({.enabled = false, .retry_ratio = 0, .min_retries_per_second = 0, .max_tokens = 0}, t0);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(budget.try_retry(t0));
}

}  // namespace
}  // namespace idem::client
