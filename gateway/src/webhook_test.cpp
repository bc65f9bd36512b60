#include "idem/gateway/webhook.hpp"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace idem::gateway {
namespace {

constexpr std::int64_t kNow = 1700000000;
const std::string kBody = R"({"id":"evt_1NG8Du2eZvKYlo2CUI79vXWy","object":"event","type":"payment_intent.succeeded"})";

// The expected MACs are computed here with OpenSSL's one-shot HMAC() and its own encoders, not
// with the module's code path (EVP_MAC, its own hex and base64 decoding).
std::string hmac_sha256(const std::string& key, const std::string& data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), out, &n);
  return std::string(reinterpret_cast<const char*>(out), n);
}

std::string hex(const std::string& bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (const unsigned char c : bytes) {
    out += kHex[c >> 4];
    out += kHex[c & 15];
  }
  return out;
}

std::string base64(const std::string& bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

std::shared_ptr<const WebhookVerifier> verifier(WebhookProfile profile, std::vector<std::string> secrets,
                                                WebhookTemplate custom = {}) {
  WebhookSettings settings;
  settings.profile = profile;
  settings.custom = std::move(custom);
  auto v = WebhookVerifier::from_secrets(settings, secrets);
  EXPECT_TRUE(v.has_value()) << (v ? "" : v.error());
  return v ? *v : nullptr;
}

WebhookRefusal reason_of(const std::expected<std::string, WebhookError>& r) {
  EXPECT_FALSE(r.has_value());
  return r ? WebhookRefusal::count_ : r.error().reason;
}

// ---- Stripe ----

const std::string kStripeSecret = "whsec_test_secret_0123456789";

std::string stripe_header(const std::string& secret, std::int64_t t, const std::string& body) {
  const std::string ts = std::to_string(t);
  return "t=" + ts + ",v1=" + hex(hmac_sha256(secret, ts + "." + body));
}

TEST(WebhookStripe, GenuineEventYieldsItsId) {
  auto v = verifier(WebhookProfile::stripe, {kStripeSecret});
  const std::string sig = stripe_header(kStripeSecret, kNow, kBody);
  const HeaderView headers[] = {{"stripe-signature", sig}};
  auto key = v->verify(headers, kBody, kNow);
  ASSERT_TRUE(key.has_value()) << key.error().detail;
  EXPECT_EQ(*key, "evt_1NG8Du2eZvKYlo2CUI79vXWy");
}

TEST(WebhookStripe, AKnownVectorComputedBeforehand) {
  // HMAC-SHA256("whsec_test_secret_0123456789", "1700000000." + kBody), by Python's hmac module.
  const std::string sig = "2e536652a17af3ed8d9d8b2fb7e1cd06c6a2585edd7414d5eef7e30c03e16910";
  ASSERT_EQ(hex(hmac_sha256(kStripeSecret, "1700000000." + kBody)), sig);
  auto v = verifier(WebhookProfile::stripe, {kStripeSecret});
  const std::string header = "t=1700000000,v1=" + sig;
  const HeaderView headers[] = {{"Stripe-Signature", header}};
  EXPECT_TRUE(v->verify(headers, kBody, kNow).has_value());
}

TEST(WebhookStripe, AnyOfSeveralV1SignaturesAndAnyOfSeveralSecrets) {
  auto v = verifier(WebhookProfile::stripe, {"whsec_old", kStripeSecret});
  const std::string good = stripe_header(kStripeSecret, kNow, kBody);
  const std::string header = "t=" + std::to_string(kNow) + ",v1=" + std::string(64, 'a') + "," + good.substr(good.find("v1="));
  const HeaderView headers[] = {{"Stripe-Signature", header}};
  EXPECT_TRUE(v->verify(headers, kBody, kNow).has_value());
}

TEST(WebhookStripe, ForgeriesAreRefusedWithTheirReason) {
  auto v = verifier(WebhookProfile::stripe, {kStripeSecret});
  {
    const std::string signature = stripe_header("whsec_wrong", kNow, kBody);
    const HeaderView headers[] = {{"Stripe-Signature", signature}};
    EXPECT_EQ(reason_of(v->verify(headers, kBody, kNow)), WebhookRefusal::signature_invalid);
  }
  {
    std::string changed = kBody;
    changed[10] = 'X';
    const std::string signature = stripe_header(kStripeSecret, kNow, kBody);
    const HeaderView headers[] = {{"Stripe-Signature", signature}};
    EXPECT_EQ(reason_of(v->verify(headers, changed, kNow)), WebhookRefusal::signature_invalid);
  }
  {
    EXPECT_EQ(reason_of(v->verify({}, kBody, kNow)), WebhookRefusal::signature_missing);
  }
  {
    const std::string signature = stripe_header(kStripeSecret, kNow - 600, kBody);
    const HeaderView headers[] = {{"Stripe-Signature", signature}};
    EXPECT_EQ(reason_of(v->verify(headers, kBody, kNow)), WebhookRefusal::timestamp_outside_tolerance);
  }
  {
    const std::string signature = stripe_header(kStripeSecret, kNow + 600, kBody);
    const HeaderView headers[] = {{"Stripe-Signature", signature}};
    EXPECT_EQ(reason_of(v->verify(headers, kBody, kNow)), WebhookRefusal::timestamp_outside_tolerance);
  }
  {
    // Within the tolerance either way.
    const std::string signature = stripe_header(kStripeSecret, kNow - 299, kBody);
    const HeaderView headers[] = {{"Stripe-Signature", signature}};
    EXPECT_TRUE(v->verify(headers, kBody, kNow).has_value());
  }
  {
    std::string v0 = stripe_header(kStripeSecret, kNow, kBody);
    v0.replace(v0.find("v1="), 3, "v0=");
    const HeaderView headers[] = {{"Stripe-Signature", v0}};
    const auto r = v->verify(headers, kBody, kNow);
    EXPECT_EQ(reason_of(r), WebhookRefusal::signature_invalid);
    EXPECT_NE(r.error().detail.find("only the v1 scheme"), std::string::npos);
  }
  {
    const std::string huge = stripe_header(kStripeSecret, kNow, kBody) + ",v1=" + std::string(5000, 'a');
    const HeaderView headers[] = {{"Stripe-Signature", huge}};
    EXPECT_EQ(reason_of(v->verify(headers, kBody, kNow)), WebhookRefusal::signature_invalid);
  }
  {
    const std::string sig = stripe_header(kStripeSecret, kNow, kBody);
    const HeaderView headers[] = {{"Stripe-Signature", sig}, {"Stripe-Signature", sig}};
    EXPECT_EQ(reason_of(v->verify(headers, kBody, kNow)), WebhookRefusal::signature_invalid);
  }
}

TEST(WebhookStripe, GenuineButWithoutAnIdIsWebhookIdMissing) {
  auto v = verifier(WebhookProfile::stripe, {kStripeSecret});
  const std::string body = R"({"object":"event"})";
  const std::string signature = stripe_header(kStripeSecret, kNow, body);
    const HeaderView headers[] = {{"Stripe-Signature", signature}};
  EXPECT_EQ(reason_of(v->verify(headers, body, kNow)), WebhookRefusal::webhook_id_missing);
}

TEST(WebhookStripe, ErrorsNeverHoldTheSecretOrTheSignature) {
  auto v = verifier(WebhookProfile::stripe, {kStripeSecret});
  const std::string sig = stripe_header("whsec_wrong", kNow, kBody);
  const HeaderView headers[] = {{"Stripe-Signature", sig}};
  const auto r = v->verify(headers, kBody, kNow);
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().detail.find("whsec"), std::string::npos);
  EXPECT_EQ(r.error().detail.find(sig.substr(sig.find("v1=") + 3, 16)), std::string::npos);
}

