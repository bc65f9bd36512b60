// Verifying one bearer token: the format and header checked here, the signature by libjose with
// a key chosen here (libjose 11's own check of the header's alg against a key's alg compares
// with strcmp(...) < 0, so it is never relied on), then the claims. Nothing of the token is
// trusted before its signature verified but what picks the key.
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/sha.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "idem/http_view.hpp"
#include "idem/jcs.hpp"
#include "idem/tenant.hpp"
#include "jose.hpp"
#include "token_cache.hpp"

namespace idem::auth {
namespace {

// NumericDates beyond this (year ~292 million) are clamped, so adding a leeway cannot overflow.
constexpr std::int64_t kMaxSeconds = std::numeric_limits<std::int64_t>::max() / 4000;

std::unexpected<TokenError> refuse(Refusal kind, std::string reason) {
  return std::unexpected(TokenError{kind, std::move(reason)});
}

std::unexpected<TokenError> invalid(std::string reason) { return refuse(Refusal::invalid, std::move(reason)); }

// Appended, not "\"" + std::string(s): GCC 12 at -O3 warns on that (a false -Wrestrict).
std::string quoted(std::string_view s) { return std::string(1, '"').append(s).append(1, '"'); }

// A value from the token, safe to put in a message: visible ASCII, at most 64 bytes.
std::string printable(std::string_view s) {
  std::string out;
  for (const char c : s.substr(0, 64)) out += (c >= 0x21 && c <= 0x7e && c != '"' && c != '\\') ? c : '?';
  if (s.size() > 64) out += "...";
  return out;
}

std::string list(const std::vector<Algorithm>& algorithms) {
  std::string out;
  for (const auto a : algorithms) out += (out.empty() ? "" : ", ") + std::string(to_string(a));
  return out;
}

bool is_base64url(std::string_view s) {
  // Length 1 mod 4 cannot come out of any byte string.
  if (s.empty() || s.size() % 4 == 1) return false;
  return std::all_of(s.begin(), s.end(), [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
  });
}

// base64url without padding (RFC 7515 §2), of a segment is_base64url accepted. Our own: libjose's
// decoder looks every character up in its alphabet string, a third of an HS256 verification.
std::string decode_base64url(std::string_view segment) {
  static constexpr auto kValues = [] {
    std::array<unsigned char, 256> v{};
    const std::string_view alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    for (std::size_t i = 0; i < alphabet.size(); ++i)
      v[static_cast<unsigned char>(alphabet[i])] = static_cast<unsigned char>(i);
    return v;
  }();
  std::string out;
  out.reserve(segment.size() * 3 / 4);
  std::uint32_t acc = 0;
  int bits = 0;
  for (const char c : segment) {
    acc = (acc << 6) | kValues[static_cast<unsigned char>(c)];
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += static_cast<char>((acc >> bits) & 0xff);
    }
  }
  return out;
}

// The JSON object a base64url segment holds, or null.
Json decode_object(std::string_view segment) { return parse_object(decode_base64url(segment)); }

// A NumericDate (RFC 7519 §2: seconds since the epoch, possibly fractional) in milliseconds.
std::optional<std::int64_t> numeric_date_ms(const json_t* v) {
  if (json_is_integer(v)) {
    const json_int_t s = std::clamp<json_int_t>(json_integer_value(v), -kMaxSeconds, kMaxSeconds);
    return static_cast<std::int64_t>(s) * 1000;
  }
  if (json_is_real(v)) {
    const double s = json_real_value(v);
    if (!std::isfinite(s)) return std::nullopt;
    const double clamped = std::clamp(s, -static_cast<double>(kMaxSeconds), static_cast<double>(kMaxSeconds));
    return static_cast<std::int64_t>(std::floor(clamped * 1000.0));
  }
  return std::nullopt;
}

bool string_equals(const json_t* v, const std::string& want) {
  return json_is_string(v) && json_string_length(v) == want.size() &&
         std::memcmp(json_string_value(v), want.data(), want.size()) == 0;
}

std::string seconds(std::int64_t ms) { return std::to_string((ms + 999) / 1000) + " s"; }

}  // namespace

