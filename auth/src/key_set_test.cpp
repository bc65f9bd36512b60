#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <vector>

#include "idem/auth/jwt.hpp"
#include "test_tokens.hpp"

namespace idem::auth {
namespace {

using test::TestKey;

class KeySetTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    rsa_ = new TestKey(TestKey::rsa());
    ec_ = new TestKey(TestKey::ec("P-256"));
  }
  static void TearDownTestSuite() {
    delete rsa_;
    delete ec_;
  }
  void SetUp() override {
    char dir[] = "/tmp/idem-keyset-test-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string file(const std::string& name, std::string_view content) {
    const std::string path = dir_ + "/" + name;
    test::write_file(path, content);
    return path;
  }

  // The error of loading `content` as the keys file (failing the test if it loads).
  std::string error_of(std::string_view content, JwtOptions o = {}) {
    o.key_files = {file("keys", content)};
    auto r = KeySet::load(o, &warnings_);
    if (r) {
      ADD_FAILURE() << "loaded: " << content.substr(0, 100);
      return "";
    }
    return r.error();
  }

  std::size_t loaded(std::string_view content, JwtOptions o = {}) {
    o.key_files = {file("keys", content)};
    auto r = KeySet::load(o, &warnings_);
    if (!r) {
      ADD_FAILURE() << r.error();
      return 0;
    }
    return (*r)->size();
  }

  static TestKey* rsa_;
  static TestKey* ec_;
  std::string dir_;
  std::vector<std::string> warnings_;
};

TestKey* KeySetTest::rsa_ = nullptr;
TestKey* KeySetTest::ec_ = nullptr;

TEST_F(KeySetTest, JwkSetsBareJwksAndPem) {
  EXPECT_EQ(loaded(test::jwk_set({rsa_->public_jwk("a"), ec_->public_jwk("b")})), 2u);
  EXPECT_EQ(loaded(rsa_->public_jwk()), 1u);
  EXPECT_EQ(loaded(rsa_->public_pem() + "\n" + ec_->public_pem()), 2u);
  EXPECT_TRUE(warnings_.empty());
}

TEST_F(KeySetTest, SeveralFilesAddUp) {
  JwtOptions o;
  o.key_files = {file("old.pem", rsa_->public_pem()), file("new.json", test::jwk_set({ec_->public_jwk("new")}))};
  auto r = KeySet::load(o);
  ASSERT_TRUE(r) << r.error();
  EXPECT_EQ((*r)->size(), 2u);
}

TEST_F(KeySetTest, DefaultAlgorithmsFollowTheKind) {
  JwtOptions keys;
  keys.key_files = {file("k.pem", rsa_->public_pem())};
  EXPECT_EQ(KeySet::load(keys).value()->options().algorithms,
            (std::vector<Algorithm>{Algorithm::RS256, Algorithm::ES256}));
  JwtOptions secret;
  secret.secret_file = file("s", std::string(32, 's'));
  EXPECT_EQ(KeySet::load(secret).value()->options().algorithms, std::vector<Algorithm>{Algorithm::HS256});
}

TEST_F(KeySetTest, UnsupportedKeysAreSkippedWithAWarning) {
  TestKey ed = TestKey::ed25519();
  TestKey p384 = TestKey::ec("P-384");
  const std::string set =
      test::jwk_set({ed.public_jwk("ed"), rsa_->public_jwk("enc-key").insert(1, R"("use":"enc",)"),
                     p384.public_jwk("p384"), R"({"kty":"EC","crv":"secp256k1","x":"AA","y":"AA"})",
                     rsa_->public_jwk("verify-only").insert(1, R"("key_ops":["encrypt"],)"), rsa_->public_jwk("good")});
  EXPECT_EQ(loaded(set), 1u);
  ASSERT_EQ(warnings_.size(), 5u);
  EXPECT_NE(warnings_[0].find("key #1 (kid \"ed\")"), std::string::npos) << warnings_[0];
  EXPECT_NE(warnings_[0].find("\"OKP\" is not supported"), std::string::npos) << warnings_[0];
  EXPECT_NE(warnings_[1].find("\"use\" is \"enc\""), std::string::npos) << warnings_[1];
  EXPECT_NE(warnings_[2].find("ES384"), std::string::npos) << warnings_[2];  // not in algorithms
  EXPECT_NE(warnings_[3].find("secp256k1"), std::string::npos) << warnings_[3];
  EXPECT_NE(warnings_[4].find("key_ops"), std::string::npos) << warnings_[4];
}

