#include "idem/http/message.hpp"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

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

// check_request_head on a head built from its parts.
std::optional<HeadDefect> check(unsigned version, std::string_view method, std::vector<std::string_view> te,
                                std::vector<std::string_view> hosts) {
  return check_request_head(HeadFacts{version, method, te, hosts});
}

TEST(RequestHead, OrdinaryHeadsPass) {
  EXPECT_FALSE(check(11, "POST", {}, {"api.example.com"}));
  EXPECT_FALSE(check(11, "POST", {"chunked"}, {"api.example.com:8443"}));
  EXPECT_FALSE(check(11, "POST", {"Chunked"}, {"127.0.0.1"}));
  EXPECT_FALSE(check(11, "PATCH", {" chunked ;x=1"}, {"[::1]:8080"}));  // parameters and spaces
  EXPECT_FALSE(check(11, "POST", {", chunked"}, {"a"}));                 // an empty list element
  EXPECT_FALSE(check(10, "POST", {}, {}));                               // HTTP/1.0 needs no Host
  EXPECT_FALSE(check(11, "OPTIONS", {}, {"xn--bcher-kva.example"}));
}

TEST(RequestHead, TransferEncodingWithoutFinalChunkedIs400) {
  for (const auto& te : std::vector<std::vector<std::string_view>>{
           {"gzip"}, {"chunked, gzip"}, {"chunked", "gzip"}, {"identity"}, {""}, {"chunkedx"}}) {
    const auto defect = check(11, "POST", te, {"a"});
    ASSERT_TRUE(defect) << te.front();
    EXPECT_EQ(defect->status, 400u);
    EXPECT_EQ(defect->code, "bad_request");
  }
}

TEST(RequestHead, ChunkedTwiceIs400AndOtherCodingsAre501) {
  auto twice = check(11, "POST", {"chunked", "chunked"}, {"a"});
  ASSERT_TRUE(twice);
  EXPECT_EQ(twice->status, 400u);
  EXPECT_NE(twice->detail.find("more than once"), std::string::npos);
  auto gzip = check(11, "POST", {"gzip, chunked"}, {"a"});
  ASSERT_TRUE(gzip);
  EXPECT_EQ(gzip->status, 501u);
  EXPECT_EQ(gzip->code, "not_implemented");
  EXPECT_NE(gzip->detail.find("gzip"), std::string::npos);
}

TEST(RequestHead, TransferEncodingInHttp10Is400) {
  auto defect = check(10, "POST", {"chunked"}, {"a"});
  ASSERT_TRUE(defect);
  EXPECT_EQ(defect->status, 400u);
}

TEST(RequestHead, Http11NeedsExactlyOneValidHost) {
  EXPECT_EQ(check(11, "POST", {}, {})->status, 400u);
  EXPECT_EQ(check(11, "POST", {}, {"a", "b"})->status, 400u);
  for (const auto* host : {"", "a b", "user@host", "host/path", "host?q", "host#f", "host:port", "host:123456",
                           ":80", "[::1", "[]", "[::1]x", "[::g]", "h\x01st"}) {
    const auto defect = check(11, "POST", {}, {host});
    ASSERT_TRUE(defect) << host;
    EXPECT_EQ(defect->status, 400u) << host;
  }
  EXPECT_EQ(check(10, "POST", {}, {"a b"})->status, 400u);  // a Host that is sent is checked
}

TEST(RequestHead, ConnectIs501) {
  auto defect = check(11, "CONNECT", {}, {"a:443"});
  ASSERT_TRUE(defect);
  EXPECT_EQ(defect->status, 501u);
  EXPECT_EQ(defect->code, "not_implemented");
}

}  // namespace
}  // namespace idem::http
