#include "idem/gateway/grpc.hpp"

#include <gtest/gtest.h>

namespace idem::gateway::grpc {
namespace {

using namespace std::chrono_literals;

TEST(Grpc, StatusNamesAndNumbersReadBothWays) {
  EXPECT_EQ(parse_code("UNAVAILABLE"), Code::unavailable);
  EXPECT_EQ(parse_code("resource_exhausted"), Code::resource_exhausted);
  EXPECT_EQ(parse_code("14"), Code::unavailable);
  EXPECT_EQ(parse_code("0"), Code::ok);
  EXPECT_EQ(parse_code("17"), std::nullopt);
  EXPECT_EQ(parse_code("UNAVAILABLEX"), std::nullopt);
  EXPECT_EQ(parse_code(""), std::nullopt);
  for (int i = 0; i <= 16; ++i) EXPECT_EQ(parse_code(name(static_cast<Code>(i))), static_cast<Code>(i));
}

TEST(Grpc, OnlyNumbersAreStatusValues) {
  EXPECT_EQ(parse_status("3"), Code::invalid_argument);
  EXPECT_EQ(parse_status("16"), Code::unauthenticated);
  EXPECT_EQ(parse_status("OK"), std::nullopt);
  EXPECT_EQ(parse_status("-1"), std::nullopt);
  EXPECT_EQ(parse_status("100"), std::nullopt);
}

TEST(Grpc, ContentTypesOfCalls) {
  EXPECT_TRUE(is_grpc_content_type("application/grpc"));
  EXPECT_TRUE(is_grpc_content_type("application/grpc+proto"));
  EXPECT_TRUE(is_grpc_content_type("Application/GRPC;charset=x"));
  EXPECT_FALSE(is_grpc_content_type("application/grpcx"));
  EXPECT_FALSE(is_grpc_content_type("application/grpc-web"));
  EXPECT_FALSE(is_grpc_content_type("application/json"));
  EXPECT_FALSE(is_grpc_content_type(""));
}

TEST(Grpc, TimeoutsInEveryUnitAndNothingMalformed) {
  EXPECT_EQ(parse_timeout("100m"), std::chrono::nanoseconds(100ms));
  EXPECT_EQ(parse_timeout("5S"), std::chrono::nanoseconds(5s));
  EXPECT_EQ(parse_timeout("2M"), std::chrono::nanoseconds(2min));
  EXPECT_EQ(parse_timeout("1H"), std::chrono::nanoseconds(1h));
  EXPECT_EQ(parse_timeout("7u"), std::chrono::nanoseconds(7us));
  EXPECT_EQ(parse_timeout("99999999n"), std::chrono::nanoseconds(99999999));
  EXPECT_EQ(parse_timeout("123456789m"), std::nullopt);  // at most 8 digits
  EXPECT_EQ(parse_timeout("m"), std::nullopt);
  EXPECT_EQ(parse_timeout("10"), std::nullopt);
  EXPECT_EQ(parse_timeout("10x"), std::nullopt);
  EXPECT_EQ(parse_timeout("-1S"), std::nullopt);
}

TEST(Grpc, MessagesArePercentEncoded) {
  EXPECT_EQ(percent_encode("key in use: 100%"), "key in use: 100%25");
  EXPECT_EQ(percent_encode("caf\xc3\xa9\n"), "caf%C3%A9%0A");
}

TEST(Grpc, TheGatewaysRefusalsMapOntoStatusesClientsActOn) {
  EXPECT_EQ(code_for_problem("idempotency_key_in_use", 409), Code::aborted);
  EXPECT_EQ(code_for_problem("idempotency_key_mismatch", 422), Code::failed_precondition);
  EXPECT_EQ(code_for_problem("idempotency_outcome_unknown", 409), Code::failed_precondition);
  EXPECT_EQ(code_for_problem("idempotency_store_unavailable", 503), Code::unavailable);
  EXPECT_EQ(code_for_problem("idempotency_key_missing", 400), Code::invalid_argument);
  EXPECT_EQ(code_for_problem("idempotency_key_invalid", 400), Code::invalid_argument);
  EXPECT_EQ(code_for_problem("upstream_unreachable", 502), Code::unavailable);
  EXPECT_EQ(code_for_problem("upstream_timeout", 504), Code::deadline_exceeded);
  EXPECT_EQ(code_for_problem("token_invalid", 401), Code::unauthenticated);
  EXPECT_EQ(code_for_problem("request_too_large", 413), Code::resource_exhausted);
  EXPECT_EQ(code_for_problem("not_implemented", 501), Code::unimplemented);
  EXPECT_EQ(code_for_problem("record_unreadable", 500), Code::internal);
  EXPECT_EQ(code_for_problem("idempotency_response_not_stored", 410), Code::failed_precondition);
  EXPECT_EQ(code_for_problem("upstream_response_too_large", 502), Code::internal);
}

}  // namespace
}  // namespace idem::gateway::grpc
