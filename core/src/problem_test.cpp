#include "idem/problem.hpp"

#include <gtest/gtest.h>

namespace idem {
namespace {

Decision decision(Verdict v, std::chrono::seconds retry_after = {}) {
  Decision d;
  d.verdict = v;
  d.detail = "detail with \"quotes\" and \n newline";
  d.retry_after = retry_after;
  return d;
}

TEST(ProblemFor, MapsEveryRefusalToSpecStatusAndCode) {
  struct Case {
    Verdict verdict;
    int status;
    const char* code;
  } cases[] = {
      {Verdict::key_missing, 400, "idempotency_key_missing"},
      {Verdict::key_invalid, 400, "idempotency_key_invalid"},
      {Verdict::in_use, 409, "idempotency_key_in_use"},
      {Verdict::outcome_unknown, 409, "idempotency_outcome_unknown"},
      {Verdict::mismatch, 422, "idempotency_key_mismatch"},
      {Verdict::store_unavailable, 503, "idempotency_store_unavailable"},
      {Verdict::record_unreadable, 500, "idempotency_record_unreadable"},
  };
  for (const auto& c : cases) {
    auto p = problem_for(decision(c.verdict, std::chrono::seconds{3}));
    ASSERT_TRUE(p) << c.code;
    EXPECT_EQ(p->status, c.status);
    EXPECT_EQ(p->code, c.code);
    EXPECT_EQ(p->conflict, c.verdict == Verdict::mismatch);
    const bool wants_retry_after = c.verdict == Verdict::in_use || c.verdict == Verdict::store_unavailable;
    EXPECT_EQ(p->retry_after_seconds.has_value(), wants_retry_after) << c.code;
    if (wants_retry_after) {
      EXPECT_EQ(*p->retry_after_seconds, 3);
    }
  }
}

TEST(ProblemFor, RetryAfterIsAtLeastOneSecond) {
  EXPECT_EQ(problem_for(decision(Verdict::in_use, std::chrono::seconds{0}))->retry_after_seconds, 1);
}

TEST(ProblemFor, NonRefusalsHaveNoProblem) {
  EXPECT_FALSE(problem_for(decision(Verdict::pass_through)));
  EXPECT_FALSE(problem_for(decision(Verdict::execute)));
  EXPECT_FALSE(problem_for(decision(Verdict::replay)));
}

TEST(ProblemJson, HasTheRfc9457MembersAndEscapes) {
  auto p = *problem_for(decision(Verdict::mismatch));
  EXPECT_EQ(problem_json(p),
            "{\"type\":\"https://idem.dev/problems/idempotency_key_mismatch\","
            "\"title\":\"This key was used with a different request\",\"status\":422,"
            "\"detail\":\"detail with \\\"quotes\\\" and \\n newline\",\"code\":\"idempotency_key_mismatch\"}");
}

TEST(ProblemJson, EscapesControlCharacters) {
  auto p = make_problem(502, "upstream_unreachable", "t", std::string("a\x01z"));
  EXPECT_NE(problem_json(p).find("a\\u0001z"), std::string::npos);
}

TEST(RequestTooLarge, Is413) {
  auto p = request_too_large("body above 1 MiB");
  EXPECT_EQ(p.status, 413);
  EXPECT_EQ(p.code, "request_too_large");
}

}  // namespace
}  // namespace idem
