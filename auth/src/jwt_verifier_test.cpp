#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>

#include "idem/auth/jwt.hpp"
#include "idem/tenant.hpp"
#include "idem/testing/manual_clock.hpp"
#include "test_tokens.hpp"

namespace idem::auth {
namespace {

using test::TestKey;
using namespace std::chrono_literals;

constexpr std::string_view kSecret = "0123456789abcdef0123456789abcdef-hs256-test-secret";

class JwtVerifierTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    rsa_ = new TestKey(TestKey::rsa());
    rsa_other_ = new TestKey(TestKey::rsa());
    ec_ = new TestKey(TestKey::ec("P-256"));
  }
  static void TearDownTestSuite() {
    delete rsa_;
    delete rsa_other_;
    delete ec_;
  }

  void SetUp() override {
    char dir[] = "/tmp/idem-auth-test-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string file(const std::string& name, std::string_view content) {
    const std::string path = dir_ + "/" + name;
    test::write_file(path, content);
    return path;
  }

  // Options for a JWK Set of the RSA key (kid "rsa-1") and the EC key (kid "ec-1").
  JwtOptions key_options() {
    JwtOptions o;
    o.key_files = {file("jwks.json", test::jwk_set({rsa_->public_jwk("rsa-1"), ec_->public_jwk("ec-1")}))};
    o.claims = {"iss", "sub"};
    o.audience = "payments-api";
    o.issuer = "https://auth.example";
    return o;
  }

  JwtOptions secret_options() {
    JwtOptions o;
    o.secret_file = file("hs256.key", std::string(kSecret) + "\n");
    return o;
  }

  JwtVerifier verifier(JwtOptions options) {
    auto keys = KeySet::load(std::move(options), &warnings_);
    if (!keys) {
      ADD_FAILURE() << keys.error();
      throw std::runtime_error(keys.error());
    }
    return JwtVerifier(*keys, clock_);
  }

  std::int64_t now() const { return to_epoch_ms(clock_.now()) / 1000; }

  // A payload with the claims the options above check, `exp` `ttl` seconds from now.
  std::string claims(const std::string& sub, std::int64_t ttl = 3600, const std::string& extra = "") const {
    return R"({"iss":"https://auth.example","sub":")" + sub + R"(","aud":"payments-api","iat":)" +
           std::to_string(now()) + R"(,"exp":)" + std::to_string(now() + ttl) + extra + "}";
  }

  static std::string header(std::string_view alg, std::string_view kid = "") {
    std::string h = R"({"alg":")" + std::string(alg) + R"(","typ":"JWT")";
    if (!kid.empty()) h += R"(,"kid":")" + std::string(kid) + "\"";
    return h + "}";
  }

  // The refusal of a token that must not verify.
  static TokenError refusal(JwtVerifier& v, std::string_view token) {
    auto r = v.verify(token);
    if (r) {
      ADD_FAILURE() << "accepted: " << token;
      return {};
    }
    return r.error();
  }

  static std::string expected_tenant(std::string_view canonical) { return claims_tenant(canonical); }

  static TestKey* rsa_;
  static TestKey* rsa_other_;
  static TestKey* ec_;
  std::string dir_;
  testing::ManualClock clock_;
  std::vector<std::string> warnings_;
};

TestKey* JwtVerifierTest::rsa_ = nullptr;
TestKey* JwtVerifierTest::rsa_other_ = nullptr;
TestKey* JwtVerifierTest::ec_ = nullptr;