TokenDigest digest_of(std::string_view token) {
  // Fetched once: SHA256() and EVP_sha256() look the algorithm up in OpenSSL 3's provider store
  // (a lock and a hash table) at every call, which would be most of a cache hit's cost.
  static EVP_MD* const sha256 = EVP_MD_fetch(nullptr, "SHA256", nullptr);
  TokenDigest d;
  unsigned int size = 0;
  if (sha256 == nullptr || EVP_Digest(token.data(), token.size(), d.data(), &size, sha256, nullptr) != 1 ||
      size != d.size()) {
    // Without a digest no token can be cached safely: fall back to OpenSSL's one-shot.
    SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), d.data());
  }
  return d;
}

struct JwtVerifier::Impl {
  Impl(std::shared_ptr<const KeySet> k, const Clock& c)
      : keys(std::move(k)), options(keys->options()), clock(&c), cfg(quiet_cfg()), cache(options.cache_size) {
    // Copies of their own: jansson values are safe to share read-only, but libjose's internals
    // are not documented to be, and a handful of keys per event loop costs nothing.
    for (const auto& key : keys->impl().keys) jwks.emplace_back(json_deep_copy(key.jwk.get()));
  }

  std::expected<Verified, TokenError> verify(std::string_view token);
  std::expected<std::string, TokenError> check(std::string_view token, std::int64_t now_ms, std::int64_t& expires_ms);

  std::shared_ptr<const KeySet> keys;
  const JwtOptions& options;
  const Clock* clock;
  Cfg cfg;
  std::vector<Jwk> jwks;  // parallel to keys->impl().keys
  TokenCache cache;
};

std::expected<Verified, TokenError> JwtVerifier::Impl::verify(std::string_view token) {
  if (token.size() > options.max_token_size) {
    return invalid("the token is longer than " + std::to_string(options.max_token_size) + " bytes");
  }
  const std::int64_t now_ms = to_epoch_ms(clock->now());
  const TokenDigest digest = digest_of(token);
  if (options.cache_size > 0) {
    const auto hit = cache.find(digest, now_ms);
    if (hit.tenant != nullptr) return Verified{*hit.tenant, true};
    if (hit.expired) {
      return refuse(Refusal::expired,
                    "the token expired (more than the leeway of " + seconds(options.leeway.count()) + " ago)");
    }
  }
  std::int64_t expires_ms = 0;
  auto tenant = check(token, now_ms, expires_ms);
  ERR_clear_error();  // OpenSSL's queue is per thread: leave nothing for the next user to misread
  if (!tenant) return std::unexpected(std::move(tenant.error()));
  if (options.cache_size > 0) cache.insert(digest, *tenant, expires_ms);
  return Verified{std::move(*tenant), false};
}

