#pragma once

// Bearer tokens (JWT, RFC 7519, signed as JWS, RFC 7515) verified, and their claims made a tenant
// (docs/gateway.md, `[tenant] from = "jwt"`). libjose, jansson and OpenSSL stay in this module's
// sources: nothing here names their types.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.hpp"

namespace idem::auth {

/// A JWS signature algorithm (RFC 7518 §3). "none" is deliberately not one: an unsigned token is
/// never accepted.
enum class Algorithm : std::uint8_t {
  RS256,
  RS384,
  RS512,
  PS256,
  PS384,
  PS512,
  ES256,
  ES384,
  ES512,
  HS256,
  HS384,
  HS512
};

/// The JOSE name of an algorithm: "RS256", ...
std::string_view to_string(Algorithm algorithm);

/// The algorithm a JOSE header names (case-sensitive, RFC 7515 §4.1.1); nullopt for "none" and
/// anything unknown.
std::optional<Algorithm> parse_algorithm(std::string_view name);

/// Whether an algorithm is an HMAC over a shared secret (HS*) rather than a public-key signature.
bool is_symmetric(Algorithm algorithm);

/// How bearer tokens are verified and which of their claims make the tenant. The names are
/// those of the `[tenant]` table (docs/gateway.md).
struct JwtOptions {
  /// Claims whose values together are the tenant (`claims`); every token must carry each.
  std::vector<std::string> claims = {"sub"};
  /// JWK Set or PEM files of public keys (`keys`). Exactly one of key_files and secret_file.
  std::vector<std::string> key_files;
  /// A file holding the HMAC secret (`secret_file`), for HS256, HS384, HS512.
  std::string secret_file;
  /// The allow-list (`algorithms`). Empty: RS256 and ES256 with key_files, HS256 with secret_file.
  std::vector<Algorithm> algorithms;
  /// When set (`audience`), a token's `aud` must be it or an array containing it.
  std::optional<std::string> audience;
  /// When set (`issuer`), a token's `iss` must equal it.
  std::optional<std::string> issuer;
  /// Clock skew allowed when checking `exp` and `nbf` (`leeway`).
  Millis leeway = std::chrono::seconds(60);
  /// Verified tokens each verifier (one per event loop) remembers until their `exp`
  /// (`cache_size`); 0 verifies every request.
  std::size_t cache_size = 10000;
  /// Tokens longer than this are refused unread.
  std::size_t max_token_size = 16 * 1024;
};

/// The keys tokens are checked with, and the options they were loaded for: loaded once (start-up,
/// a reload) and shared read-only by every verifier. Thread-safe to share.
class KeySet {
 public:
  /// Reads `options`' key files (JWK Sets or PEM public keys: several keys, e.g. an old and a new
  /// one during a rotation) or its secret file, and checks the options. Keys that are well formed
  /// but of no use here (another key type, `use: enc`, an algorithm not allowed, RSA below 2048
  /// bits) are skipped with a line in `warnings`; a file that cannot be read or parsed, a
  /// malformed key, a private key in a PEM file, or no usable key at all is the error. Messages
  /// are one line and name files, key positions and kids, never key material.
  static std::expected<std::shared_ptr<const KeySet>, std::string> load(JwtOptions options,
                                                                        std::vector<std::string>* warnings = nullptr);
  ~KeySet();
  KeySet(const KeySet&) = delete;
  KeySet& operator=(const KeySet&) = delete;

  /// The options, `algorithms` filled in with the defaults when it was empty.
  const JwtOptions& options() const;
  /// How many keys can verify tokens.
  std::size_t size() const;

  struct Impl;
  /// The loaded keys; for JwtVerifier.
  const Impl& impl() const { return *impl_; }

 private:
  explicit KeySet(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Why a request's token was refused: the code of its 401 (docs/gateway.md).
enum class Refusal : std::uint8_t {
  missing,  ///< token_missing: no Authorization header, or not a Bearer credential
  invalid,  ///< token_invalid: malformed, forged, a disallowed algorithm, an unknown kid, wrong aud/iss, not yet valid,
            ///< a claim missing
  expired,  ///< token_expired: authentic, but `exp` is past by more than the leeway
};

/// A refused token: what kind, and one line saying why, for the problem's detail and the log.
/// The line never holds the token, key material or claim values.
struct TokenError {
  Refusal refusal = Refusal::invalid;  ///< which 401
  std::string reason;                  ///< e.g. "kid \"k2\" is not in the key set"
};

/// A verified token's tenant: "jwt:" + hex SHA-256 of the RFC 8785 form of its tenant claims
/// (idem::claims_tenant).
struct Verified {
  std::string tenant;  ///< "jwt:<hex>"
  bool cached = false;  ///< found in the cache: no signature was checked
};

/// Verifies bearer tokens against one KeySet and remembers verified ones (bounded, least
/// recently used out first, each until its `exp` plus the leeway), so a client sending the same
/// token again costs a hash lookup instead of a signature check. Not thread-safe: one per event
/// loop. A reloaded KeySet takes a new verifier (and so an empty cache).
class JwtVerifier {
 public:
  /// `clock` must outlive the verifier.
  explicit JwtVerifier(std::shared_ptr<const KeySet> keys, const Clock& clock = SystemClock::instance());
  ~JwtVerifier();
  JwtVerifier(JwtVerifier&&) noexcept;
  JwtVerifier& operator=(JwtVerifier&&) noexcept;

  /// The tenant of a request whose Authorization header is `header_value` ("" when absent):
  /// "Bearer" (any case), spaces, then the token.
  std::expected<Verified, TokenError> verify_authorization(std::string_view header_value);

  /// The tenant of a compact JWS token: signature by a key of the set (by `kid` when the token
  /// names one) with an allowed algorithm matching the key's type, then `exp` and `nbf` with the
  /// leeway, `aud` and `iss` when configured, and the tenant claims.
  std::expected<Verified, TokenError> verify(std::string_view token);

  /// Tokens in the cache now (expired ones included until they are looked up or pushed out).
  std::size_t cached() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::auth
