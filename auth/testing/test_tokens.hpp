#pragma once

// Tokens for idem::auth's tests and benchmark, signed with OpenSSL directly: a test must not use
// the library it checks (libjose) to make what that library then verifies.

#include <optional>
#include <string>
#include <string_view>

namespace idem::auth::test {

/// A key pair made for a test (OpenSSL's EVP_PKEY, kept opaque).
class TestKey {
 public:
  /// A fresh RSA key of `bits` bits.
  static TestKey rsa(int bits = 2048);
  /// A fresh EC key on "P-256", "P-384" or "P-521".
  static TestKey ec(std::string_view curve = "P-256");
  /// A fresh Ed25519 key (a key type the verifier does not support).
  static TestKey ed25519();
  ~TestKey();
  TestKey(TestKey&& other) noexcept : pkey_(other.pkey_) { other.pkey_ = nullptr; }
  TestKey& operator=(TestKey&&) = delete;
  TestKey(const TestKey&) = delete;

  /// The public key as PEM ("-----BEGIN PUBLIC KEY-----").
  std::string public_pem() const;
  /// The private key as PEM (PKCS#8).
  std::string private_pem() const;
  /// The public key as a JWK (JSON text), with "kid" and "alg" when given.
  std::string public_jwk(std::optional<std::string> kid = {}, std::optional<std::string> alg = {}) const;
  /// The public key as a JWK with its private members too (what must never be in a key file).
  std::string private_jwk() const;
  /// The DER of the public key (SubjectPublicKeyInfo): what an attacker would use as an HMAC
  /// secret in the key-confusion attack, together with public_pem().
  std::string public_der() const;

  /// header.payload.signature: `header_json` and `payload_json` base64url-encoded, signed with
  /// `alg` (RS*, PS*, ES*) whatever the header says.
  std::string sign(std::string_view alg, std::string_view header_json, std::string_view payload_json) const;

 private:
  explicit TestKey(void* pkey) : pkey_(pkey) {}
  void* pkey_;  // EVP_PKEY*
};

/// base64url without padding (RFC 7515 §2).
std::string b64url(std::string_view bytes);

/// header.payload.signature signed with HMAC (`alg` HS256, HS384 or HS512) and `secret`.
std::string sign_hmac(std::string_view alg, std::string_view header_json, std::string_view payload_json,
                      std::string_view secret);

/// header.payload. with an empty signature (alg "none").
std::string unsigned_token(std::string_view header_json, std::string_view payload_json);

/// {"keys": [jwk, ...]}.
std::string jwk_set(std::initializer_list<std::string> jwks);

/// Writes `content` to `path` (mode 0600); throws on failure.
void write_file(const std::string& path, std::string_view content);

}  // namespace idem::auth::test
