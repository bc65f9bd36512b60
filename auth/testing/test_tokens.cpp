#include "test_tokens.hpp"

#include <openssl/bn.h>
#include <openssl/core_names.h>
#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/rsa.h>
#include <openssl/x509.h>
#include <sys/stat.h>

#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <vector>

namespace idem::auth::test {
namespace {

EVP_PKEY* pk(void* p) { return static_cast<EVP_PKEY*>(p); }

void check(bool ok, const char* what) {
  if (!ok) throw std::runtime_error(std::string("test_tokens: ") + what + " failed");
}

std::string bio_text(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  std::string out(data, static_cast<std::size_t>(n));
  BIO_free(bio);
  return out;
}

const EVP_MD* digest_for(std::string_view alg) {
  const std::string_view bits = alg.substr(2);
  if (bits == "256") return EVP_sha256();
  if (bits == "384") return EVP_sha384();
  if (bits == "512") return EVP_sha512();
  throw std::invalid_argument("test_tokens: unknown algorithm " + std::string(alg));
}

std::string bn_param(EVP_PKEY* key, const char* name, std::size_t width = 0) {
  BIGNUM* bn = nullptr;
  check(EVP_PKEY_get_bn_param(key, name, &bn) == 1, name);
  std::size_t size = static_cast<std::size_t>(BN_num_bytes(bn));
  if (width > size) size = width;
  std::string bytes(size, '\0');
  check(BN_bn2binpad(bn, reinterpret_cast<unsigned char*>(bytes.data()), static_cast<int>(size)) > 0, "BN_bn2binpad");
  BN_free(bn);
  return b64url(bytes);
}

std::string curve_of(EVP_PKEY* key) {
  char name[64] = {};
  std::size_t len = 0;
  check(EVP_PKEY_get_utf8_string_param(key, OSSL_PKEY_PARAM_GROUP_NAME, name, sizeof name, &len) == 1, "group name");
  const std::string group(name, len);
  if (group == "prime256v1" || group == "P-256") return "P-256";
  if (group == "secp384r1" || group == "P-384") return "P-384";
  if (group == "secp521r1" || group == "P-521") return "P-521";
  return group;
}

std::size_t coordinate_size(const std::string& crv) { return crv == "P-256" ? 32 : crv == "P-384" ? 48 : 66; }

}  // namespace

std::string b64url(std::string_view bytes) {
  static constexpr char kMap[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
  std::string out;
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const unsigned v = (static_cast<unsigned char>(bytes[i]) << 16) | (static_cast<unsigned char>(bytes[i + 1]) << 8) |
                       static_cast<unsigned char>(bytes[i + 2]);
    out += kMap[(v >> 18) & 63];
    out += kMap[(v >> 12) & 63];
    out += kMap[(v >> 6) & 63];
    out += kMap[v & 63];
  }
  if (bytes.size() - i == 1) {
    const unsigned v = static_cast<unsigned char>(bytes[i]) << 16;
    out += kMap[(v >> 18) & 63];
    out += kMap[(v >> 12) & 63];
  } else if (bytes.size() - i == 2) {
    const unsigned v = (static_cast<unsigned char>(bytes[i]) << 16) | (static_cast<unsigned char>(bytes[i + 1]) << 8);
    out += kMap[(v >> 18) & 63];
    out += kMap[(v >> 12) & 63];
    out += kMap[(v >> 6) & 63];
  }
  return out;
}

TestKey TestKey::rsa(int bits) {
  EVP_PKEY* key = EVP_RSA_gen(static_cast<unsigned>(bits));
  check(key != nullptr, "EVP_RSA_gen");
  return TestKey(key);
}

TestKey TestKey::ec(std::string_view curve) {
  const char* group = curve == "P-256" ? "P-256" : curve == "P-384" ? "P-384" : "P-521";
  EVP_PKEY* key = EVP_EC_gen(group);
  check(key != nullptr, "EVP_EC_gen");
  return TestKey(key);
}

TestKey TestKey::ed25519() {
  EVP_PKEY* key = nullptr;
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_ED25519, nullptr);
  check(ctx != nullptr && EVP_PKEY_keygen_init(ctx) == 1 && EVP_PKEY_keygen(ctx, &key) == 1, "Ed25519 keygen");
  EVP_PKEY_CTX_free(ctx);
  return TestKey(key);
}

TestKey::~TestKey() { EVP_PKEY_free(pk(pkey_)); }

std::string TestKey::public_pem() const {
  BIO* bio = BIO_new(BIO_s_mem());
  check(PEM_write_bio_PUBKEY(bio, pk(pkey_)) == 1, "PEM_write_bio_PUBKEY");
  return bio_text(bio);
}

std::string TestKey::private_pem() const {
  BIO* bio = BIO_new(BIO_s_mem());
  check(PEM_write_bio_PrivateKey(bio, pk(pkey_), nullptr, nullptr, 0, nullptr, nullptr) == 1,
        "PEM_write_bio_PrivateKey");
  return bio_text(bio);
}

std::string TestKey::public_der() const {
  unsigned char* der = nullptr;
  const int n = i2d_PUBKEY(pk(pkey_), &der);
  check(n > 0, "i2d_PUBKEY");
  std::string out(reinterpret_cast<char*>(der), static_cast<std::size_t>(n));
  OPENSSL_free(der);
  return out;
}