TEST_F(JwtVerifierTest, Rs256AndEs256TokensGiveTheClaimsTenant) {
  JwtVerifier v = verifier(key_options());
  const std::string want = expected_tenant(R"({"iss":"https://auth.example","sub":"user-1"})");
  auto rs = v.verify(rsa_->sign("RS256", header("RS256", "rsa-1"), claims("user-1")));
  ASSERT_TRUE(rs) << rs.error().reason;
  EXPECT_EQ(rs->tenant, want);
  EXPECT_FALSE(rs->cached);
  auto es = v.verify(ec_->sign("ES256", header("ES256", "ec-1"), claims("user-1")));
  ASSERT_TRUE(es) << es.error().reason;
  EXPECT_EQ(es->tenant, want);
  EXPECT_TRUE(warnings_.empty()) << warnings_.front();
}

TEST_F(JwtVerifierTest, Hs256TokenWithTheSecretFile) {
  JwtVerifier v = verifier(secret_options());
  // The file ends in a newline, which is not part of the secret.
  auto r = v.verify(test::sign_hmac("HS256", header("HS256"), claims("user-1"), kSecret));
  ASSERT_TRUE(r) << r.error().reason;
  EXPECT_EQ(r->tenant, expected_tenant(R"({"sub":"user-1"})"));  // default claims: sub
  const std::string with_newline = std::string(kSecret) + "\n";
  EXPECT_EQ(refusal(v, test::sign_hmac("HS256", header("HS256"), claims("user-1"), with_newline)).refusal,
            Refusal::invalid);
}

TEST_F(JwtVerifierTest, ARefreshedTokenOfTheSameSubjectIsTheSameTenant) {
  JwtVerifier v = verifier(key_options());
  auto first = v.verify(rsa_->sign("RS256", header("RS256", "rsa-1"), claims("user-1", 300, R"(,"jti":"a")")));
  clock_.advance(12h);
  auto refreshed = v.verify(rsa_->sign("RS256", header("RS256", "rsa-1"), claims("user-1", 300, R"(,"jti":"b")")));
  ASSERT_TRUE(first && refreshed);
  EXPECT_EQ(first->tenant, refreshed->tenant);
  EXPECT_FALSE(refreshed->cached);
}

TEST_F(JwtVerifierTest, SubjectsAndClaimNamesAreTenantsOfTheirOwn) {
  JwtVerifier v = verifier(key_options());
  auto a = v.verify(rsa_->sign("RS256", header("RS256"), claims("user-1")));
  auto b = v.verify(rsa_->sign("RS256", header("RS256"), claims("user-2")));
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->tenant, b->tenant);

  // Equal values under other claim names are not the same scope.
  JwtOptions by_tid = key_options();
  by_tid.claims = {"iss", "tid"};
  JwtVerifier t = verifier(by_tid);
  auto c = t.verify(rsa_->sign("RS256", header("RS256"), claims("x", 3600, R"(,"tid":"user-1")")));
  ASSERT_TRUE(c) << c.error().reason;
  EXPECT_NE(c->tenant, a->tenant);

  // The order claims are listed in does not matter: the tenant is of the set.
  JwtOptions reversed = key_options();
  reversed.claims = {"sub", "iss"};
  auto d = verifier(reversed).verify(rsa_->sign("RS256", header("RS256"), claims("user-1")));
  ASSERT_TRUE(d);
  EXPECT_EQ(d->tenant, a->tenant);
}

TEST_F(JwtVerifierTest, NonStringClaimsAreCanonical) {
  JwtOptions o = secret_options();
  o.claims = {"sub", "org"};
  JwtVerifier v = verifier(o);
  auto r = v.verify(test::sign_hmac("HS256", header("HS256"), claims("u", 3600, R"(,"org":1.50E1)"), kSecret));
  ASSERT_TRUE(r) << r.error().reason;
  EXPECT_EQ(r->tenant, expected_tenant(R"({"org":15,"sub":"u"})"));
}