// ---- Standard Webhooks ----

TEST(WebhookStandard, TheSpecificationsExample) {
  // The example of the Standard Webhooks specification (github.com/standard-webhooks): its
  // secret, message id, timestamp, payload and the signature it gives.
  auto v = verifier(WebhookProfile::standard, {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"});
  const std::string body = R"({"test": 2432232314})";
  const HeaderView headers[] = {{"webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"},
                                {"webhook-timestamp", "1614265330"},
                                {"webhook-signature", "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="}};
  auto key = v->verify(headers, body, 1614265330);
  ASSERT_TRUE(key.has_value()) << key.error().detail;
  EXPECT_EQ(*key, "msg_p5jXN8AQM9LWM0D4loKWxJek");
  // The same a day later: genuine, but outside the tolerance.
  EXPECT_EQ(reason_of(v->verify(headers, body, 1614265330 + 86400)), WebhookRefusal::timestamp_outside_tolerance);
}

TEST(WebhookStandard, SeveralSignaturesAndSchemes) {
  const std::string raw_key = "0123456789abcdef0123456789abcdef";
  auto v = verifier(WebhookProfile::standard, {"whsec_" + base64(raw_key)});
  const std::string ts = std::to_string(kNow);
  const std::string good = "v1," + base64(hmac_sha256(raw_key, "msg_1." + ts + "." + kBody));
  const std::string sig = "v1a,AAAA v1," + base64(std::string(32, 'x')) + " " + good;
  const HeaderView headers[] = {{"webhook-id", "msg_1"}, {"webhook-timestamp", ts}, {"webhook-signature", sig}};
  auto key = v->verify(headers, kBody, kNow);
  ASSERT_TRUE(key.has_value()) << key.error().detail;
  EXPECT_EQ(*key, "msg_1");

  const HeaderView ed25519_only[] = {{"webhook-id", "msg_1"}, {"webhook-timestamp", ts}, {"webhook-signature", "v1a,AAAA"}};
  EXPECT_EQ(reason_of(v->verify(ed25519_only, kBody, kNow)), WebhookRefusal::signature_invalid);
  const HeaderView no_id[] = {{"webhook-timestamp", ts}, {"webhook-signature", good}};
  EXPECT_EQ(reason_of(v->verify(no_id, kBody, kNow)), WebhookRefusal::webhook_id_missing);
  const HeaderView no_ts[] = {{"webhook-id", "msg_1"}, {"webhook-signature", good}};
  EXPECT_EQ(reason_of(v->verify(no_ts, kBody, kNow)), WebhookRefusal::signature_missing);
  // Another event's signature: the id is signed.
  const HeaderView other_id[] = {{"webhook-id", "msg_2"}, {"webhook-timestamp", ts}, {"webhook-signature", good}};
  EXPECT_EQ(reason_of(v->verify(other_id, kBody, kNow)), WebhookRefusal::signature_invalid);
}

TEST(WebhookStandard, SecretsMustBeWhsecBase64) {
  WebhookSettings settings;
  settings.profile = WebhookProfile::standard;
  EXPECT_FALSE(WebhookVerifier::from_secrets(settings, {"whsec_!!not base64!!"}).has_value());
}

// ---- GitHub ----

TEST(WebhookGithub, SignatureOverTheBodyKeyFromTheDelivery) {
  const std::string secret = "It's a Secret to Everybody";
  auto v = verifier(WebhookProfile::github, {secret});
  const std::string body = "Hello, World!";
  // GitHub's documented example (docs.github.com, "Validating webhook deliveries"); checked
  // against the one-shot HMAC too.
  const std::string documented = "757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
  ASSERT_EQ(hex(hmac_sha256(secret, body)), documented);
  const std::string header = "sha256=" + documented, sha1_header = "sha1=" + documented;
  const HeaderView headers[] = {{"X-Hub-Signature-256", header},
                                {"X-GitHub-Delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"}};
  auto key = v->verify(headers, body, kNow);
  ASSERT_TRUE(key.has_value()) << key.error().detail;
  EXPECT_EQ(*key, "72d3162e-cc78-11e3-81ab-4c9367dc0958");

  const HeaderView sha1[] = {{"X-Hub-Signature", "sha1=01dc10d0c83e72ed246219cdd91669667fe2ca59"},
                             {"X-GitHub-Delivery", "d1"}};
  EXPECT_EQ(reason_of(v->verify(sha1, body, kNow)), WebhookRefusal::signature_missing);
  const HeaderView wrong_scheme[] = {{"X-Hub-Signature-256", sha1_header}, {"X-GitHub-Delivery", "d1"}};
  EXPECT_EQ(reason_of(v->verify(wrong_scheme, body, kNow)), WebhookRefusal::signature_invalid);
  const HeaderView no_delivery[] = {{"X-Hub-Signature-256", header}};
  EXPECT_EQ(reason_of(v->verify(no_delivery, body, kNow)), WebhookRefusal::webhook_id_missing);
}

// ---- custom ----

TEST(WebhookCustom, TemplateWithTimestampPrefixAndBase64) {
  WebhookTemplate t;
  t.key_pointer = "/data/event~1id";
  t.signature_header = "X-Acme-Signature";
  t.signed_payload = "{timestamp}:{body}";
  t.encoding = WebhookTemplate::Encoding::base64;
  t.prefix = "hmac=";
  t.timestamp_header = "X-Acme-Time";
  auto v = verifier(WebhookProfile::custom, {"acme-secret"}, t);
  const std::string body = R"({"data":{"event/id":42}})";
  const std::string ts = std::to_string(kNow);
  const std::string sig = "hmac=" + base64(hmac_sha256("acme-secret", ts + ":" + body));
  const HeaderView headers[] = {{"X-Acme-Signature", sig}, {"X-Acme-Time", ts}};
  auto key = v->verify(headers, body, kNow);
  ASSERT_TRUE(key.has_value()) << key.error().detail;
  EXPECT_EQ(*key, "42");
  EXPECT_EQ(reason_of(v->verify(headers, body, kNow + 301)), WebhookRefusal::timestamp_outside_tolerance);
  const HeaderView no_ts[] = {{"X-Acme-Signature", sig}};
  EXPECT_EQ(reason_of(v->verify(no_ts, body, kNow)), WebhookRefusal::signature_missing);
  const std::string unprefixed = sig.substr(5);
  const HeaderView no_prefix[] = {{"X-Acme-Signature", unprefixed}, {"X-Acme-Time", ts}};
  EXPECT_EQ(reason_of(v->verify(no_prefix, body, kNow)), WebhookRefusal::signature_invalid);
}

TEST(WebhookCustom, KeyFromAHeaderSignedWithTheBody) {
  WebhookTemplate t;
  t.key_header = "X-Event-Id";
  t.signature_header = "X-Sig";
  t.signed_payload = "{key}.{body}";
  auto v = verifier(WebhookProfile::custom, {"s3"}, t);
  const std::string sig = hex(hmac_sha256("s3", "ev-9." + kBody));
  const HeaderView headers[] = {{"X-Sig", sig}, {"X-Event-Id", "ev-9"}};
  auto key = v->verify(headers, kBody, kNow);
  ASSERT_TRUE(key.has_value()) << key.error().detail;
  EXPECT_EQ(*key, "ev-9");
  const HeaderView other[] = {{"X-Sig", sig}, {"X-Event-Id", "ev-10"}};
  EXPECT_EQ(reason_of(v->verify(other, kBody, kNow)), WebhookRefusal::signature_invalid);
}

TEST(WebhookPointer, SplitsAndUnescapes) {
  auto tokens = split_json_pointer("/a~1b/c~0d/0");
  ASSERT_TRUE(tokens.has_value());
  EXPECT_EQ(*tokens, (std::vector<std::string>{"a/b", "c~d", "0"}));
  EXPECT_FALSE(split_json_pointer("a").has_value());
  EXPECT_FALSE(split_json_pointer("/a~2").has_value());
}

// ---- secret files ----

class WebhookSecretFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/idem-gw-webhook-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& text, mode_t mode) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path) << text;
    ::chmod(path.c_str(), mode);
    return path;
  }
  std::string dir_;
};