std::string TestKey::public_jwk(std::optional<std::string> kid, std::optional<std::string> alg) const {
  std::string out;
  EVP_PKEY* key = pk(pkey_);
  if (EVP_PKEY_get_base_id(key) == EVP_PKEY_RSA) {
    out = R"({"kty":"RSA","n":")" + bn_param(key, OSSL_PKEY_PARAM_RSA_N) + R"(","e":")" +
          bn_param(key, OSSL_PKEY_PARAM_RSA_E) + "\"";
  } else if (EVP_PKEY_get_base_id(key) == EVP_PKEY_EC) {
    const std::string crv = curve_of(key);
    const std::size_t width = coordinate_size(crv);
    out = R"({"kty":"EC","crv":")" + crv + R"(","x":")" + bn_param(key, OSSL_PKEY_PARAM_EC_PUB_X, width) +
          R"(","y":")" + bn_param(key, OSSL_PKEY_PARAM_EC_PUB_Y, width) + "\"";
  } else {
    unsigned char raw[32];
    std::size_t len = sizeof raw;
    check(EVP_PKEY_get_raw_public_key(key, raw, &len) == 1, "raw public key");
    out = R"({"kty":"OKP","crv":"Ed25519","x":")" + b64url(std::string_view(reinterpret_cast<char*>(raw), len)) + "\"";
  }
  if (kid) out += R"(,"kid":")" + *kid + "\"";
  if (alg) out += R"(,"alg":")" + *alg + "\"";
  return out + "}";
}

std::string TestKey::private_jwk() const {
  std::string pub = public_jwk();
  pub.pop_back();
  EVP_PKEY* key = pk(pkey_);
  if (EVP_PKEY_get_base_id(key) == EVP_PKEY_RSA)
    return pub + R"(,"d":")" + bn_param(key, OSSL_PKEY_PARAM_RSA_D) + "\"}";
  return pub + R"(,"d":")" + bn_param(key, OSSL_PKEY_PARAM_PRIV_KEY, coordinate_size(curve_of(key))) + "\"}";
}

std::string TestKey::sign(std::string_view alg, std::string_view header_json, std::string_view payload_json) const {
  const std::string input = b64url(header_json) + "." + b64url(payload_json);
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_PKEY_CTX* pctx = nullptr;
  check(EVP_DigestSignInit(ctx, &pctx, digest_for(alg), nullptr, pk(pkey_)) == 1, "EVP_DigestSignInit");
  if (alg.starts_with("PS")) {
    // RFC 7518 §3.5: MGF1 with the same hash, a salt as long as the hash.
    check(EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PSS_PADDING) == 1, "PSS padding");
    check(EVP_PKEY_CTX_set_rsa_pss_saltlen(pctx, RSA_PSS_SALTLEN_DIGEST) == 1, "PSS salt");
  }
  std::size_t size = 0;
  check(EVP_DigestSign(ctx, nullptr, &size, reinterpret_cast<const unsigned char*>(input.data()), input.size()) == 1,
        "EVP_DigestSign size");
  std::string sig(size, '\0');
  check(EVP_DigestSign(ctx, reinterpret_cast<unsigned char*>(sig.data()), &size,
                       reinterpret_cast<const unsigned char*>(input.data()), input.size()) == 1,
        "EVP_DigestSign");
  sig.resize(size);
  EVP_MD_CTX_free(ctx);
  if (alg.starts_with("ES")) {
    // OpenSSL signs ECDSA as DER; JWS wants R || S, each as wide as the curve (RFC 7518 §3.4).
    const unsigned char* p = reinterpret_cast<const unsigned char*>(sig.data());
    ECDSA_SIG* ecdsa = d2i_ECDSA_SIG(nullptr, &p, static_cast<long>(sig.size()));
    check(ecdsa != nullptr, "d2i_ECDSA_SIG");
    const std::size_t width = coordinate_size(curve_of(pk(pkey_)));
    std::string raw(2 * width, '\0');
    BN_bn2binpad(ECDSA_SIG_get0_r(ecdsa), reinterpret_cast<unsigned char*>(raw.data()), static_cast<int>(width));
    BN_bn2binpad(ECDSA_SIG_get0_s(ecdsa), reinterpret_cast<unsigned char*>(raw.data() + width),
                 static_cast<int>(width));
    ECDSA_SIG_free(ecdsa);
    sig = raw;
  }
  return input + "." + b64url(sig);
}

std::string sign_hmac(std::string_view alg, std::string_view header_json, std::string_view payload_json,
                      std::string_view secret) {
  const std::string input = b64url(header_json) + "." + b64url(payload_json);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  check(HMAC(digest_for(alg), secret.data(), static_cast<int>(secret.size()),
             reinterpret_cast<const unsigned char*>(input.data()), input.size(), mac, &len) != nullptr,
        "HMAC");
  return input + "." + b64url(std::string_view(reinterpret_cast<char*>(mac), len));
}

std::string unsigned_token(std::string_view header_json, std::string_view payload_json) {
  return b64url(header_json) + "." + b64url(payload_json) + ".";
}

std::string jwk_set(std::initializer_list<std::string> jwks) {
  std::string out = R"({"keys":[)";
  bool first = true;
  for (const auto& j : jwks) {
    if (!first) out += ",";
    out += j;
    first = false;
  }
  return out + "]}";
}

void write_file(const std::string& path, std::string_view content) {
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(content.data(), static_cast<std::streamsize>(content.size()));
    if (!out) throw std::runtime_error("test_tokens: cannot write " + path);
  }
  ::chmod(path.c_str(), 0600);
}

}  // namespace idem::auth::test
