#include "token_cache.hpp"

#include <gtest/gtest.h>

namespace idem::auth {
namespace {

TEST(TokenCache, HitUntilExpiryThenDropped) {
  TokenCache cache(8);
  const auto a = digest_of("token-a");
  EXPECT_EQ(cache.find(a, 0).tenant, nullptr);
  EXPECT_FALSE(cache.find(a, 0).expired);
  cache.insert(a, "jwt:a", 1000);
  ASSERT_NE(cache.find(a, 999).tenant, nullptr);
  EXPECT_EQ(*cache.find(a, 1000).tenant, "jwt:a");  // valid up to and including its expiry
  const auto late = cache.find(a, 1001);
  EXPECT_EQ(late.tenant, nullptr);
  EXPECT_TRUE(late.expired);
  EXPECT_EQ(cache.size(), 0u);
  EXPECT_FALSE(cache.find(a, 1001).expired);  // gone, not expired twice
}

TEST(TokenCache, BoundedLeastRecentlyUsedOut) {
  TokenCache cache(2);
  const auto a = digest_of("a"), b = digest_of("b"), c = digest_of("c");
  cache.insert(a, "A", 100);
  cache.insert(b, "B", 100);
  ASSERT_NE(cache.find(a, 0).tenant, nullptr);  // a is now the most recently used
  cache.insert(c, "C", 100);                    // b makes room
  EXPECT_EQ(cache.size(), 2u);
  EXPECT_NE(cache.find(a, 0).tenant, nullptr);
  EXPECT_EQ(cache.find(b, 0).tenant, nullptr);
  EXPECT_NE(cache.find(c, 0).tenant, nullptr);
}

TEST(TokenCache, InsertingAgainUpdatesInPlace) {
  TokenCache cache(2);
  const auto a = digest_of("a");
  cache.insert(a, "A", 100);
  cache.insert(a, "A2", 200);
  EXPECT_EQ(cache.size(), 1u);
  EXPECT_EQ(*cache.find(a, 150).tenant, "A2");
}

TEST(TokenCache, CapacityZeroKeepsNothing) {
  TokenCache cache(0);
  cache.insert(digest_of("a"), "A", 100);
  EXPECT_EQ(cache.size(), 0u);
}

TEST(TokenCache, DigestIsSha256) {
  // SHA-256("abc"), FIPS 180-2 appendix B.1.
  const auto d = digest_of("abc");
  EXPECT_EQ(d[0], 0xba);
  EXPECT_EQ(d[1], 0x78);
  EXPECT_EQ(d[31], 0xad);
  EXPECT_NE(digest_of("abc"), digest_of("abd"));
}

}  // namespace
}  // namespace idem::auth