std::expected<std::string, TokenError> JwtVerifier::Impl::check(std::string_view token, std::int64_t now_ms,
                                                                std::int64_t& expires_ms) {
  // Compact serialization (RFC 7515 §7.1): header.payload.signature, each base64url.
  const auto dot1 = token.find('.');
  const auto dot2 = dot1 == std::string_view::npos ? dot1 : token.find('.', dot1 + 1);
  if (dot2 == std::string_view::npos || token.find('.', dot2 + 1) != std::string_view::npos) {
    return invalid("the token is not a compact JWS (three base64url parts separated by dots)");
  }
  const std::string_view protected_b64 = token.substr(0, dot1);
  const std::string_view payload_b64 = token.substr(dot1 + 1, dot2 - dot1 - 1);
  const std::string_view signature_b64 = token.substr(dot2 + 1);
  if (!is_base64url(protected_b64) || !is_base64url(payload_b64) || !is_base64url(signature_b64)) {
    return invalid("the token is not a compact JWS (three base64url parts separated by dots)");
  }

  const Json header = decode_object(protected_b64);
  if (!header) return invalid("the token's header is not a JSON object");
  const json_t* alg_node = json_object_get(header.get(), "alg");
  if (!json_is_string(alg_node)) return invalid("the token's header names no alg");
  const std::string_view alg_name(json_string_value(alg_node), json_string_length(alg_node));
  const auto alg = parse_algorithm(alg_name);
  if (iequals(alg_name, "none")) {
    return invalid("alg \"none\" (an unsigned token) is never accepted");
  }
  if (!alg || std::find(options.algorithms.begin(), options.algorithms.end(), *alg) == options.algorithms.end()) {
    return invalid("alg " + quoted(printable(alg_name)) + " is not in algorithms (" + list(options.algorithms) + ")");
  }
  // Extensions the token says must be understood (RFC 7515 §4.1.11), and unencoded payloads
  // (RFC 7797), are not: refusing is what the RFCs ask for.
  if (json_object_get(header.get(), "crit") != nullptr || json_object_get(header.get(), "b64") != nullptr) {
    return invalid("the token's header has critical extensions (crit, b64), which are not supported");
  }
  std::optional<std::string_view> kid;
  if (const json_t* k = json_object_get(header.get(), "kid")) {
    if (!json_is_string(k)) return invalid("the token's kid is not a string");
    kid.emplace(json_string_value(k), json_string_length(k));
  }

  // Keys that may verify it: of a type that signs with its alg (so an RSA public key is never
  // used as an HMAC secret) and, when both name a kid, the same kid. Keys without a kid (PEM
  // files, the secret) are candidates for every token.
  const auto& keyset = keys->impl().keys;
  std::vector<std::size_t> candidates;
  bool kid_known = false;
  for (std::size_t i = 0; i < keyset.size(); ++i) {
    const Key& key = keyset[i];
    if (kid && key.kid) {
      if (*key.kid != *kid) continue;
      kid_known = true;
    }
    if (std::find(key.algorithms.begin(), key.algorithms.end(), *alg) == key.algorithms.end()) continue;
    candidates.push_back(i);
  }
  if (candidates.empty()) {
    if (kid && !kid_known) return invalid("kid " + quoted(printable(*kid)) + " is not in the key set");
    if (kid)
      return invalid("the key with kid " + quoted(printable(*kid)) + " does not verify " + std::string(alg_name));
    return invalid("no key of the set verifies " + std::string(alg_name));
  }

  // libjose takes the flattened JSON serialization; only the protected header goes in, so no
  // unprotected member can change what it checks.
  const Json jws(json_pack("{s:s%,s:s%,s:s%}", "protected", protected_b64.data(), protected_b64.size(), "payload",
                           payload_b64.data(), payload_b64.size(), "signature", signature_b64.data(),
                           signature_b64.size()));
  if (!jws) return invalid("the token could not be prepared for verification");
  bool verified = false;
  for (const std::size_t i : candidates) {
    if (jose_jws_ver(cfg.get(), jws.get(), nullptr, jwks[i].get(), false)) {
      verified = true;
      break;
    }
  }
  if (!verified)
    return invalid("the signature does not verify with " + std::string(kid ? "the key" : "any key") + " of the set");

  // From here on the payload is the issuer's.
  const Json claims = decode_object(payload_b64);
  if (!claims) return invalid("the token's payload is not a JSON object");
  const json_t* exp = json_object_get(claims.get(), "exp");
  if (exp == nullptr) return invalid("the token has no exp claim (tokens that never expire are not accepted)");
  const auto exp_ms = numeric_date_ms(exp);
  if (!exp_ms) return invalid("the token's exp is not a number");
  const std::int64_t leeway_ms = options.leeway.count();
  if (now_ms > *exp_ms + leeway_ms) {
    return refuse(Refusal::expired,
                  "the token expired " + seconds(now_ms - *exp_ms) + " ago (leeway " + seconds(leeway_ms) + ")");
  }
  if (const json_t* nbf = json_object_get(claims.get(), "nbf")) {
    const auto nbf_ms = numeric_date_ms(nbf);
    if (!nbf_ms) return invalid("the token's nbf is not a number");
    if (now_ms + leeway_ms < *nbf_ms) {
      return invalid("the token is not valid for another " + seconds(*nbf_ms - now_ms) + " (nbf; leeway " +
                     seconds(leeway_ms) + ")");
    }
  }
  if (options.issuer && !string_equals(json_object_get(claims.get(), "iss"), *options.issuer)) {
    return invalid("the token's iss is not the configured issuer");
  }
  if (options.audience) {
    const json_t* aud = json_object_get(claims.get(), "aud");
    bool found = string_equals(aud, *options.audience);
    if (json_is_array(aud)) {
      std::size_t i = 0;
      const json_t* v = nullptr;
      json_array_foreach(aud, i, v) found = found || string_equals(v, *options.audience);
    }
    if (!found) return invalid("the token's aud does not contain the configured audience");
  }

  // The tenant: the configured claims as one JSON object in RFC 8785 form, hashed.
  const Json scope(json_object());
  if (!scope) return invalid("out of memory");
  for (const auto& name : options.claims) {
    json_t* v = json_object_get(claims.get(), name.c_str());
    if (v == nullptr || json_is_null(v)) return invalid("the token has no " + quoted(name) + " claim");
    if (json_is_string(v) && json_string_length(v) == 0)
      return invalid("the token's " + quoted(name) + " claim is empty");
    json_object_set(scope.get(), name.c_str(), v);
  }
  char* text = json_dumps(scope.get(), JSON_COMPACT | JSON_SORT_KEYS);
  if (text == nullptr) return invalid("the tenant claims could not be serialized");
  auto canonical = canonicalize_json(text);
  std::free(text);
  if (!canonical) return invalid("the tenant claims are not canonical JSON: " + canonical.error().message);
  expires_ms = *exp_ms + leeway_ms;
  return claims_tenant(*canonical);
}

