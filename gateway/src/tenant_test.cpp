#include "idem/gateway/tenant.hpp"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "idem/gateway/config.hpp"
#include "idem/testing/manual_clock.hpp"
#include "test_tokens.hpp"

namespace idem::gateway {
namespace {

using auth::test::TestKey;
using namespace std::chrono_literals;

class TenantConfigTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { rsa_ = new TestKey(TestKey::rsa()); }
  static void TearDownTestSuite() { delete rsa_; }
  void SetUp() override {
    char dir[] = "/tmp/idem-gw-tenant-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    jwks_ = dir_ + "/jwks.json";
    auth::test::write_file(jwks_, auth::test::jwk_set({rsa_->public_jwk("k1")}));
    secret_ = dir_ + "/hs.key";
    auth::test::write_file(secret_, std::string(40, 's'));
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string error_of(const std::string& toml) {
    try {
      parse_config(toml, "config.toml");
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "(parsed)";
  }

  std::string token(const std::string& sub, std::int64_t ttl = 600, const std::string& kid = "k1") const {
    const std::int64_t now = to_epoch_ms(clock_.now()) / 1000;
    return rsa_->sign("RS256", R"({"alg":"RS256","kid":")" + kid + R"("})",
                      R"({"iss":"https://auth.example","sub":")" + sub + R"(","aud":"payments-api","exp":)" +
                          std::to_string(now + ttl) + "}");
  }

  static TestKey* rsa_;
  std::string dir_, jwks_, secret_;
  testing::ManualClock clock_;
};

TestKey* TenantConfigTest::rsa_ = nullptr;

TEST_F(TenantConfigTest, TheIssueExampleParses) {
  const Config c = parse_config(R"([tenant]
from = "jwt"
claims = ["iss", "sub"]
keys = ")" + jwks_ + R"("
algorithms = ["RS256", "ES256"]
audience = "payments-api"
issuer = "https://auth.example"
leeway = "60s"
)",
                                "config.toml");
  ASSERT_TRUE(c.tenant.jwt);
  const auth::JwtOptions& o = c.tenant.jwt->options();
  EXPECT_EQ(o.claims, (std::vector<std::string>{"iss", "sub"}));
  EXPECT_EQ(o.key_files, std::vector<std::string>{jwks_});
  EXPECT_EQ(o.algorithms, (std::vector<auth::Algorithm>{auth::Algorithm::RS256, auth::Algorithm::ES256}));
  EXPECT_EQ(o.audience, "payments-api");
  EXPECT_EQ(o.issuer, "https://auth.example");
  EXPECT_EQ(o.leeway, 60s);
  EXPECT_EQ(o.cache_size, 10000u);
  EXPECT_EQ(c.tenant.jwt->size(), 1u);
}

TEST_F(TenantConfigTest, DefaultsAndOtherForms) {
  const Config c = parse_config("[tenant]\nfrom = \"jwt\"\nkeys = [\"" + jwks_ + "\"]\ncache_size = 0\n", "c");
  ASSERT_TRUE(c.tenant.jwt);
  EXPECT_EQ(c.tenant.jwt->options().claims, std::vector<std::string>{"sub"});
  EXPECT_EQ(c.tenant.jwt->options().cache_size, 0u);
  EXPECT_FALSE(c.tenant.jwt->options().audience);
  const Config hs = parse_config("[tenant]\nfrom = \"jwt\"\nsecret_file = \"" + secret_ + "\"\nleeway = \"0s\"\n", "c");
  EXPECT_EQ(hs.tenant.jwt->options().algorithms, std::vector<auth::Algorithm>{auth::Algorithm::HS256});
  EXPECT_EQ(hs.tenant.jwt->options().leeway, 0s);
}

TEST_F(TenantConfigTest, BadTablesAreOneLineErrors) {
  const std::string head = "[tenant]\nfrom = \"jwt\"\n";
  const std::string keys = "keys = \"" + jwks_ + "\"\n";
  EXPECT_EQ(error_of(head + keys + "algorithms = [\"none\"]\n"),
            "config.toml: [tenant]: algorithms: never \"none\": an unsigned token proves nothing (line 4)");
  EXPECT_NE(error_of(head + keys + "algorithms = [\"RS257\"]\n").find("expected RS256"), std::string::npos);
  EXPECT_NE(error_of(head + keys + "algorithms = []\n").find("list at least one algorithm"), std::string::npos);
  EXPECT_EQ(error_of(head + keys + "algorithms = [\"HS256\"]\n"),
            "config.toml: [tenant]: algorithms: HS256 is an HMAC: it takes secret_file, and public keys never verify "
            "it (line 4)");
  EXPECT_NE(error_of(head).find("needs keys = \"FILE\""), std::string::npos);
  EXPECT_NE(error_of(head + keys + "secret_file = \"" + secret_ + "\"\n").find("not both"), std::string::npos);
  EXPECT_NE(error_of(head + "keys = \"" + dir_ + "/nope.json\"\n")
                .find("[tenant]: keys \"" + dir_ + "/nope.json\": cannot read the file"),
            std::string::npos);
  EXPECT_NE(error_of(head + "keys = \"" + dir_ + "/nope.json\"\n").find("(line 3)"), std::string::npos);
  EXPECT_NE(error_of(head + keys + "header = \"X-T\"\n").find("takes no header"), std::string::npos);
  EXPECT_NE(error_of(head + keys + "leeway = 60\n").find("leeway: a duration needs a unit"), std::string::npos);
  EXPECT_NE(error_of(head + keys + "claims = [1]\n").find("claims: expected a string"), std::string::npos);
  EXPECT_NE(error_of(head + keys + "claims = []\n").find("claims: list at least one claim"), std::string::npos);
  EXPECT_NE(error_of(head + keys + "cache_size = -1\n").find("cache_size: -1 is outside"), std::string::npos);
  EXPECT_NE(error_of(head + keys + "audence = \"x\"\n").find("unknown key \"audence\""), std::string::npos);
  EXPECT_EQ(error_of("[tenant]\nheader = \"X-T\"\naudience = \"x\"\n"),
            "config.toml: [tenant]: audience: only with from = \"jwt\" (line 3)");
  EXPECT_EQ(error_of("[tenant]\nkeys = \"" + jwks_ + "\"\n"),
            "config.toml: [tenant]: keys: only with from = \"jwt\" (line 2)");
  // A key file that is garbage: one line, no key material.
  const std::string garbage = dir_ + "/garbage.json";
  auth::test::write_file(garbage, "\x01\x02\xff binary");
  const std::string e = error_of(head + "keys = \"" + garbage + "\"\n");
  EXPECT_NE(e.find("neither a JWK Set (JSON) nor PEM"), std::string::npos) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos);
}

TEST_F(TenantConfigTest, SkippedKeysAndALongLeewayAreWarnings) {
  const std::string mixed = dir_ + "/mixed.json";
  auth::test::write_file(mixed, auth::test::jwk_set({TestKey::ed25519().public_jwk("ed"), rsa_->public_jwk("k1")}));
  const Config c =
      parse_config("[tenant]\nfrom = \"jwt\"\nkeys = \"" + mixed + "\"\nleeway = \"10m\"\n", "config.toml");
  ASSERT_EQ(c.warnings.size(), 2u);  // the skipped key, the leeway
  EXPECT_NE(c.warnings[0].find("[tenant]: key #1 (kid \"ed\")"), std::string::npos) << c.warnings[0];
  EXPECT_NE(c.warnings[1].find("leeway"), std::string::npos) << c.warnings[1];
}

TEST_F(TenantConfigTest, RoutesOverrideTenantKeysOneByOne) {
  const Config c = parse_config(R"([tenant]
from = "jwt"
keys = ")" + jwks_ + R"("
audience = "payments-api"

[[route]]
method = "POST"
path = "/refunds"
tenant.audience = "refunds-api"

[[route]]
method = "POST"
path = "/internal"
tenant.header = "X-Org"

[[route]]
method = "POST"
path = "/plain"
)",
                                "config.toml");
  ASSERT_EQ(c.routes.size(), 3u);
  ASSERT_TRUE(c.routes[0].tenant && c.routes[0].tenant->jwt);
  EXPECT_EQ(c.routes[0].tenant->jwt->options().audience, "refunds-api");
  EXPECT_EQ(c.routes[0].tenant->jwt->options().key_files, std::vector<std::string>{jwks_});  // inherited
  ASSERT_TRUE(c.routes[1].tenant);
  EXPECT_FALSE(c.routes[1].tenant->jwt);  // a source of its own: nothing inherited
  EXPECT_EQ(c.routes[1].tenant->rule.source, TenantRule::Source::header);
  EXPECT_EQ(c.routes[1].tenant->rule.header, "X-Org");
  EXPECT_FALSE(c.routes[2].tenant);
  EXPECT_NE(error_of("[[route]]\nmethod = \"POST\"\npath = \"/a\"\ntenant = \"jwt\"\n").find("[[route]] #1: tenant"),
            std::string::npos);
  EXPECT_NE(error_of("[[route]]\nmethod = \"POST\"\npath = \"/a\"\ntenant.from = \"jwt\"\n")
                .find("[[route]] #1: tenant: from = \"jwt\" needs keys"),
            std::string::npos);
}

