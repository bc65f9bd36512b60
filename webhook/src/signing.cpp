// HMAC keys keyed once, base64, and the Standard Webhooks v1 signature.
#include "idem/webhook/signing.hpp"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <array>
#include <cstdio>

#include "idem/webhook/secret_file.hpp"

namespace idem::webhook {
namespace {

constexpr std::string_view kWhsec = "whsec_";

int base64_value(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+' || c == '-') return 62;  // '-' and '_': the URL-safe alphabet reads the same
  if (c == '/' || c == '_') return 63;
  return -1;
}

using MacCtx = std::unique_ptr<EVP_MAC_CTX, decltype(&EVP_MAC_CTX_free)>;

}  // namespace

std::optional<std::string> decode_base64(std::string_view text) {
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  if (text.size() % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(text.size() * 3 / 4);
  std::uint32_t acc = 0;
  int bits = 0;
  for (const char c : text) {
    const int v = base64_value(c);
    if (v < 0) return std::nullopt;
    acc = (acc << 6) | static_cast<std::uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  return out;
}

std::string encode_base64(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve(4 * ((bytes.size() + 2) / 3));
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const std::uint32_t v = static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i])) << 16 |
                            static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8 |
                            static_cast<unsigned char>(bytes[i + 2]);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (const std::size_t left = bytes.size() - i; left > 0) {
    std::uint32_t v = static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i])) << 16;
    if (left == 2) v |= static_cast<std::uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += left == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

std::optional<std::string> standard_secret_key(std::string_view secret) {
  if (secret.substr(0, kWhsec.size()) == kWhsec) secret.remove_prefix(kWhsec.size());
  auto key = decode_base64(secret);
  if (!key || key->empty()) return std::nullopt;
  return key;
}

std::size_t mac_size(HmacAlgorithm algorithm) { return algorithm == HmacAlgorithm::sha512 ? 64 : 32; }

struct HmacKey::Ctx {
  MacCtx keyed{nullptr, &EVP_MAC_CTX_free};  // only ever copied (EVP_MAC_CTX_dup), never updated
};

HmacKey::HmacKey(std::unique_ptr<Ctx> ctx, HmacAlgorithm algorithm) : ctx_(std::move(ctx)), algorithm_(algorithm) {}
HmacKey::~HmacKey() = default;
HmacKey::HmacKey(HmacKey&&) noexcept = default;
HmacKey& HmacKey::operator=(HmacKey&&) noexcept = default;

std::optional<HmacKey> HmacKey::make(HmacAlgorithm algorithm, std::string_view key) {
  static EVP_MAC* const mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  if (mac == nullptr) return std::nullopt;
  auto ctx = std::make_unique<Ctx>();
  ctx->keyed.reset(EVP_MAC_CTX_new(mac));
  if (!ctx->keyed) return std::nullopt;
  char digest[16];
  std::snprintf(digest, sizeof digest, "%s", algorithm == HmacAlgorithm::sha512 ? "SHA512" : "SHA256");
  const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, digest, 0),
                               OSSL_PARAM_construct_end()};
  if (EVP_MAC_init(ctx->keyed.get(), reinterpret_cast<const unsigned char*>(key.data()), key.size(), params) != 1) {
    return std::nullopt;
  }
  return HmacKey(std::move(ctx), algorithm);
}

std::optional<HmacKey::Mac> HmacKey::mac(std::span<const std::string_view> pieces) const {
  // A copy of the keyed context: the key is shared by every thread and never changes.
  MacCtx ctx(EVP_MAC_CTX_dup(ctx_->keyed.get()), &EVP_MAC_CTX_free);
  if (!ctx) return std::nullopt;
  for (const auto piece : pieces) {
    if (EVP_MAC_update(ctx.get(), reinterpret_cast<const unsigned char*>(piece.data()), piece.size()) != 1) {
      return std::nullopt;
    }
  }
  static_assert(EVP_MAX_MD_SIZE >= 64);
  Mac out;
  if (EVP_MAC_final(ctx.get(), out.bytes.data(), &out.size, out.bytes.size()) != 1 || out.size != mac_size(algorithm_)) {
    return std::nullopt;
  }
  return out;
}

std::expected<StandardSigner, std::string> StandardSigner::from_secrets(std::span<const std::string> secrets) {
  if (secrets.empty()) return std::unexpected("no secret");
  StandardSigner signer;
  for (std::size_t i = 0; i < secrets.size(); ++i) {
    auto key = standard_secret_key(secrets[i]);
    if (!key) {
      return std::unexpected(std::string("secret #") + std::to_string(i + 1) +
                             " is not whsec_ and base64 (Standard Webhooks)");
    }
    auto hmac = HmacKey::make(HmacAlgorithm::sha256, *key);
    OPENSSL_cleanse(key->data(), key->size());
    if (!hmac) {
      return std::unexpected(std::string("secret #") + std::to_string(i + 1) +
                             ": OpenSSL could not key an HMAC with it");
    }
    signer.keys_.push_back(std::move(*hmac));
  }
  return signer;
}

std::expected<StandardSigner, std::string> StandardSigner::load(const std::vector<std::string>& files) {
  if (files.empty()) return std::unexpected("no secret file");
  auto secrets = read_secret_files(files);
  if (!secrets) return std::unexpected(secrets.error());
  auto signer = from_secrets(*secrets);
  wipe(*secrets);
  return signer;
}

std::string StandardSigner::signature(std::string_view id, std::int64_t timestamp, std::string_view body) const {
  const std::string ts = std::to_string(timestamp);
  const std::string_view payload[] = {id, ".", ts, ".", body};
  std::string out;
  for (const auto& key : keys_) {
    auto mac = key.mac(payload);
    // OpenSSL failing on a keyed context is not expected; an entry left out is one the receiver
    // cannot match, never a wrong one.
    if (!mac) continue;
    if (!out.empty()) out += ' ';
    out += "v1,";
    out += encode_base64(mac->view());
  }
  return out;
}

std::vector<std::pair<std::string, std::string>> StandardSigner::headers(std::string_view id, std::int64_t timestamp,
                                                                         std::string_view body) const {
  return {{"webhook-id", std::string(id)},
          {"webhook-timestamp", std::to_string(timestamp)},
          {"webhook-signature", signature(id, timestamp, body)}};
}

}  // namespace idem::webhook
