#include "idem/error_envelope.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "idem/jcs.hpp"

namespace idem {
namespace {

Problem in_use() {
  Problem p = make_problem(409, "idempotency_key_in_use", "A request with this key is in progress",
                           "detail with \"quotes\" and \n newline");
  p.retry_after_seconds = 2;
  return p;
}

std::string canonical(const std::string& json) {
  auto c = canonicalize_json(json);
  EXPECT_TRUE(c.has_value()) << json;
  return c.value_or("");
}

TEST(ErrorEnvelope, ProblemJsonIsTheDefaultBody) {
  const auto e = ErrorEnvelope::problem_json();
  EXPECT_EQ(e->style(), ErrorEnvelope::Style::problem_json);
  EXPECT_EQ(e->content_type(), "application/problem+json");
  EXPECT_EQ(e->body(in_use()), problem_json(in_use()));
}

TEST(ErrorEnvelope, StripeErrorObjectWithStripesTypes) {
  const auto e = ErrorEnvelope::stripe();
  EXPECT_EQ(e->content_type(), "application/json");
  EXPECT_EQ(canonical(e->body(in_use())),
            R"({"error":{"code":"idempotency_key_in_use","message":"detail with \"quotes\" and \n newline","type":"idempotency_error"}})");
  struct Case {
    int status;
    const char* code;
    const char* type;
  } cases[] = {
      {400, "idempotency_key_missing", "invalid_request_error"},
      {400, "idempotency_key_invalid", "invalid_request_error"},
      {400, "tenant_ambiguous", "invalid_request_error"},
      {400, "bad_request", "invalid_request_error"},
      {401, "token_invalid", "invalid_request_error"},
      {409, "idempotency_key_in_use", "idempotency_error"},
      {409, "idempotency_outcome_unknown", "idempotency_error"},
      {410, "idempotency_response_not_stored", "invalid_request_error"},
      {413, "request_too_large", "invalid_request_error"},
      {422, "idempotency_key_mismatch", "idempotency_error"},
      {431, "request_header_too_large", "invalid_request_error"},
      {500, "idempotency_record_unreadable", "api_error"},
      {501, "not_implemented", "api_error"},
      {502, "upstream_unreachable", "api_error"},
      {503, "idempotency_store_unavailable", "api_error"},
      {504, "upstream_timeout", "api_error"},
  };
  for (const auto& c : cases) {
    const Problem p = make_problem(c.status, c.code, "t", "d");
    EXPECT_EQ(stripe_error_type(p), c.type) << c.code;
    EXPECT_EQ(canonical(e->body(p)),
              std::string(R"({"error":{"code":")") + c.code + R"(","message":"d","type":")" + c.type + "\"}}");
  }
}

TEST(ErrorEnvelope, TemplateWholeStringPlaceholdersBecomeJsonValues) {
  auto e = ErrorEnvelope::from_template(
      R"({"errors": [{"status": "{{status}}", "code": "{{code}}", "title": "{{title}}", "detail": "{{detail}}", "retry": "{{retry_after}}", "type": "{{type}}"}]})",
      "application/vnd.api+json", "template t.json");
  ASSERT_TRUE(e.has_value()) << e.error();
  EXPECT_EQ((*e)->style(), ErrorEnvelope::Style::custom);
  EXPECT_EQ((*e)->content_type(), "application/vnd.api+json");
  EXPECT_EQ((*e)->name(), "template t.json");
  EXPECT_EQ(canonical((*e)->body(in_use())),
            R"({"errors":[{"code":"idempotency_key_in_use","detail":"detail with \"quotes\" and \n newline","retry":2,"status":409,"title":"A request with this key is in progress","type":"https://idem.dev/problems/idempotency_key_in_use"}]})");
  Problem no_retry = make_problem(422, "idempotency_key_mismatch", "t", "d");
  EXPECT_EQ(canonical((*e)->body(no_retry)),
            R"({"errors":[{"code":"idempotency_key_mismatch","detail":"d","retry":null,"status":422,"title":"t","type":"https://idem.dev/problems/idempotency_key_mismatch"}]})");
}

TEST(ErrorEnvelope, TemplateInlinePlaceholdersAreEscapedText) {
  auto e = ErrorEnvelope::from_template(R"({"message": "{{code}} ({{status}}): {{detail}}; retry in {{retry_after}}s", "n": 1})",
                                        "application/json", "inline");
  ASSERT_TRUE(e.has_value()) << e.error();
  EXPECT_EQ(canonical((*e)->body(in_use())),
            R"({"message":"idempotency_key_in_use (409): detail with \"quotes\" and \n newline; retry in 2s","n":1})");
  EXPECT_EQ(canonical((*e)->body(make_problem(400, "x", "t", "d"))), R"({"message":"x (400): d; retry in s","n":1})");
}

TEST(ErrorEnvelope, BadTemplatesAreRefusedWithOneSentence) {
  struct Case {
    const char* text;
    const char* content_type;
    const char* error;
  } cases[] = {
      {"", "application/json", "the template is empty"},
      {R"({"a": {{status}}})", "application/json", "a placeholder must be inside a JSON string"},
      {R"({"a": "{{nope}}"})", "application/json", "unknown placeholder {{nope}}"},
      {R"({"a": "x {{nope}} y"})", "application/json", "unknown placeholder {{nope}}"},
      {R"({"a": "x {{code y"})", "application/json", "is not closed"},
      {R"({"a": "unclosed)", "application/json", "a JSON string is not closed"},
      {R"({"a": "{{code}}",})", "application/json", "the template is not JSON"},
      {R"({"a": "{{code}}"})", "json", "is not a media type"},
  };
  for (const auto& c : cases) {
    auto e = ErrorEnvelope::from_template(c.text, c.content_type, "t");
    ASSERT_FALSE(e.has_value()) << c.text;
    EXPECT_NE(e.error().find(c.error), std::string::npos) << c.text << " -> " << e.error();
    EXPECT_EQ(e.error().find('\n'), std::string::npos) << e.error();
  }
  EXPECT_FALSE(ErrorEnvelope::from_template(std::string(70 * 1024, ' '), "application/json", "t").has_value());
}

TEST(ErrorEnvelope, LoadTemplateNamesTheFile) {
  const auto dir = std::filesystem::temp_directory_path() / ("idem-envelope-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto path = (dir / "errors.json").string();
  {
    std::ofstream(path) << R"({"fault": {"code": "{{code}}"}})" << "\n";
  }
  auto e = ErrorEnvelope::load_template(path, "application/json");
  ASSERT_TRUE(e.has_value()) << e.error();
  EXPECT_EQ((*e)->name(), "template " + path);
  EXPECT_EQ(canonical((*e)->body(in_use())), R"({"fault":{"code":"idempotency_key_in_use"}})");
  auto missing = ErrorEnvelope::load_template((dir / "none.json").string(), "application/json");
  ASSERT_FALSE(missing.has_value());
  EXPECT_NE(missing.error().find("cannot read the file"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace idem