TEST_F(TenantConfigTest, SourcesPerRouteAndLoop) {
  const Config c = parse_config(R"([tenant]
from = "jwt"
keys = ")" + jwks_ + R"("
audience = "payments-api"

[[route]]
method = "POST"
path = "/by-header"
tenant.from = "header"
)",
                                "config.toml");
  TenantSources sources(c.tenant, c.routes, clock_);
  TenantSource& jwt = sources.for_route(Router::kNoRoute);
  TenantSource& header = sources.for_route(0);
  EXPECT_TRUE(jwt.verifies_credentials());
  EXPECT_FALSE(header.verifies_credentials());

  std::string bearer = "Bearer " + token("alice");
  std::vector<HeaderView> alice{{"Authorization", bearer}};
  auto t = jwt.derive(alice);
  ASSERT_TRUE(t) << t.error().detail;
  EXPECT_EQ(t->rfind("jwt:", 0), 0u);

  std::vector<HeaderView> none;
  auto missing = jwt.derive(none);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().status, 401);
  EXPECT_EQ(missing.error().code, "token_missing");
  EXPECT_EQ(missing.error().www_authenticate, "Bearer");

  std::vector<HeaderView> twice{{"Authorization", bearer}, {"authorization", bearer}};
  auto ambiguous = jwt.derive(twice);
  ASSERT_FALSE(ambiguous);
  EXPECT_EQ(ambiguous.error().status, 400);
  EXPECT_EQ(ambiguous.error().code, "tenant_ambiguous");

  const std::string unknown_kid = "Bearer " + token("alice", 600, "k2");
  std::vector<HeaderView> forged{{"Authorization", unknown_kid}};
  auto bad = jwt.derive(forged);
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().code, "token_invalid");
  EXPECT_EQ(bad.error().www_authenticate, "Bearer error=\"invalid_token\"");
  EXPECT_NE(bad.error().detail.find("kid \"k2\""), std::string::npos);

  const std::string old_token = "Bearer " + token("alice", 10);
  std::vector<HeaderView> old{{"Authorization", old_token}};
  clock_.advance(71s);
  auto expired = jwt.derive(old);
  ASSERT_FALSE(expired);
  EXPECT_EQ(expired.error().code, "token_expired");
  EXPECT_NE(expired.error().detail.find("same Idempotency-Key"), std::string::npos);
  EXPECT_NE(expired.error().www_authenticate->find("error=\"invalid_token\""), std::string::npos);

  // The header route reads its header, whatever the Authorization header holds.
  std::vector<HeaderView> org{{"X-Tenant-Id", "acme"}, {"Authorization", "Bearer garbage"}};
  EXPECT_EQ(header.derive(org), "acme");
  // A header naming the JWT namespace is hashed out of it.
  std::vector<HeaderView> spoof{{"X-Tenant-Id", *t}};
  auto spoofed = header.derive(spoof);
  ASSERT_TRUE(spoofed);
  EXPECT_NE(*spoofed, *t);
  EXPECT_EQ(spoofed->rfind("sha256:", 0), 0u);
}

