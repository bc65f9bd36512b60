#pragma once

// Webhook routes: a provider's event is verified (its signature over the exact body bytes, its
// timestamp) before anything else happens to it, and its idempotency key is taken from where the
// provider puts the event's id. No Boost, no OpenSSL in this header (docs/webhooks.md).

#include <chrono>
#include <cstdint>
#include <expected>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "idem/http_view.hpp"

namespace idem::gateway {

/// Which provider's conventions a webhook route follows.
enum class WebhookProfile : std::uint8_t {
  stripe,    ///< Stripe-Signature: t=...,v1=<hex HMAC-SHA256 of "t.body">; key: the body's "id"
  standard,  ///< Standard Webhooks: webhook-id / webhook-timestamp / webhook-signature "v1,<base64>"
  github,    ///< X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>; key: X-GitHub-Delivery
  custom,    ///< described by a WebhookTemplate
};

/// "stripe", "standard", "github", "custom": the config value and the Idem-Webhook-Verified header.
std::string_view to_string(WebhookProfile profile);

/// A `custom` profile: where the key, the signature and the timestamp are, and what is signed.
struct WebhookTemplate {
  std::string key_header;   ///< the key is this header's value; or
  std::string key_pointer;  ///< a JSON Pointer (RFC 6901) to a string or integer in the body
  std::string signature_header;
  /// What the MAC covers: literal text with {timestamp}, {key} and {body} (the raw body bytes).
  std::string signed_payload = "{body}";
  enum class Algorithm : std::uint8_t { hmac_sha256, hmac_sha512 };
  Algorithm algorithm = Algorithm::hmac_sha256;
  enum class Encoding : std::uint8_t { hex, base64 };
  Encoding encoding = Encoding::hex;
  std::string prefix;            ///< before the signature in the header, e.g. "sha256="
  std::string timestamp_header;  ///< empty: the provider sends no timestamp (none is checked)
};

/// A route's `webhook` table as configured: the profile, its secret files and its options.
struct WebhookSettings {
  WebhookProfile profile = WebhookProfile::standard;
  /// Files of secrets, one per line (blank lines skipped); every secret of every file verifies.
  std::vector<std::string> secret_files;
  /// Timestamps further than this from the gateway's clock, either way, are refused.
  std::chrono::seconds tolerance{300};
  WebhookTemplate custom;  ///< profile = custom only
};

/// Why a webhook request was refused: the problem's code, the metric's `reason` label.
enum class WebhookRefusal : std::uint8_t {
  signature_missing,            ///< no signature (or timestamp) header
  signature_invalid,            ///< no configured secret made it, or it cannot be read
  timestamp_outside_tolerance,  ///< genuine but older or newer than the tolerance
  webhook_id_missing,           ///< genuine but without the event id the key comes from
  count_
};

/// "signature_missing", ... (problem codes, metric labels).
std::string_view to_string(WebhookRefusal refusal);

/// A refusal and a sentence saying which check failed: never a secret, never a signature.
struct WebhookError {
  WebhookRefusal reason = WebhookRefusal::signature_invalid;
  std::string detail;
};

/// Verifies one route's webhook requests with the secrets read when it was loaded. Immutable:
/// shared by every event loop; a reload (SIGHUP) loads a new one.
class WebhookVerifier {
 public:
  /// Reads the secret files: each a regular file that other users can neither read nor write
  /// (nor its group write), with at least one secret; `standard` secrets must be whsec_<base64>.
  /// The error names the file and what is wrong with it, never a secret.
  static std::expected<std::shared_ptr<const WebhookVerifier>, std::string> load(const WebhookSettings& settings);

  /// For tests: a verifier with these secrets as the files would hold them.
  static std::expected<std::shared_ptr<const WebhookVerifier>, std::string> from_secrets(
      const WebhookSettings& settings, const std::vector<std::string>& secrets);

  ~WebhookVerifier();
  WebhookVerifier(const WebhookVerifier&) = delete;
  WebhookVerifier& operator=(const WebhookVerifier&) = delete;

  /// The event's idempotency key if the request is genuine and timely, else why not. `body` is
  /// the request body exactly as received; `now` the gateway's clock (Unix seconds).
  std::expected<std::string, WebhookError> verify(std::span<const HeaderView> headers, std::string_view body,
                                                  std::int64_t now) const;

  WebhookProfile profile() const { return settings_.profile; }
  /// How many secrets were loaded (for the start-up and reload lines; never the secrets).
  std::size_t secret_count() const;

 private:
  explicit WebhookVerifier(WebhookSettings settings);
  std::expected<std::string, WebhookError> verify_stripe(std::span<const HeaderView> headers, std::string_view body,
                                                         std::int64_t now) const;
  std::expected<std::string, WebhookError> verify_standard(std::span<const HeaderView> headers,
                                                           std::string_view body, std::int64_t now) const;
  std::expected<std::string, WebhookError> verify_github(std::span<const HeaderView> headers,
                                                         std::string_view body) const;
  std::expected<std::string, WebhookError> verify_custom(std::span<const HeaderView> headers,
                                                         std::string_view body, std::int64_t now) const;
  // Whether one of `candidates` (decoded MACs) equals the MAC of `payload` under some secret.
  bool any_matches(std::span<const std::string> candidates, std::span<const std::string_view> payload,
                   WebhookTemplate::Algorithm algorithm) const;

  WebhookSettings settings_;
  // One HMAC key per secret, keyed once at load (webhook::HmacKey, private to the .cpp): each
  // verification copies it instead of fetching the digest and keying again. The secrets' bytes
  // live only inside them, and OpenSSL wipes them when they are freed.
  struct Macs;
  std::unique_ptr<Macs> macs_;
  std::vector<std::string> pointer_tokens_;  // custom.key_pointer, split and unescaped
};

/// What makes a route a webhook endpoint: its verifier (with the secrets) and the tenant its
/// events' keys are scoped to.
struct WebhookRoute {
  std::shared_ptr<const WebhookVerifier> verifier;  ///< never null
  /// `webhook.tenant`; by default "webhook " and the route's path (a space: no HTTP tenant has
  /// one, so a client's X-Tenant-Id can never name it).
  std::string tenant;
};

/// Splits an RFC 6901 JSON Pointer into its unescaped tokens; an error for one not starting
/// with "/" or with a "~" not followed by 0 or 1.
std::expected<std::vector<std::string>, std::string> split_json_pointer(std::string_view pointer);

}  // namespace idem::gateway