TEST_F(JwtVerifierTest, ForgedSignaturesAreRefused) {
  JwtVerifier v = verifier(key_options());
  const std::string good = rsa_->sign("RS256", header("RS256", "rsa-1"), claims("user-1"));
  // Signed by a key not in the set, under the set's kid.
  EXPECT_NE(refusal(v, rsa_other_->sign("RS256", header("RS256", "rsa-1"), claims("user-1"))).reason.find("signature"),
            std::string::npos);
  // One signature byte changed.
  std::string flipped = good;
  flipped[flipped.size() - 5] = flipped[flipped.size() - 5] == 'A' ? 'B' : 'A';
  EXPECT_EQ(refusal(v, flipped).refusal, Refusal::invalid);
  // The payload swapped for another subject's, the signature kept.
  const std::string other = rsa_->sign("RS256", header("RS256", "rsa-1"), claims("admin"));
  const auto dot = [](const std::string& t, int n) {
    std::size_t p = 0;
    for (int i = 0; i < n; ++i) p = t.find('.', p) + 1;
    return p;
  };
  const std::string spliced = good.substr(0, dot(good, 1)) +
                              other.substr(dot(other, 1), dot(other, 2) - dot(other, 1)) + good.substr(dot(good, 2));
  EXPECT_EQ(refusal(v, spliced).refusal, Refusal::invalid);
  // An ES256 signature cut short.
  const std::string es = ec_->sign("ES256", header("ES256", "ec-1"), claims("user-1"));
  EXPECT_EQ(refusal(v, es.substr(0, es.size() - 4)).refusal, Refusal::invalid);
}

TEST_F(JwtVerifierTest, AlgNoneIsNeverAccepted) {
  JwtVerifier v = verifier(key_options());
  for (const char* alg : {"none", "None", "NONE"}) {
    EXPECT_EQ(refusal(v, test::unsigned_token(header(alg), claims("user-1"))).refusal, Refusal::invalid);
    // With something in the signature part, so that it is the alg that is refused.
    const auto e = refusal(v, test::unsigned_token(header(alg), claims("user-1")) + "c2lnbmF0dXJl");
    EXPECT_NE(e.reason.find("\"none\""), std::string::npos) << e.reason;
  }
}

TEST_F(JwtVerifierTest, APublicKeyIsNeverAnHmacSecret) {
  // The classic confusion: an HS256 token "signed" with the RSA public key's PEM or DER as the
  // HMAC secret. HS256 cannot even be allowed with public keys; here the attacker also names the
  // RSA key's kid.
  JwtOptions o = key_options();
  o.algorithms = {Algorithm::RS256};
  JwtVerifier v = verifier(o);
  for (const std::string& secret : {rsa_->public_pem(), rsa_->public_der()}) {
    for (const char* kid : {"rsa-1", ""}) {
      const auto e = refusal(v, test::sign_hmac("HS256", header("HS256", kid), claims("user-1"), secret));
      EXPECT_EQ(e.refusal, Refusal::invalid);
      EXPECT_NE(e.reason.find("not in algorithms"), std::string::npos) << e.reason;
    }
  }
  JwtOptions hs = key_options();
  hs.algorithms = {Algorithm::RS256, Algorithm::HS256};
  EXPECT_FALSE(KeySet::load(hs));
}

TEST_F(JwtVerifierTest, AnAlgorithmMustFitTheKeysType) {
  // ES256 allowed, but the token names the RSA key: RSA keys never verify ES256.
  JwtVerifier v = verifier(key_options());
  const auto e = refusal(v, ec_->sign("ES256", header("ES256", "rsa-1"), claims("user-1")));
  EXPECT_NE(e.reason.find("does not verify ES256"), std::string::npos) << e.reason;
  // A key pinned to RS256 by its "alg" never verifies PS256, though RSA could.
  JwtOptions o;
  o.key_files = {file("pinned.json", test::jwk_set({rsa_->public_jwk("rsa-1", "RS256")}))};
  o.algorithms = {Algorithm::RS256, Algorithm::PS256};
  JwtVerifier pinned = verifier(o);
  EXPECT_FALSE(pinned.verify(rsa_->sign("PS256", header("PS256", "rsa-1"), claims("user-1"))));
  EXPECT_TRUE(pinned.verify(rsa_->sign("RS256", header("RS256", "rsa-1"), claims("user-1"))));
  // A P-384 key never verifies ES256, a P-256 key never ES384.
  TestKey p384 = TestKey::ec("P-384");
  JwtOptions ec;
  ec.key_files = {file("ec.json", test::jwk_set({p384.public_jwk("p384"), ec_->public_jwk("p256")}))};
  ec.algorithms = {Algorithm::ES256, Algorithm::ES384};
  JwtVerifier curves = verifier(ec);
  EXPECT_TRUE(curves.verify(p384.sign("ES384", header("ES384", "p384"), claims("u"))));
  EXPECT_FALSE(curves.verify(p384.sign("ES384", header("ES256", "p384"), claims("u"))));
  EXPECT_FALSE(curves.verify(ec_->sign("ES256", header("ES384", "p256"), claims("u"))));
}

