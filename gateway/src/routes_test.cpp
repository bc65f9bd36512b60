#include "idem/gateway/routes.hpp"

#include <gtest/gtest.h>

#include <stdexcept>

namespace idem::gateway {
namespace {

TEST(PathPattern, Exact) {
  PathPattern p("/v1/payments");
  EXPECT_TRUE(p.matches("/v1/payments"));
  EXPECT_FALSE(p.matches("/v1/payments/"));
  EXPECT_FALSE(p.matches("/v1/payments/1"));
  EXPECT_FALSE(p.matches("/v1/payment"));
  EXPECT_FALSE(p.matches("/v1"));
  EXPECT_FALSE(p.matches("v1/payments"));
  EXPECT_FALSE(p.matches(""));
  EXPECT_FALSE(p.matches("/V1/payments"));  // paths are case-sensitive
}

TEST(PathPattern, StarMatchesExactlyOneNonEmptySegment) {
  PathPattern p("/v1/payments/*/capture");
  EXPECT_TRUE(p.matches("/v1/payments/pay_123/capture"));
  EXPECT_FALSE(p.matches("/v1/payments//capture"));
  EXPECT_FALSE(p.matches("/v1/payments/a/b/capture"));
  EXPECT_FALSE(p.matches("/v1/payments/capture"));
  PathPattern tail("/v1/*");
  EXPECT_TRUE(tail.matches("/v1/x"));
  EXPECT_FALSE(tail.matches("/v1/x/y"));
  EXPECT_FALSE(tail.matches("/v1/"));
  EXPECT_FALSE(tail.matches("/v1"));
}

TEST(PathPattern, DoubleStarMatchesTheRest) {
  PathPattern p("/v1/**");
  EXPECT_TRUE(p.matches("/v1"));
  EXPECT_TRUE(p.matches("/v1/"));
  EXPECT_TRUE(p.matches("/v1/a"));
  EXPECT_TRUE(p.matches("/v1/a/b/c"));
  EXPECT_FALSE(p.matches("/v10/a"));
  EXPECT_FALSE(p.matches("/v2/a"));
  PathPattern all("/**");
  EXPECT_TRUE(all.matches("/"));
  EXPECT_TRUE(all.matches("/anything/at/all"));
  PathPattern mixed("/v1/*/items/**");
  EXPECT_TRUE(mixed.matches("/v1/acct/items"));
  EXPECT_TRUE(mixed.matches("/v1/acct/items/9/x"));
  EXPECT_FALSE(mixed.matches("/v1/acct/other/9"));
}

TEST(PathPattern, Root) {
  PathPattern p("/");
  EXPECT_TRUE(p.matches("/"));
  EXPECT_FALSE(p.matches("/x"));
}

TEST(PathPattern, RejectsBadPatterns) {
  EXPECT_THROW(PathPattern(""), std::invalid_argument);
  EXPECT_THROW(PathPattern("v1/payments"), std::invalid_argument);
  EXPECT_THROW(PathPattern("/v1/**/x"), std::invalid_argument);
  EXPECT_THROW(PathPattern("/v1/pay*"), std::invalid_argument);
  EXPECT_THROW(PathPattern("/v1/***"), std::invalid_argument);
  EXPECT_THROW(PathPattern("/v1?x=1"), std::invalid_argument);
  EXPECT_THROW(PathPattern("/v1 x"), std::invalid_argument);
}

Route route(std::vector<std::string> methods, std::string_view path, std::string header = "Idempotency-Key") {
  Route r;
  r.methods = std::move(methods);
  r.path = PathPattern(path);
  r.policy.key_required = true;
  r.policy.key_header = std::move(header);
  return r;
}

TEST(Router, WithoutRoutesEveryPostAndPatchIsHandledWithTheKeyOptional) {
  const std::vector<Route> routes;
  Policy defaults;
  defaults.key_required = true;  // ignored for unlisted requests
  defaults.lease = std::chrono::seconds(7);
  Router router(routes, defaults);
  for (const auto* m : {"POST", "PATCH"}) {
    const Policy* p = router.policy_for(m, "/anything");
    ASSERT_NE(p, nullptr) << m;
    EXPECT_FALSE(p->key_required);
    EXPECT_EQ(p->lease, std::chrono::seconds(7));
  }
  for (const auto* m : {"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE", "CONNECT", "PROPFIND"}) {
    EXPECT_EQ(router.policy_for(m, "/anything"), nullptr) << m;
  }
}

TEST(Router, FirstMatchWins) {
  std::vector<Route> routes;
  routes.push_back(route({"POST"}, "/v1/payments/special", "A"));
  routes.push_back(route({"POST"}, "/v1/payments/*", "B"));
  routes.push_back(route({"POST"}, "/v1/**", "C"));
  Router router(routes, Policy{});
  EXPECT_EQ(router.policy_for("POST", "/v1/payments/special")->key_header, "A");
  EXPECT_EQ(router.policy_for("POST", "/v1/payments/other")->key_header, "B");
  EXPECT_EQ(router.policy_for("POST", "/v1/refunds")->key_header, "C");
  EXPECT_TRUE(router.policy_for("POST", "/v1/refunds")->key_required);
}

TEST(Router, PutAndDeleteOnlyWhenARouteListsThem) {
  std::vector<Route> routes;
  routes.push_back(route({"PUT", "DELETE"}, "/v1/items/*"));
  Router router(routes, Policy{});
  EXPECT_NE(router.policy_for("PUT", "/v1/items/1"), nullptr);
  EXPECT_NE(router.policy_for("DELETE", "/v1/items/1"), nullptr);
  EXPECT_EQ(router.policy_for("PUT", "/v1/other/1"), nullptr);
  EXPECT_EQ(router.policy_for("DELETE", "/v1/items"), nullptr);
}

TEST(Router, UnlistedPostFallsBackToDefaultsWithTheKeyOptional) {
  std::vector<Route> routes;
  routes.push_back(route({"POST"}, "/v1/payments"));
  Router router(routes, Policy{});
  EXPECT_TRUE(router.policy_for("POST", "/v1/payments")->key_required);
  const Policy* other = router.policy_for("POST", "/v1/other");
  ASSERT_NE(other, nullptr);
  EXPECT_FALSE(other->key_required);
  // A route for PUT on the same path does not capture POST.
  EXPECT_EQ(router.policy_for("PUT", "/v1/payments"), nullptr);
}

TEST(Router, SafeMethodsNeverHandled) {
  std::vector<Route> routes;
  Route r = route({"POST"}, "/**");
  r.methods.push_back("GET");  // config parsing refuses this; the router ignores it anyway
  routes.push_back(r);
  Router router(routes, Policy{});
  EXPECT_EQ(router.policy_for("GET", "/x"), nullptr);
}

}  // namespace
}  // namespace idem::gateway