JwtVerifier::JwtVerifier(std::shared_ptr<const KeySet> keys, const Clock& clock)
    : impl_(std::make_unique<Impl>(std::move(keys), clock)) {}
JwtVerifier::~JwtVerifier() = default;
JwtVerifier::JwtVerifier(JwtVerifier&&) noexcept = default;
JwtVerifier& JwtVerifier::operator=(JwtVerifier&&) noexcept = default;

std::expected<Verified, TokenError> JwtVerifier::verify(std::string_view token) { return impl_->verify(token); }

std::expected<Verified, TokenError> JwtVerifier::verify_authorization(std::string_view value) {
  if (value.empty()) return refuse(Refusal::missing, "no Authorization header");
  // credentials = auth-scheme [ 1*SP token68 ] (RFC 9110 §11.4); the scheme is case-insensitive.
  constexpr std::string_view kScheme = "bearer";
  const auto space = value.find(' ');
  const std::string_view scheme = value.substr(0, space);
  bool bearer = scheme.size() == kScheme.size();
  for (std::size_t i = 0; bearer && i < scheme.size(); ++i) {
    bearer = static_cast<char>(std::tolower(static_cast<unsigned char>(scheme[i]))) == kScheme[i];
  }
  if (!bearer) return refuse(Refusal::missing, "the Authorization header does not hold a Bearer token");
  std::string_view token = space == std::string_view::npos ? std::string_view() : value.substr(space);
  while (!token.empty() && token.front() == ' ') token.remove_prefix(1);
  while (!token.empty() && (token.back() == ' ' || token.back() == '\t')) token.remove_suffix(1);
  if (token.empty()) return invalid("the bearer token is empty");
  return impl_->verify(token);
}

std::size_t JwtVerifier::cached() const { return impl_->cache.size(); }

}  // namespace idem::auth
