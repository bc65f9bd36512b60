#pragma once

// HMAC keys keyed once and Standard Webhooks signatures (https://www.standardwebhooks.com):
//
//   webhook-id:        the message's id
//   webhook-timestamp: Unix seconds
//   webhook-signature: v1,<base64 HMAC-SHA256 of "id.timestamp.body"> [v1,<...> ...]
//
// with a secret "whsec_" + base64 of the key bytes. A sender signs with every secret it has (one
// entry each, space-separated): during a rotation a receiver that knows either secret accepts.

#include <array>
#include <cstdint>
#include <expected>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace idem::webhook {

/// Base64 with or without padding, the standard or the URL-safe alphabet; nullopt if not base64.
std::optional<std::string> decode_base64(std::string_view text);
/// Standard base64 with padding.
std::string encode_base64(std::string_view bytes);

/// The key bytes of a Standard Webhooks secret: "whsec_" (which may be left out) and base64.
/// nullopt when the rest is not base64 or is empty.
std::optional<std::string> standard_secret_key(std::string_view secret);

enum class HmacAlgorithm : std::uint8_t { sha256, sha512 };

/// An HMAC keyed once (OpenSSL's EVP_MAC_CTX): each mac() copies the keyed context, so one key is
/// shared by any number of threads. The key's bytes live only inside OpenSSL, which wipes them
/// when it is freed.
class HmacKey {
 public:
  /// nullopt if OpenSSL refuses (no HMAC, no digest).
  static std::optional<HmacKey> make(HmacAlgorithm algorithm, std::string_view key);
  ~HmacKey();
  HmacKey(HmacKey&&) noexcept;
  HmacKey& operator=(HmacKey&&) noexcept;

  /// A MAC's bytes, held inline (verifying one costs no allocation).
  struct Mac {
    std::array<unsigned char, 64> bytes{};
    std::size_t size = 0;
    std::string_view view() const { return {reinterpret_cast<const char*>(bytes.data()), size}; }
  };
  /// The MAC of the pieces, concatenated; nullopt if OpenSSL fails.
  std::optional<Mac> mac(std::span<const std::string_view> pieces) const;
  HmacAlgorithm algorithm() const { return algorithm_; }

 private:
  struct Ctx;
  HmacKey(std::unique_ptr<Ctx> ctx, HmacAlgorithm algorithm);
  std::unique_ptr<Ctx> ctx_;
  HmacAlgorithm algorithm_;
};

/// Bytes of a MAC of this algorithm.
std::size_t mac_size(HmacAlgorithm algorithm);

/// Signs requests with every configured secret, Standard Webhooks v1. Immutable, thread-safe.
class StandardSigner {
 public:
  /// From the secrets as a file holds them ("whsec_<base64>"). The error names the secret by
  /// position ("secret #2"), never its text.
  static std::expected<StandardSigner, std::string> from_secrets(std::span<const std::string> secrets);
  /// From secret files (read_secret_files: one secret per line, permissions checked); the read
  /// secrets are wiped once keyed.
  static std::expected<StandardSigner, std::string> load(const std::vector<std::string>& files);

  /// The webhook-signature value for this message: "v1,<base64>" per secret, space-separated.
  std::string signature(std::string_view id, std::int64_t timestamp, std::string_view body) const;

  /// The three headers, in order: webhook-id, webhook-timestamp, webhook-signature.
  std::vector<std::pair<std::string, std::string>> headers(std::string_view id, std::int64_t timestamp,
                                                           std::string_view body) const;

  std::size_t secret_count() const { return keys_.size(); }

 private:
  std::vector<HmacKey> keys_;
};

}  // namespace idem::webhook
