#include "idem/tenant.hpp"

#include <gtest/gtest.h>

#include <vector>

namespace idem {
namespace {

TEST(DeriveTenant, NoneGivesOneSharedScope) {
  std::vector<HeaderView> headers{{"X-Tenant-Id", "acme"}};
  EXPECT_EQ(derive_tenant(TenantRule{}, headers), "");
}

TEST(DeriveTenant, HeaderValueIsUsedVerbatimCaseInsensitiveName) {
  TenantRule rule{TenantRule::Source::header, "X-Tenant-Id"};
  std::vector<HeaderView> headers{{"x-tenant-id", "acme-42"}};
  EXPECT_EQ(derive_tenant(rule, headers), "acme-42");
  EXPECT_EQ(derive_tenant(rule, {}), "");
}

TEST(DeriveTenant, UnsafeHeaderValuesAreHashed) {
  TenantRule rule{TenantRule::Source::header, "X-Tenant-Id"};
  std::vector<HeaderView> spaced{{"X-Tenant-Id", "acme corp"}};
  std::string long_value(200, 'a');
  std::vector<HeaderView> long_one{{"X-Tenant-Id", long_value}};
  EXPECT_EQ(derive_tenant(rule, spaced)->rfind("sha256:", 0), 0u);
  EXPECT_EQ(derive_tenant(rule, long_one)->size(), 7u + 64u);
  EXPECT_NE(derive_tenant(rule, spaced), derive_tenant(rule, long_one));
}

TEST(DeriveTenant, AuthorizationIsHashedNeverStored) {
  TenantRule rule{TenantRule::Source::authorization, ""};
  std::vector<HeaderView> alice{{"Authorization", "Bearer sk_live_alice"}};
  std::vector<HeaderView> bob{{"authorization", "Bearer sk_live_bob"}};
  const std::string a = derive_tenant(rule, alice).value();
  EXPECT_EQ(a.rfind("auth:", 0), 0u);
  EXPECT_EQ(a.find("sk_live"), std::string::npos);
  EXPECT_EQ(a, derive_tenant(rule, alice));
  EXPECT_NE(a, derive_tenant(rule, bob));
  EXPECT_EQ(derive_tenant(rule, {}), "");
}

TEST(DeriveTenant, ARepeatedTenantHeaderIsRefused) {
  TenantRule by_header{TenantRule::Source::header, "X-Tenant-Id"};
  std::vector<HeaderView> twice{{"X-Tenant-Id", "victim"}, {"Content-Type", "a/b"}, {"x-tenant-id", "attacker"}};
  const auto header = derive_tenant(by_header, twice);
  ASSERT_FALSE(header);
  EXPECT_NE(header.error().find("X-Tenant-Id"), std::string::npos);
  EXPECT_NE(header.error().find("more than once"), std::string::npos);

  TenantRule by_credential{TenantRule::Source::authorization, ""};
  std::vector<HeaderView> two_credentials{{"Authorization", "Bearer a"}, {"authorization", "Bearer b"}};
  EXPECT_FALSE(derive_tenant(by_credential, two_credentials));
  // Only the header the rule reads counts.
  EXPECT_EQ(derive_tenant(by_header, two_credentials), "");
  EXPECT_EQ(derive_tenant(TenantRule{}, twice), "");
}

}  // namespace
}  // namespace idem
