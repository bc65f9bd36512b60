#include "idem/webhook/signing.hpp"

#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <string>
#include <vector>

namespace idem::webhook {
namespace {

// The expected values come from OpenSSL's one-shot HMAC() and its own encoder, not from the
// module's code path (EVP_MAC, its own base64).
std::string openssl_base64(const std::string& bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  const int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                                reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

std::string openssl_hmac(const std::string& key, const std::string& data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), out, &n);
  return std::string(reinterpret_cast<const char*>(out), n);
}

TEST(StandardSigner, SignsTheSpecificationsExample) {
  // The example of the Standard Webhooks specification (github.com/standard-webhooks), which
  // gateway/src/webhook_test.cpp verifies: its secret, id, timestamp and payload give its signature.
  const std::vector<std::string> secrets = {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"};
  auto signer = StandardSigner::from_secrets(secrets);
  ASSERT_TRUE(signer.has_value()) << signer.error();
  EXPECT_EQ(signer->signature("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, R"({"test": 2432232314})"),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
  const auto headers = signer->headers("msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, R"({"test": 2432232314})");
  ASSERT_EQ(headers.size(), 3u);
  EXPECT_EQ(headers[0], (std::pair<std::string, std::string>{"webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"}));
  EXPECT_EQ(headers[1], (std::pair<std::string, std::string>{"webhook-timestamp", "1614265330"}));
  EXPECT_EQ(headers[2].first, "webhook-signature");
  EXPECT_EQ(headers[2].second, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
}

TEST(StandardSigner, SignsWithEverySecretInOrder) {
  const std::string old_key = "0123456789abcdef0123456789abcdef", new_key = "another key, 24 bytes..";
  const std::vector<std::string> secrets = {"whsec_" + openssl_base64(old_key), openssl_base64(new_key)};
  auto signer = StandardSigner::from_secrets(secrets);
  ASSERT_TRUE(signer.has_value()) << signer.error();
  EXPECT_EQ(signer->secret_count(), 2u);
  const std::string body = "{\"amount\":100}";
  const std::string signed_text = std::string("evt_1.1700000000.") + body;
  EXPECT_EQ(signer->signature("evt_1", 1700000000, body),
            "v1," + openssl_base64(openssl_hmac(old_key, signed_text)) + " v1," +
                openssl_base64(openssl_hmac(new_key, signed_text)));
  // Another body, id or timestamp gives another signature.
  const std::string signature = signer->signature("evt_1", 1700000000, body);
  EXPECT_NE(signer->signature("evt_1", 1700000000, "{\"amount\":101}"), signature);
  EXPECT_NE(signer->signature("evt_2", 1700000000, body), signature);
  EXPECT_NE(signer->signature("evt_1", 1700000001, body), signature);
}

TEST(StandardSigner, RefusesSecretsThatAreNotBase64WithoutQuotingThem) {
  const std::vector<std::string> secrets = {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_not*base64!"};
  auto signer = StandardSigner::from_secrets(secrets);
  ASSERT_FALSE(signer.has_value());
  EXPECT_NE(signer.error().find("secret #2"), std::string::npos);
  EXPECT_EQ(signer.error().find("not*base64"), std::string::npos);
  const std::vector<std::string> empty_key = {"whsec_"};
  EXPECT_FALSE(StandardSigner::from_secrets(empty_key).has_value());
  EXPECT_FALSE(StandardSigner::from_secrets(std::vector<std::string>{}).has_value());
}

TEST(Base64, EncodesLikeOpenSslAndDecodesBothAlphabets) {
  for (const std::string bytes : {"", "a", "ab", "abc", "abcd", "\xff\xfe\xfd\x00\x01"}) {
    EXPECT_EQ(encode_base64(bytes), openssl_base64(bytes));
    EXPECT_EQ(decode_base64(encode_base64(bytes)), bytes);
  }
  EXPECT_EQ(decode_base64("-_8"), decode_base64("+/8="));
  EXPECT_FALSE(decode_base64("a").has_value());
  EXPECT_FALSE(decode_base64("ab$d").has_value());
}

TEST(HmacKey, OneKeyServesManyMacs) {
  auto key = HmacKey::make(HmacAlgorithm::sha256, "k");
  ASSERT_TRUE(key.has_value());
  const std::string_view pieces[] = {"a", ".", "b"};
  EXPECT_EQ(key->mac(pieces)->view(), openssl_hmac("k", "a.b"));
  EXPECT_EQ(key->mac(pieces)->view(), openssl_hmac("k", "a.b"));  // the keyed context is copied, not consumed
  auto sha512 = HmacKey::make(HmacAlgorithm::sha512, "k");
  ASSERT_TRUE(sha512.has_value());
  EXPECT_EQ(sha512->mac(pieces)->size, 64u);
}

}  // namespace
}  // namespace idem::webhook