TEST_F(KeySetTest, NoUsableKeyIsAnError) {
  TestKey ed = TestKey::ed25519();
  EXPECT_NE(error_of(test::jwk_set({ed.public_jwk("ed")})).find("no key can verify any of the allowed algorithms"),
            std::string::npos);
  JwtOptions es_only;
  es_only.algorithms = {Algorithm::ES256};
  EXPECT_NE(error_of(rsa_->public_pem(), es_only).find("no key can verify"), std::string::npos);
}

TEST_F(KeySetTest, WeakRsaKeysAreSkipped) {
  TestKey weak = TestKey::rsa(1024);
  EXPECT_EQ(loaded(test::jwk_set({weak.public_jwk("weak"), rsa_->public_jwk("ok")})), 1u);
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_NE(warnings_[0].find("1024 bits"), std::string::npos) << warnings_[0];
}

TEST_F(KeySetTest, BrokenFilesAndKeysAreErrors) {
  EXPECT_NE(error_of("").find("the file is empty"), std::string::npos);
  EXPECT_NE(error_of("{not json").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("hello").find("neither a JWK Set (JSON) nor PEM"), std::string::npos);
  EXPECT_NE(error_of(R"({"keys":{}})").find("\"keys\" is not an array"), std::string::npos);
  EXPECT_NE(error_of(R"({"keys":[]})").find("empty"), std::string::npos);
  EXPECT_NE(error_of(R"({"a":1})").find("neither a JWK Set"), std::string::npos);
  EXPECT_NE(error_of(R"({"keys":[42]})").find("key #1: not a JSON object"), std::string::npos);
  EXPECT_NE(error_of(R"({"keys":[{"n":"AQAB"}]})").find("no \"kty\""), std::string::npos);
  EXPECT_NE(error_of(R"({"keys":[{"kty":"RSA","e":"AQAB"}]})").find("needs \"n\" and \"e\""), std::string::npos);
  EXPECT_NE(error_of(R"({"keys":[{"kty":"RSA","kid":"x","n":"@@@","e":"AQAB"}]})").find("key #1 (kid \"x\")"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"keys":[{"kty":"RSA","n":"@@@","e":"AQAB"}]})").find("malformed RSA key"), std::string::npos);
  // A point that is not on the curve.
  EXPECT_NE(error_of(R"({"keys":[{"kty":"EC","crv":"P-256","x":"AQ","y":"AQ"}]})").find("malformed EC P-256 key"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"keys":[{"kty":"oct","k":"c2VjcmV0"}]})").find("secret_file"), std::string::npos);
  EXPECT_NE(error_of(test::jwk_set({rsa_->public_jwk("a", "ES256")})).find("does not fit an RSA key"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"keys":[{"kty":"RSA","kid":5}]})").find("\"kid\" is not a string"), std::string::npos);
  EXPECT_NE(error_of("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n").find("malformed"),
            std::string::npos);
  EXPECT_NE(error_of("-----BEGIN PUBLIC KEY-----\nnot base64 at all").find("no PEM block"), std::string::npos);
  EXPECT_NE(error_of(rsa_->public_pem() + "-----BEGIN FOO-----\nAAAA\n-----END FOO-----\n").find("PEM block #2 (FOO)"),
            std::string::npos);
  JwtOptions o;
  o.key_files = {dir_ + "/missing.json"};
  auto r = KeySet::load(o);
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().find("cannot read the file"), std::string::npos) << r.error();
}

TEST_F(KeySetTest, AHugeFileIsRefusedUnparsed) {
  const std::string e = error_of(std::string(2 * 1024 * 1024, ' '));
  EXPECT_NE(e.find("larger than 1048576 bytes"), std::string::npos) << e;
}

TEST_F(KeySetTest, PrivateKeysNeverLoadAndNeverShow) {
  const std::string pem = rsa_->private_pem();
  const std::string e = error_of(pem);
  EXPECT_NE(e.find("is a private key"), std::string::npos) << e;
  EXPECT_EQ(e.find(pem.substr(40, 40)), std::string::npos);

  // A private JWK loads (its public part) with a warning that names it, not its numbers.
  const std::string jwk = rsa_->private_jwk();
  EXPECT_EQ(loaded(test::jwk_set({jwk})), 1u);
  ASSERT_EQ(warnings_.size(), 1u);
  EXPECT_NE(warnings_[0].find("private key material"), std::string::npos);
  const auto d = jwk.find("\"d\":\"");
  EXPECT_EQ(warnings_[0].find(jwk.substr(d + 5, 20)), std::string::npos);
  const auto n = jwk.find("\"n\":\"");
  EXPECT_EQ(warnings_[0].find(jwk.substr(n + 5, 20)), std::string::npos);
}