TEST_F(WebhookSecretFileTest, OneSecretPerLineAndEveryOneVerifies) {
  WebhookSettings settings;
  settings.profile = WebhookProfile::stripe;
  settings.secret_files = {write("s", "whsec_old\n\n" + kStripeSecret + "\n", 0600)};
  auto v = WebhookVerifier::load(settings);
  ASSERT_TRUE(v.has_value()) << v.error();
  EXPECT_EQ((*v)->secret_count(), 2u);
  for (const std::string secret : {"whsec_old", kStripeSecret.c_str()}) {
    const std::string signature = stripe_header(secret, kNow, kBody);
    const HeaderView headers[] = {{"Stripe-Signature", signature}};
    EXPECT_TRUE((*v)->verify(headers, kBody, kNow).has_value());
  }
}

TEST_F(WebhookSecretFileTest, FilesOthersCanReadOrThatHoldNothingAreRefused) {
  WebhookSettings settings;
  settings.profile = WebhookProfile::stripe;
  settings.secret_files = {write("open", kStripeSecret + "\n", 0644)};
  auto v = WebhookVerifier::load(settings);
  ASSERT_FALSE(v.has_value());
  EXPECT_NE(v.error().find("mode 0644"), std::string::npos);
  EXPECT_EQ(v.error().find(kStripeSecret), std::string::npos);
  settings.secret_files = {write("empty", "\n\n", 0600)};
  EXPECT_FALSE(WebhookVerifier::load(settings).has_value());
  settings.secret_files = {dir_ + "/absent"};
  EXPECT_FALSE(WebhookVerifier::load(settings).has_value());
  settings.secret_files = {write("group", kStripeSecret + "\n", 0640)};
  EXPECT_TRUE(WebhookVerifier::load(settings).has_value());
}

}  // namespace
}  // namespace idem::gateway