TEST_F(JwtVerifierTest, EveryRsaAndEcAlgorithmVerifies) {
  TestKey p384 = TestKey::ec("P-384");
  TestKey p521 = TestKey::ec("P-521");
  JwtOptions o;
  o.key_files = {file("all.json", test::jwk_set({rsa_->public_jwk("rsa"), ec_->public_jwk("p256"),
                                                 p384.public_jwk("p384"), p521.public_jwk("p521")}))};
  o.algorithms = {Algorithm::RS256, Algorithm::RS384, Algorithm::RS512, Algorithm::PS256, Algorithm::PS384,
                  Algorithm::PS512, Algorithm::ES256, Algorithm::ES384, Algorithm::ES512};
  JwtVerifier v = verifier(o);
  for (const char* alg : {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"}) {
    auto r = v.verify(rsa_->sign(alg, header(alg, "rsa"), claims("u")));
    EXPECT_TRUE(r) << alg << ": " << (r ? "" : r.error().reason);
  }
  EXPECT_TRUE(v.verify(ec_->sign("ES256", header("ES256", "p256"), claims("u"))));
  EXPECT_TRUE(v.verify(p384.sign("ES384", header("ES384", "p384"), claims("u"))));
  EXPECT_TRUE(v.verify(p521.sign("ES512", header("ES512", "p521"), claims("u"))));
}

TEST_F(JwtVerifierTest, Hs384AndHs512NeedLongerSecrets) {
  JwtOptions o;
  o.secret_file = file("short.key", kSecret);  // 50 bytes
  o.algorithms = {Algorithm::HS256, Algorithm::HS512};
  auto refused = KeySet::load(o);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().find("at least 64"), std::string::npos) << refused.error();
  const std::string long_secret(64, 'k');
  o.secret_file = file("long.key", long_secret);
  JwtVerifier v = verifier(o);
  EXPECT_TRUE(v.verify(test::sign_hmac("HS512", header("HS512"), claims("u"), long_secret)));
  EXPECT_TRUE(v.verify(test::sign_hmac("HS256", header("HS256"), claims("u"), long_secret)));
  EXPECT_FALSE(v.verify(test::sign_hmac("HS384", header("HS384"), claims("u"), long_secret)));
}

