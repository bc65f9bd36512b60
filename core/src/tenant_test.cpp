#include "idem/tenant.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "idem/fingerprint.hpp"

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

TEST(DeriveTenant, HeaderValuesNamingADerivedNamespaceAreHashedIntoTheirOwn) {
  // SPEC §12: a client that may set the tenant header must not reach a credential-hash tenant
  // ("auth:..."), a token-claims tenant ("jwt:...") or another value's hashed form ("sha256:...").
  TenantRule by_header{TenantRule::Source::header, "X-Tenant-Id"};
  TenantRule by_credential{TenantRule::Source::authorization, ""};
  std::vector<HeaderView> credential{{"Authorization", "Bearer sk_live_alice"}};
  const std::string credential_tenant = derive_tenant(by_credential, credential).value();
  const std::string claims = claims_tenant(R"({"sub":"alice"})");
  std::vector<HeaderView> spaced{{"X-Tenant-Id", "acme corp"}};
  const std::string hashed = derive_tenant(by_header, spaced).value();

  for (const std::string& forged : {credential_tenant, claims, hashed, std::string("AUTH:x"), std::string("Jwt:x"),
                                    std::string("SHA256:x")}) {
    std::vector<HeaderView> headers{{"X-Tenant-Id", forged}};
    const std::string tenant = derive_tenant(by_header, headers).value();
    EXPECT_NE(tenant, forged) << forged;
    EXPECT_EQ(tenant, "sha256:" + sha256_hex(forged)) << forged;
    EXPECT_NE(tenant, credential_tenant);
    EXPECT_NE(tenant, claims);
    EXPECT_NE(tenant, hashed);
  }
  // Prefixes inside a value, or only similar, are nothing special.
  std::vector<HeaderView> inner{{"X-Tenant-Id", "acme:auth:1"}};
  EXPECT_EQ(derive_tenant(by_header, inner), "acme:auth:1");
  std::vector<HeaderView> near{{"X-Tenant-Id", "authority"}};
  EXPECT_EQ(derive_tenant(by_header, near), "authority");
}

TEST(DeriveTenant, ReservedPrefixes) {
  EXPECT_TRUE(has_reserved_tenant_prefix("auth:"));
  EXPECT_TRUE(has_reserved_tenant_prefix("jwt:abc"));
  EXPECT_TRUE(has_reserved_tenant_prefix("ShA256:abc"));
  EXPECT_TRUE(has_reserved_tenant_prefix("CERT:spiffe://x"));
  EXPECT_FALSE(has_reserved_tenant_prefix("auth"));
  EXPECT_FALSE(has_reserved_tenant_prefix("consumer ledger"));
  EXPECT_FALSE(has_reserved_tenant_prefix(""));
}

TEST(CertificateTenant, IsTheIdentityInItsOwnNamespaceOrItsHash) {
  EXPECT_EQ(certificate_tenant("spiffe://idem.test/payments-a"), "cert:spiffe://idem.test/payments-a");
  // Spaces, control characters, a long identity, one that looks like a hash: hashed.
  const std::string hashed = certificate_tenant("CN=payments a,O=idem test");
  EXPECT_TRUE(hashed.starts_with("cert:sha256:")) << hashed;
  EXPECT_EQ(hashed.size(), std::string("cert:sha256:").size() + 64);
  EXPECT_NE(certificate_tenant("sha256:abc"), "cert:sha256:abc");
  EXPECT_TRUE(certificate_tenant(std::string(129, 'a')).starts_with("cert:sha256:"));
  // A header naming a certificate tenant cannot reach it.
  const TenantRule by_header{TenantRule::Source::header, "X-Tenant-Id"};
  std::vector<HeaderView> forged{{"X-Tenant-Id", "cert:spiffe://idem.test/payments-a"}};
  EXPECT_TRUE(derive_tenant(by_header, forged)->starts_with("sha256:"));
}

TEST(ClaimsTenant, IsTheHashOfTheCanonicalClaimsInItsOwnNamespace) {
  const std::string t = claims_tenant(R"({"sub":"user-1"})");
  EXPECT_EQ(t, "jwt:" + sha256_hex(R"({"sub":"user-1"})"));
  EXPECT_EQ(t.size(), 4u + 64u);
  EXPECT_EQ(t.find(' '), std::string::npos);  // never a consumer's "consumer NAME"
  EXPECT_NE(t, claims_tenant(R"({"sub":"user-2"})"));
}

}  // namespace
}  // namespace idem