TEST(TokenProblem, CodesAndHeaders) {
  const Problem missing = token_problem({auth::Refusal::missing, "no Authorization header"});
  EXPECT_EQ(missing.status, 401);
  EXPECT_EQ(missing.code, "token_missing");
  EXPECT_NE(missing.detail.find("no Authorization header"), std::string::npos);
  EXPECT_EQ(token_problem({auth::Refusal::invalid, "x"}).code, "token_invalid");
  EXPECT_EQ(token_problem({auth::Refusal::expired, "x"}).code, "token_expired");
  for (const auto r : {auth::Refusal::missing, auth::Refusal::invalid, auth::Refusal::expired}) {
    const Problem p = token_problem({r, "x"});
    ASSERT_TRUE(p.www_authenticate);
    EXPECT_EQ(p.www_authenticate->rfind("Bearer", 0), 0u);
    EXPECT_FALSE(p.title.empty());
  }
}

TEST(ClientCertTenant, TheChosenNameOfTheVerifiedCertificate) {
  TenantSetting setting;
  setting.client_cert = CertificateIdentity::uri;
  TenantSource source(setting);
  EXPECT_TRUE(source.verifies_credentials());
  const std::vector<HeaderView> headers{{"X-Tenant-Id", "someone-else"}};

  ClientCertificate a{"CN=payments-a,O=idem test", "payments-a", "spiffe://idem.test/payments-a", ""};
  auto t = source.derive(headers, &a);
  ASSERT_TRUE(t) << t.error().detail;
  EXPECT_EQ(*t, "cert:spiffe://idem.test/payments-a");  // the header is not read

  // A renewal: another key and serial, the same names, the same tenant.
  ClientCertificate renewed = a;
  EXPECT_EQ(*source.derive(headers, &renewed), *t);

  // No certificate, or none of the chosen name: 401, never a shared scope.
  auto missing = source.derive(headers, nullptr);
  ASSERT_FALSE(missing);
  EXPECT_EQ(missing.error().status, 401);
  EXPECT_EQ(missing.error().code, "client_certificate_missing");
  ClientCertificate no_uri{"CN=x", "x", "", "x.example"};
  auto without = source.derive(headers, &no_uri);
  ASSERT_FALSE(without);
  EXPECT_NE(without.error().detail.find("URI subject alternative name"), std::string::npos);

  TenantSetting by_subject;
  by_subject.client_cert = CertificateIdentity::subject;
  TenantSource subject_source(by_subject);
  // The subject holds a space: hashed into the certificate namespace.
  EXPECT_TRUE(subject_source.derive(headers, &a)->starts_with("cert:sha256:"));
  TenantSetting by_cn;
  by_cn.client_cert = CertificateIdentity::common_name;
  TenantSource cn_source(by_cn);
  EXPECT_EQ(*cn_source.derive(headers, &a), "cert:payments-a");
}

}  // namespace
}  // namespace idem::gateway