TEST_F(JwtVerifierTest, AudienceAndIssuer) {
  JwtVerifier v = verifier(key_options());
  auto sign = [&](const std::string& payload) { return rsa_->sign("RS256", header("RS256", "rsa-1"), payload); };
  const std::string exp = std::to_string(now() + 600);
  EXPECT_NE(refusal(v, sign(R"({"iss":"https://auth.example","sub":"u","aud":"other-api","exp":)" + exp + "}"))
                .reason.find("aud"),
            std::string::npos);
  EXPECT_FALSE(v.verify(sign(R"({"iss":"https://auth.example","sub":"u","exp":)" + exp + "}")));  // no aud
  EXPECT_TRUE(
      v.verify(sign(R"({"iss":"https://auth.example","sub":"u","aud":["x","payments-api"],"exp":)" + exp + "}")));
  EXPECT_FALSE(v.verify(sign(R"({"iss":"https://auth.example","sub":"u","aud":["x"],"exp":)" + exp + "}")));
  EXPECT_NE(refusal(v, sign(R"({"iss":"https://evil.example","sub":"u","aud":"payments-api","exp":)" + exp + "}"))
                .reason.find("iss"),
            std::string::npos);
  EXPECT_FALSE(v.verify(sign(R"({"iss":"https://auth.example/","sub":"u","aud":"payments-api","exp":)" + exp + "}")));
  EXPECT_FALSE(v.verify(sign(R"({"sub":"u","aud":"payments-api","exp":)" + exp + "}")));  // no iss
}

TEST_F(JwtVerifierTest, ExpiryAndNotBeforeWithTheLeeway) {
  JwtVerifier v = verifier(key_options());  // leeway 60 s
  auto sign = [&](const std::string& payload) { return rsa_->sign("RS256", header("RS256", "rsa-1"), payload); };
  EXPECT_TRUE(v.verify(sign(claims("u", -59))));  // expired, within the leeway
  const auto expired = refusal(v, sign(claims("u", -61)));
  EXPECT_EQ(expired.refusal, Refusal::expired);
  EXPECT_NE(expired.reason.find("expired 61 s ago"), std::string::npos) << expired.reason;
  EXPECT_TRUE(v.verify(sign(claims("u", 600, ",\"nbf\":" + std::to_string(now() + 59)))));
  const auto early = refusal(v, sign(claims("u", 600, ",\"nbf\":" + std::to_string(now() + 61))));
  EXPECT_EQ(early.refusal, Refusal::invalid);
  EXPECT_NE(early.reason.find("nbf"), std::string::npos);
  // Fractional NumericDates are read as such.
  EXPECT_TRUE(v.verify(sign(R"({"iss":"https://auth.example","sub":"u","aud":"payments-api","exp":)" +
                            std::to_string(now() + 10) + ".5}")));
  // No exp, or not a number: refused (a token that never expires would be cached forever).
  EXPECT_NE(refusal(v, sign(R"({"iss":"https://auth.example","sub":"u","aud":"payments-api"})")).reason.find("no exp"),
            std::string::npos);
  EXPECT_FALSE(v.verify(sign(R"({"iss":"https://auth.example","sub":"u","aud":"payments-api","exp":"tomorrow"})")));

  JwtOptions strict = key_options();
  strict.leeway = Millis::zero();
  JwtVerifier s = verifier(strict);
  EXPECT_EQ(refusal(s, sign(claims("u", -1))).refusal, Refusal::expired);
}

TEST_F(JwtVerifierTest, MalformedTokensAreRefusedNotCrashed) {
  JwtVerifier v = verifier(key_options());
  const std::string good = rsa_->sign("RS256", header("RS256", "rsa-1"), claims("u"));
  std::string binary;
  for (int i = 0; i < 256; ++i) binary += static_cast<char>(i);
  for (const std::string& bad :
       {std::string(""), std::string("."), std::string(".."), std::string("abc"), std::string("a.b"),
        std::string("a.b.c.d"), good + ".x", std::string("!!!.@@@.###"), binary, std::string(1 << 20, 'A'),
        test::b64url("not json") + "." + test::b64url("{}") + ".c2ln",
        test::b64url("[1,2]") + "." + test::b64url("{}") + ".c2ln",
        test::b64url(R"({"alg":"RS256","alg":"RS256"})") + "." + test::b64url("{}") + ".c2ln",
        test::b64url(R"({"typ":"JWT"})") + "." + test::b64url("{}") + ".c2ln",
        test::b64url(R"({"alg":256})") + "." + test::b64url("{}") + ".c2ln",
        test::b64url(R"({"alg":"RS256","kid":7})") + "." + test::b64url("{}") + ".c2ln",
        test::b64url(R"({"alg":"RS256"})") + "==." + test::b64url("{}") + ".c2ln",
        test::b64url(std::string("{\"alg\":\"RS256\"}\0", 16)) + "." + test::b64url("{}") + ".c2ln"}) {
    const auto r = v.verify(bad);
    ASSERT_FALSE(r) << bad.substr(0, 80);
    EXPECT_EQ(r.error().refusal, Refusal::invalid);
    EXPECT_LT(r.error().reason.size(), 200u);
  }
  // A payload that is not an object, or has a claim twice, even correctly signed.
  EXPECT_FALSE(v.verify(rsa_->sign("RS256", header("RS256", "rsa-1"), "[1]")));
  const std::string twice = R"({"iss":"https://auth.example","sub":"alice","sub":"bob","aud":"payments-api","exp":)" +
                            std::to_string(now() + 600) + "}";
  EXPECT_FALSE(v.verify(rsa_->sign("RS256", header("RS256", "rsa-1"), twice)));
  // Critical extensions are not understood, so refused (RFC 7515 4.1.11).
  EXPECT_FALSE(v.verify(rsa_->sign("RS256", R"({"alg":"RS256","crit":["exp"],"exp":1})", claims("u"))));
  EXPECT_FALSE(v.verify(rsa_->sign("RS256", R"({"alg":"RS256","b64":false,"crit":["b64"]})", claims("u"))));
}

TEST_F(JwtVerifierTest, TenantClaimsMustBePresentAndNotEmpty) {
  JwtVerifier v = verifier(key_options());
  auto sign = [&](const std::string& sub_member) {
    return rsa_->sign("RS256", header("RS256", "rsa-1"),
                      R"({"iss":"https://auth.example","aud":"payments-api","exp":)" + std::to_string(now() + 600) +
                          sub_member + "}");
  };
  EXPECT_NE(refusal(v, sign("")).reason.find("no \"sub\" claim"), std::string::npos);
  EXPECT_FALSE(v.verify(sign(R"(,"sub":null)")));
  EXPECT_NE(refusal(v, sign(R"(,"sub":"")")).reason.find("empty"), std::string::npos);
  EXPECT_TRUE(v.verify(sign(R"(,"sub":"u")")));
}

TEST_F(JwtVerifierTest, KidSelectsTheKey) {
  JwtVerifier v = verifier(key_options());
  const auto e = refusal(v, rsa_->sign("RS256", header("RS256", "rsa-2"), claims("u")));
  EXPECT_NE(e.reason.find("kid \"rsa-2\" is not in the key set"), std::string::npos) << e.reason;
  // A token without a kid is tried against every key of its type.
  EXPECT_TRUE(v.verify(rsa_->sign("RS256", header("RS256"), claims("u"))));
  // Kids from the token are quoted safely in messages.
  const auto odd = refusal(v, rsa_->sign("RS256", R"({"alg":"RS256","kid":"a\"b\n"})", claims("u")));
  EXPECT_EQ(odd.reason.find('\n'), std::string::npos);

  // The set gains the key (a rotation): a new verifier on the reloaded set accepts it; the old
  // and the new key both verify.
  JwtOptions rotated = key_options();
  rotated.key_files = {file("jwks2.json", test::jwk_set({rsa_->public_jwk("rsa-1"), rsa_other_->public_jwk("rsa-2")}))};
  JwtVerifier reloaded = verifier(rotated);
  EXPECT_TRUE(reloaded.verify(rsa_other_->sign("RS256", header("RS256", "rsa-2"), claims("u"))));
  EXPECT_TRUE(reloaded.verify(rsa_->sign("RS256", header("RS256", "rsa-1"), claims("u"))));
}

TEST_F(JwtVerifierTest, PemKeysHaveNoKidAndVerifyAnyToken) {
  JwtOptions o;
  o.key_files = {file("keys.pem", rsa_->public_pem() + ec_->public_pem())};
  JwtVerifier v = verifier(o);
  EXPECT_TRUE(v.verify(rsa_->sign("RS256", header("RS256"), claims("u"))));
  EXPECT_TRUE(v.verify(rsa_->sign("RS256", header("RS256", "anything"), claims("u"))));
  EXPECT_TRUE(v.verify(ec_->sign("ES256", header("ES256"), claims("u"))));
  EXPECT_FALSE(v.verify(rsa_other_->sign("RS256", header("RS256"), claims("u"))));
}

TEST_F(JwtVerifierTest, AuthorizationHeaderForms) {
  JwtVerifier v = verifier(key_options());
  const std::string token = rsa_->sign("RS256", header("RS256", "rsa-1"), claims("u"));
  EXPECT_TRUE(v.verify_authorization("Bearer " + token));
  EXPECT_TRUE(v.verify_authorization("bearer " + token));
  EXPECT_TRUE(v.verify_authorization("BEARER   " + token + "  "));
  EXPECT_EQ(v.verify_authorization("").error().refusal, Refusal::missing);
  EXPECT_EQ(v.verify_authorization("Basic dXNlcjpwYXNz").error().refusal, Refusal::missing);
  EXPECT_EQ(v.verify_authorization(token).error().refusal, Refusal::missing);  // no scheme
  EXPECT_EQ(v.verify_authorization("Bearer").error().refusal, Refusal::invalid);
  EXPECT_EQ(v.verify_authorization("Bearer    ").error().refusal, Refusal::invalid);
  EXPECT_EQ(v.verify_authorization("Bearer " + token + " extra").error().refusal, Refusal::invalid);
  EXPECT_EQ(v.verify_authorization("Bearer\t" + token).error().refusal, Refusal::missing);
}

TEST_F(JwtVerifierTest, VerifiedTokensAreCachedUntilTheyExpire) {
  JwtVerifier v = verifier(key_options());
  const std::string token = rsa_->sign("RS256", header("RS256", "rsa-1"), claims("u", 120));
  auto first = v.verify(token);
  auto second = v.verify(token);
  ASSERT_TRUE(first && second);
  EXPECT_FALSE(first->cached);
  EXPECT_TRUE(second->cached);
  EXPECT_EQ(first->tenant, second->tenant);
  EXPECT_EQ(v.cached(), 1u);
  clock_.advance(120s + 60s);  // exp + leeway: still good
  EXPECT_TRUE(v.verify(token));
  clock_.advance(1s);
  const auto late = v.verify(token);
  ASSERT_FALSE(late);
  EXPECT_EQ(late.error().refusal, Refusal::expired);
  EXPECT_EQ(v.cached(), 0u);
  // Refused tokens are not cached.
  EXPECT_FALSE(v.verify(rsa_other_->sign("RS256", header("RS256", "rsa-1"), claims("u"))));
  EXPECT_EQ(v.cached(), 0u);
}

TEST_F(JwtVerifierTest, TheCacheIsBounded) {
  JwtOptions o = key_options();
  o.cache_size = 2;
  JwtVerifier v = verifier(o);
  const std::string a = rsa_->sign("RS256", header("RS256"), claims("a"));
  const std::string b = rsa_->sign("RS256", header("RS256"), claims("b"));
  const std::string c = rsa_->sign("RS256", header("RS256"), claims("c"));
  for (const auto& t : {a, b, c}) ASSERT_TRUE(v.verify(t));
  EXPECT_EQ(v.cached(), 2u);
  EXPECT_TRUE(v.verify(c)->cached);
  EXPECT_FALSE(v.verify(a)->cached);  // pushed out by c, verified again

  o.cache_size = 0;
  JwtVerifier none = verifier(o);
  ASSERT_TRUE(none.verify(a));
  EXPECT_FALSE(none.verify(a)->cached);
  EXPECT_EQ(none.cached(), 0u);
}

TEST_F(JwtVerifierTest, OversizedTokensAreRefusedUnread) {
  JwtOptions o = key_options();
  o.max_token_size = 64;
  JwtVerifier v = verifier(o);
  const auto e = refusal(v, rsa_->sign("RS256", header("RS256", "rsa-1"), claims("u")));
  EXPECT_NE(e.reason.find("longer than 64 bytes"), std::string::npos) << e.reason;
}

}  // namespace
}  // namespace idem::auth
