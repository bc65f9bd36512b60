#include "idem/client/http.hpp"

#include <gtest/gtest.h>

namespace idem::client {
namespace {

TEST(FindHeader, IgnoresCaseAndReturnsTheFirst) {
  const Headers headers{{"Content-Type", "a"}, {"retry-after", "3"}, {"RETRY-AFTER", "4"}};
  EXPECT_EQ(find_header(headers, "Retry-After"), "3");
  EXPECT_EQ(find_header(headers, "content-type"), "a");
  EXPECT_FALSE(find_header(headers, "Content-Length"));
}

TEST(IsReplay, RecognisesEverySpellingInAnyCase) {
  for (const char* name : {"Idempotent-Replayed", "Idempotency-Replayed", "X-Idempotent-Replayed",
                           "idempotent-replayed", "IDEMPOTENCY-REPLAYED", "x-idempotent-replayed"}) {
    for (const char* value : {"true", "TRUE", "True", " true "}) {
      EXPECT_TRUE(is_replay({{"Content-Type", "text/plain"}, {name, value}})) << name << ": " << value;
    }
  }
}

TEST(IsReplay, NeedsTheValueTrue) {
  EXPECT_FALSE(is_replay({}));
  EXPECT_FALSE(is_replay({{"Idempotent-Replayed", "false"}}));
  EXPECT_FALSE(is_replay({{"Idempotent-Replayed", "1"}}));
  EXPECT_FALSE(is_replay({{"Idempotent-Replayed", ""}}));
  EXPECT_FALSE(is_replay({{"Replayed", "true"}}));
  EXPECT_FALSE(is_replay({{"Idempotent-Replayed-X", "true"}}));
}

TEST(ProblemCode, ReadsTheTopLevelCode) {
  EXPECT_EQ(problem_code(R"({"type":"x","code":"idempotency_key_in_use","status":409})"), "idempotency_key_in_use");
  EXPECT_EQ(problem_code(" {\n \"status\" : 409 , \"extra\": {\"code\": \"nested\"}, \"list\": [1, 2.5e3, null, true,"
                         " {\"a\": [\"]\"]}], \"code\" : \"idempotency_outcome_unknown\" } "),
            "idempotency_outcome_unknown");
  EXPECT_EQ(problem_code(R"({"code":"a\"b\u0041"})"), "a\"bA");
}

TEST(ProblemCode, NothingForOtherBodies) {
  EXPECT_FALSE(problem_code(""));
  EXPECT_FALSE(problem_code("conflict"));
  EXPECT_FALSE(problem_code("[\"code\"]"));
  EXPECT_FALSE(problem_code(R"({"error":{"code":"idempotency_key_in_use"}})"));
  EXPECT_FALSE(problem_code(R"({"code":409})"));
  EXPECT_FALSE(problem_code(R"({"code":"unterminated)"));
  EXPECT_FALSE(problem_code(R"({"a":1 "code":"x"})"));
  EXPECT_FALSE(problem_code(std::string(200, '[')));
}

}  // namespace
}  // namespace idem::client