TEST_F(KeySetTest, CertificatesGiveTheirPublicKey) {
  // A self-signed certificate made with the test key, written as PEM.
  const std::string cmd = "openssl req -x509 -new -key " + file("key.pem", rsa_->private_pem()) +
                          " -subj /CN=idem-test -days 1 -out " + dir_ + "/cert.pem 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  JwtOptions o;
  o.key_files = {dir_ + "/cert.pem"};
  auto r = KeySet::load(o);
  ASSERT_TRUE(r) << r.error();
  EXPECT_EQ((*r)->size(), 1u);
}

TEST_F(KeySetTest, OptionsAreChecked) {
  const std::string pem = file("k.pem", rsa_->public_pem());
  const std::string secret = file("s", std::string(40, 's'));
  auto error = [](JwtOptions o) {
    auto r = KeySet::load(std::move(o));
    return r ? std::string("(loaded)") : r.error();
  };
  JwtOptions o;
  EXPECT_NE(error(o).find("needs keys"), std::string::npos);
  o.key_files = {pem};
  o.secret_file = secret;
  EXPECT_NE(error(o).find("not both"), std::string::npos);
  o.secret_file.clear();
  o.algorithms = {Algorithm::HS256};
  EXPECT_NE(error(o).find("HS256 is an HMAC"), std::string::npos);
  o.algorithms = {Algorithm::RS256};
  o.claims = {};
  EXPECT_NE(error(o).find("claims: list at least one"), std::string::npos);
  o.claims = {"sub", "sub"};
  EXPECT_NE(error(o).find("listed twice"), std::string::npos);
  o.claims = {""};
  EXPECT_NE(error(o).find("empty"), std::string::npos);
  o.claims = {"sub"};
  o.audience = "";
  EXPECT_NE(error(o).find("audience"), std::string::npos);
  o.audience.reset();
  o.leeway = Millis(-1);
  EXPECT_NE(error(o).find("leeway"), std::string::npos);

  JwtOptions s;
  s.secret_file = secret;
  s.algorithms = {Algorithm::RS256};
  EXPECT_NE(error(s).find("RS256 is a public-key signature"), std::string::npos);
}

TEST_F(KeySetTest, SecretFiles) {
  auto load = [&](std::string_view content, std::vector<std::string>* warnings = nullptr) {
    JwtOptions o;
    o.secret_file = file("secret", content);
    return KeySet::load(o, warnings);
  };
  EXPECT_NE(load("").error().find("empty"), std::string::npos);
  EXPECT_NE(load("\n").error().find("empty"), std::string::npos);
  const auto short_one = load("too-short-secret\n");
  ASSERT_FALSE(short_one);
  EXPECT_NE(short_one.error().find("needs at least 32"), std::string::npos) << short_one.error();
  EXPECT_EQ(short_one.error().find("too-short-secret"), std::string::npos);  // never the secret itself
  EXPECT_NE(load(std::string(600, 'x')).error().find("larger than 512 bytes"), std::string::npos);
  EXPECT_TRUE(load(std::string(512, 'x')));
  EXPECT_TRUE(load(std::string(32, 'x') + "\r\n"));

  // Readable by others: a warning.
  std::vector<std::string> warnings;
  const std::string path = file("shared", std::string(32, 'x'));
  ASSERT_EQ(::chmod(path.c_str(), 0644), 0);
  JwtOptions o;
  o.secret_file = path;
  ASSERT_TRUE(KeySet::load(o, &warnings));
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("chmod 600"), std::string::npos);
}

TEST(Algorithms, NamesRoundTripAndNoneIsNotOne) {
  for (const auto a : {Algorithm::RS256, Algorithm::PS512, Algorithm::ES384, Algorithm::HS256}) {
    EXPECT_EQ(parse_algorithm(to_string(a)), a);
  }
  EXPECT_FALSE(parse_algorithm("none"));
  EXPECT_FALSE(parse_algorithm("rs256"));  // case-sensitive, as in JOSE headers
  EXPECT_FALSE(parse_algorithm("EdDSA"));
  EXPECT_TRUE(is_symmetric(Algorithm::HS512));
  EXPECT_FALSE(is_symmetric(Algorithm::ES256));
}

}  // namespace
}  // namespace idem::auth
