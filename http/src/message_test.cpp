#include "idem/http/message.hpp"

#include <gtest/gtest.h>

namespace idem::http {
namespace {

TEST(HopByHop, KnowsTheStandardNamesCaseInsensitively) {
  for (const auto* name : {"Connection", "keep-alive", "TRANSFER-ENCODING", "te", "Trailer", "Upgrade",
                           "Proxy-Authenticate", "proxy-authorization", "Proxy-Connection", "Proxy-Fixture",
                           "proxy-anything"}) {
    EXPECT_TRUE(is_hop_by_hop(name)) << name;
  }
  for (const auto* name : {"Content-Length", "Content-Type", "Date", "Idempotency-Key", "Trailers",
                           "Tee", "X-Connection", "X-Proxy-Id", "Proxy", ""}) {
    EXPECT_FALSE(is_hop_by_hop(name)) << name;
  }
}

TEST(ConnectionTokens, ListedHeadersAreNotForwarded) {
  ConnectionTokens tokens;
  tokens.add("keep-alive, X-Secret ,close");
  tokens.add("x-other");
  EXPECT_TRUE(tokens.contains("x-secret"));
  EXPECT_TRUE(tokens.contains("X-Other"));
  EXPECT_FALSE(tokens.contains("close"));  // a connection option, not a header
  EXPECT_FALSE(is_forwarded("X-Secret", tokens));
  EXPECT_FALSE(is_forwarded("Keep-Alive", tokens));
  EXPECT_TRUE(is_forwarded("X-Public", tokens));
  EXPECT_TRUE(is_forwarded("Content-Length", tokens));
}

TEST(ConnectionTokens, ToleratesEmptyElements) {
  ConnectionTokens tokens;
  tokens.add(" , ,, X-A,");
  EXPECT_TRUE(tokens.contains("X-A"));
  EXPECT_FALSE(tokens.contains(""));
}

TEST(IsStored, DropsHopByHopLengthAndReplayMarker) {
  ConnectionTokens tokens;
  tokens.add("X-Hop");
  EXPECT_TRUE(is_stored("Content-Type", tokens));
  EXPECT_TRUE(is_stored("Date", tokens));
  EXPECT_TRUE(is_stored("Location", tokens));
  EXPECT_FALSE(is_stored("Content-Length", tokens));
  EXPECT_FALSE(is_stored("content-length", tokens));
  EXPECT_FALSE(is_stored("Transfer-Encoding", tokens));
  EXPECT_FALSE(is_stored("Idempotent-Replayed", tokens));
  EXPECT_FALSE(is_stored("X-Hop", tokens));
}

TEST(SplitTarget, OriginForm) {
  auto t = split_target("/v1/payments?b=2&a=1");
  EXPECT_EQ(t.path, "/v1/payments");
  EXPECT_EQ(t.query, "b=2&a=1");
  t = split_target("/v1/payments");
  EXPECT_EQ(t.path, "/v1/payments");
  EXPECT_EQ(t.query, "");
  t = split_target("/x?");
  EXPECT_EQ(t.path, "/x");
  EXPECT_EQ(t.query, "");
}

TEST(SplitTarget, AbsoluteFormAndAsterisk) {
  auto t = split_target("http://api.example.com:8080/v1/p?q=1");
  EXPECT_EQ(t.path, "/v1/p");
  EXPECT_EQ(t.query, "q=1");
  t = split_target("http://api.example.com");
  EXPECT_EQ(t.path, "/");
  t = split_target("http://api.example.com?x=1");
  EXPECT_EQ(t.path, "/");
  EXPECT_EQ(t.query, "x=1");
  t = split_target("*");
  EXPECT_EQ(t.path, "*");
}

TEST(IdempotentMethod, FollowsRfc9110) {
  for (const auto* m : {"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"}) EXPECT_TRUE(is_idempotent_method(m));
  for (const auto* m : {"POST", "PATCH", "CONNECT", "get"}) EXPECT_FALSE(is_idempotent_method(m));
}

}  // namespace
}  // namespace idem::http
