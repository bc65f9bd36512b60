// Webhook verification: each profile reads its headers, computes the MAC of exactly what the
// provider signed (the raw body bytes, never a re-serialisation) with every configured secret,
// compares in constant time, then checks the timestamp and finds the event's key.
#include "idem/gateway/webhook.hpp"

#include <openssl/crypto.h>

#include <nlohmann/json.hpp>

#include <optional>

#include "idem/webhook/secret_file.hpp"
#include "idem/webhook/signing.hpp"

namespace idem::gateway {
namespace {

// A signature header longer than this is refused unread: no provider sends one, and each
// candidate costs a MAC per secret.
constexpr std::size_t kMaxSignatureHeader = 4096;
// At most this many signatures of one header are tried (Stripe and Standard Webhooks send one
// per secret the sender signs with: one or two during a rotation).
constexpr std::size_t kMaxCandidates = 16;

using Algorithm = WebhookTemplate::Algorithm;
using webhook::decode_base64;

webhook::HmacAlgorithm hmac_algorithm(Algorithm algorithm) {
  return algorithm == Algorithm::hmac_sha512 ? webhook::HmacAlgorithm::sha512 : webhook::HmacAlgorithm::sha256;
}

std::size_t mac_size(Algorithm algorithm) { return webhook::mac_size(hmac_algorithm(algorithm)); }

std::unexpected<WebhookError> refuse(WebhookRefusal reason, std::string detail) {
  return std::unexpected(WebhookError{reason, std::move(detail)});
}

// The value of a header sent exactly once; nullopt when absent; `twice` set when sent again
// (two values would let a proxy and the gateway read different ones).
std::optional<std::string_view> single_header(std::span<const HeaderView> headers, std::string_view name,
                                              bool& twice) {
  std::optional<std::string_view> found;
  twice = false;
  for (const auto& h : headers) {
    if (!iequals(h.name, name)) continue;
    if (found) twice = true;
    found = h.value;
  }
  return found;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

std::optional<std::string> decode_hex(std::string_view text) {
  if (text.size() % 2 != 0) return std::nullopt;
  std::string out(text.size() / 2, '\0');
  for (std::size_t i = 0; i < out.size(); ++i) {
    const int hi = hex_value(text[2 * i]);
    const int lo = hex_value(text[2 * i + 1]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out[i] = static_cast<char>(hi * 16 + lo);
  }
  return out;
}

std::optional<std::int64_t> parse_timestamp(std::string_view text) {
  text = trim(text);
  if (text.empty() || text.size() > 12) return std::nullopt;
  std::int64_t v = 0;
  for (const char c : text) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

std::optional<WebhookError> check_timestamp(std::int64_t t, std::int64_t now, std::chrono::seconds tolerance) {
  const std::int64_t skew = now - t;
  if (skew > tolerance.count()) {
    return WebhookError{WebhookRefusal::timestamp_outside_tolerance,
                        "the signature's timestamp is " + std::to_string(skew) + " s old (tolerance " +
                            std::to_string(tolerance.count()) + " s)"};
  }
  if (-skew > tolerance.count()) {
    return WebhookError{WebhookRefusal::timestamp_outside_tolerance,
                        "the signature's timestamp is " + std::to_string(-skew) + " s in the future (tolerance " +
                            std::to_string(tolerance.count()) + " s)"};
  }
  return std::nullopt;
}

// A JSON value at the pointer's tokens: a string, or an integer written as its digits.
std::optional<std::string> key_at(const nlohmann::json& doc, std::span<const std::string> tokens) {
  const nlohmann::json* at = &doc;
  for (const auto& token : tokens) {
    if (at->is_object()) {
      auto it = at->find(token);
      if (it == at->end()) return std::nullopt;
      at = &*it;
    } else if (at->is_array()) {
      if (token.empty() || token.size() > 9 || (token.size() > 1 && token[0] == '0')) return std::nullopt;
      std::size_t index = 0;
      for (const char c : token) {
        if (c < '0' || c > '9') return std::nullopt;
        index = index * 10 + static_cast<std::size_t>(c - '0');
      }
      if (index >= at->size()) return std::nullopt;
      at = &(*at)[index];
    } else {
      return std::nullopt;
    }
  }
  if (at->is_string()) return at->get<std::string>();
  if (at->is_number_integer()) return at->dump();
  return std::nullopt;
}

std::optional<std::string> key_in_body(std::string_view body, std::span<const std::string> tokens) {
  const auto doc = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return std::nullopt;
  auto key = key_at(doc, tokens);
  if (key && key->empty()) return std::nullopt;
  return key;
}

}  // namespace

struct WebhookVerifier::Macs {
  std::vector<webhook::HmacKey> keyed;  // one per secret, keyed at load
};

std::size_t WebhookVerifier::secret_count() const { return macs_->keyed.size(); }

std::string_view to_string(WebhookProfile profile) {
  switch (profile) {
    case WebhookProfile::stripe: return "stripe";
    case WebhookProfile::standard: return "standard";
    case WebhookProfile::github: return "github";
    case WebhookProfile::custom: return "custom";
  }
  return "?";
}

std::string_view to_string(WebhookRefusal refusal) {
  switch (refusal) {
    case WebhookRefusal::signature_missing: return "signature_missing";
    case WebhookRefusal::signature_invalid: return "signature_invalid";
    case WebhookRefusal::timestamp_outside_tolerance: return "timestamp_outside_tolerance";
    case WebhookRefusal::webhook_id_missing: return "webhook_id_missing";
    case WebhookRefusal::count_: break;
  }
  return "?";
}

std::expected<std::vector<std::string>, std::string> split_json_pointer(std::string_view pointer) {
  if (pointer.empty() || pointer[0] != '/') return std::unexpected("a JSON Pointer starts with \"/\"");
  std::vector<std::string> tokens;
  std::string token;
  for (std::size_t i = 1; i <= pointer.size(); ++i) {
    if (i == pointer.size() || pointer[i] == '/') {
      tokens.push_back(std::move(token));
      token.clear();
    } else if (pointer[i] == '~') {
      if (i + 1 >= pointer.size() || (pointer[i + 1] != '0' && pointer[i + 1] != '1')) {
        return std::unexpected("\"~\" must be followed by 0 or 1 in a JSON Pointer");
      }
      token += pointer[i + 1] == '0' ? '~' : '/';
      ++i;
    } else {
      token += pointer[i];
    }
  }
  return tokens;
}

WebhookVerifier::WebhookVerifier(WebhookSettings settings)
    : settings_(std::move(settings)), macs_(std::make_unique<Macs>()) {}

WebhookVerifier::~WebhookVerifier() = default;

std::expected<std::shared_ptr<const WebhookVerifier>, std::string> WebhookVerifier::load(
    const WebhookSettings& settings) {
  if (settings.secret_files.empty()) return std::unexpected("no secret file (secret_file = \"...\")");
  auto secrets = webhook::read_secret_files(settings.secret_files);
  if (!secrets) return std::unexpected(secrets.error());
  auto verifier = from_secrets(settings, *secrets);
  webhook::wipe(*secrets);
  return verifier;
}

std::expected<std::shared_ptr<const WebhookVerifier>, std::string> WebhookVerifier::from_secrets(
    const WebhookSettings& settings, const std::vector<std::string>& secrets) {
  std::shared_ptr<WebhookVerifier> v(new WebhookVerifier(settings));
  if (secrets.empty()) return std::unexpected("no secret");
  const Algorithm algorithm =
      settings.profile == WebhookProfile::custom ? settings.custom.algorithm : Algorithm::hmac_sha256;
  for (std::size_t i = 0; i < secrets.size(); ++i) {
    std::string_view s = secrets[i];
    std::optional<std::string> decoded;
    if (settings.profile == WebhookProfile::standard) {
      // Standard Webhooks secrets are whsec_ and the base64 of the key bytes; the MAC key is those bytes.
      decoded = webhook::standard_secret_key(s);
      if (!decoded) {
        return std::unexpected("secret #" + std::to_string(i + 1) + " is not whsec_ and base64 (Standard Webhooks)");
      }
      s = *decoded;
    }
    // Stripe's whsec_... and GitHub's secrets are the MAC key as written.
    auto key = webhook::HmacKey::make(hmac_algorithm(algorithm), s);
    if (decoded) OPENSSL_cleanse(decoded->data(), decoded->size());
    if (!key) return std::unexpected("secret #" + std::to_string(i + 1) + ": OpenSSL could not key an HMAC with it");
    v->macs_->keyed.push_back(std::move(*key));
  }
  if (settings.profile == WebhookProfile::custom && !settings.custom.key_pointer.empty()) {
    auto tokens = split_json_pointer(settings.custom.key_pointer);
    if (!tokens) return std::unexpected("key_pointer: " + tokens.error());
    v->pointer_tokens_ = std::move(*tokens);
  }
  if (settings.profile == WebhookProfile::stripe) v->pointer_tokens_ = {"id"};
  return std::shared_ptr<const WebhookVerifier>(std::move(v));
}

bool WebhookVerifier::any_matches(std::span<const std::string> candidates, std::span<const std::string_view> payload,
                                  Algorithm algorithm) const {
  bool matched = false;
  const std::size_t size = mac_size(algorithm);
  // Every secret is tried even after a match: how long verification takes says nothing about
  // which secret (or which candidate) matched.
  for (const auto& keyed : macs_->keyed) {
    const auto mac = keyed.mac(payload);
    if (!mac || mac->size != size) continue;
    for (const auto& candidate : candidates) {
      if (candidate.size() == mac->size && CRYPTO_memcmp(candidate.data(), mac->bytes.data(), mac->size) == 0) {
        matched = true;
      }
    }
  }
  return matched;
}

std::expected<std::string, WebhookError> WebhookVerifier::verify(std::span<const HeaderView> headers,
                                                                 std::string_view body, std::int64_t now) const {
  switch (settings_.profile) {
    case WebhookProfile::stripe: return verify_stripe(headers, body, now);
    case WebhookProfile::standard: return verify_standard(headers, body, now);
    case WebhookProfile::github: return verify_github(headers, body);
    case WebhookProfile::custom: return verify_custom(headers, body, now);
  }
  return refuse(WebhookRefusal::signature_invalid, "unknown profile");
}

// Stripe-Signature: t=1492774577,v1=5257a869...,v1=...,v0=... (v0 is a test-mode scheme Stripe
// no longer signs with; only v1, HMAC-SHA256 of "t.body", counts).
std::expected<std::string, WebhookError> WebhookVerifier::verify_stripe(std::span<const HeaderView> headers,
                                                                        std::string_view body,
                                                                        std::int64_t now) const {
  bool twice = false;
  const auto header = single_header(headers, "Stripe-Signature", twice);
  if (!header) return refuse(WebhookRefusal::signature_missing, "no Stripe-Signature header");
  if (twice) return refuse(WebhookRefusal::signature_invalid, "Stripe-Signature sent more than once");
  if (header->size() > kMaxSignatureHeader) {
    return refuse(WebhookRefusal::signature_invalid, "Stripe-Signature is longer than 4096 bytes");
  }
  std::optional<std::string_view> t;
  std::vector<std::string> candidates;
  bool other_schemes = false;
  std::string_view rest = *header;
  while (!rest.empty()) {
    const std::size_t comma = rest.find(',');
    const std::string_view item = trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    const std::size_t eq = item.find('=');
    if (eq == std::string_view::npos) continue;
    const std::string_view name = item.substr(0, eq), value = item.substr(eq + 1);
    if (name == "t") {
      t = value;
    } else if (name == "v1") {
      if (candidates.size() >= kMaxCandidates) continue;
      if (auto mac = decode_hex(value)) candidates.push_back(std::move(*mac));
    } else {
      other_schemes = true;
    }
  }
  if (!t) return refuse(WebhookRefusal::signature_invalid, "Stripe-Signature has no timestamp (t=)");
  const auto ts = parse_timestamp(*t);
  if (!ts) return refuse(WebhookRefusal::signature_invalid, "Stripe-Signature's timestamp (t=) is not a number");
  if (candidates.empty()) {
    return refuse(WebhookRefusal::signature_invalid,
                  other_schemes ? "Stripe-Signature has no v1 signature (only the v1 scheme is accepted)"
                                : "Stripe-Signature has no v1 signature");
  }
  const std::string_view payload[] = {*t, ".", body};
  if (!any_matches(candidates, payload, Algorithm::hmac_sha256)) {
    return refuse(WebhookRefusal::signature_invalid, "no v1 signature matches a configured secret");
  }
  if (auto late = check_timestamp(*ts, now, settings_.tolerance)) return std::unexpected(std::move(*late));
  auto key = key_in_body(body, pointer_tokens_);
  if (!key) return refuse(WebhookRefusal::webhook_id_missing, "the event (a JSON object) has no \"id\" string");
  return std::move(*key);
}

// webhook-id, webhook-timestamp, webhook-signature: "v1,<base64>" entries separated by spaces,
// HMAC-SHA256 of "id.timestamp.body" (standardwebhooks.com). v1a (Ed25519) is not accepted.
std::expected<std::string, WebhookError> WebhookVerifier::verify_standard(std::span<const HeaderView> headers,
                                                                          std::string_view body,
                                                                          std::int64_t now) const {
  bool twice_sig = false, twice_id = false, twice_ts = false;
  const auto signature = single_header(headers, "webhook-signature", twice_sig);
  const auto id = single_header(headers, "webhook-id", twice_id);
  const auto timestamp = single_header(headers, "webhook-timestamp", twice_ts);
  if (!signature) return refuse(WebhookRefusal::signature_missing, "no webhook-signature header");
  if (!timestamp) return refuse(WebhookRefusal::signature_missing, "no webhook-timestamp header");
  if (!id || trim(*id).empty()) return refuse(WebhookRefusal::webhook_id_missing, "no webhook-id header");
  if (twice_sig || twice_id || twice_ts) {
    return refuse(WebhookRefusal::signature_invalid, "a webhook-* header was sent more than once");
  }
  if (signature->size() > kMaxSignatureHeader) {
    return refuse(WebhookRefusal::signature_invalid, "webhook-signature is longer than 4096 bytes");
  }
  const auto ts = parse_timestamp(*timestamp);
  if (!ts) return refuse(WebhookRefusal::signature_invalid, "webhook-timestamp is not a number");
  std::vector<std::string> candidates;
  bool other_schemes = false;
  std::string_view rest = *signature;
  while (!rest.empty()) {
    const std::size_t space = rest.find(' ');
    const std::string_view item = rest.substr(0, space);
    rest = space == std::string_view::npos ? std::string_view() : rest.substr(space + 1);
    if (item.empty()) continue;
    if (item.substr(0, 3) != "v1,") {
      other_schemes = true;
      continue;
    }
    if (candidates.size() >= kMaxCandidates) continue;
    if (auto mac = decode_base64(item.substr(3))) candidates.push_back(std::move(*mac));
  }
  if (candidates.empty()) {
    return refuse(WebhookRefusal::signature_invalid,
                  other_schemes ? "webhook-signature has no v1 signature (v1a and other schemes are not accepted)"
                                : "webhook-signature has no v1 signature");
  }
  const std::string_view key = trim(*id);
  const std::string_view payload[] = {key, ".", trim(*timestamp), ".", body};
  if (!any_matches(candidates, payload, Algorithm::hmac_sha256)) {
    return refuse(WebhookRefusal::signature_invalid, "no v1 signature matches a configured secret");
  }
  if (auto late = check_timestamp(*ts, now, settings_.tolerance)) return std::unexpected(std::move(*late));
  return std::string(key);
}

// X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the body>. GitHub signs no timestamp, so a
// captured delivery verifies forever; the dedupe by X-GitHub-Delivery is what stops its replay
// within the route's retention.
std::expected<std::string, WebhookError> WebhookVerifier::verify_github(std::span<const HeaderView> headers,
                                                                        std::string_view body) const {
  bool twice = false, twice_id = false;
  const auto signature = single_header(headers, "X-Hub-Signature-256", twice);
  if (!signature) {
    bool ignored = false;
    if (single_header(headers, "X-Hub-Signature", ignored)) {
      return refuse(WebhookRefusal::signature_missing,
                    "no X-Hub-Signature-256 header (X-Hub-Signature, SHA-1, is not accepted)");
    }
    return refuse(WebhookRefusal::signature_missing, "no X-Hub-Signature-256 header");
  }
  if (twice) return refuse(WebhookRefusal::signature_invalid, "X-Hub-Signature-256 sent more than once");
  if (signature->size() > kMaxSignatureHeader) {
    return refuse(WebhookRefusal::signature_invalid, "X-Hub-Signature-256 is longer than 4096 bytes");
  }
  const std::string_view value = trim(*signature);
  if (value.substr(0, 7) != "sha256=") {
    return refuse(WebhookRefusal::signature_invalid, "X-Hub-Signature-256 is not sha256=<hex>");
  }
  const auto mac = decode_hex(value.substr(7));
  if (!mac) return refuse(WebhookRefusal::signature_invalid, "X-Hub-Signature-256 is not sha256=<hex>");
  const std::string candidates[] = {*mac};
  const std::string_view payload[] = {body};
  if (!any_matches(candidates, payload, Algorithm::hmac_sha256)) {
    return refuse(WebhookRefusal::signature_invalid, "the signature does not match a configured secret");
  }
  const auto id = single_header(headers, "X-GitHub-Delivery", twice_id);
  if (!id || trim(*id).empty() || twice_id) {
    return refuse(WebhookRefusal::webhook_id_missing, "no X-GitHub-Delivery header (or more than one)");
  }
  return std::string(trim(*id));
}

std::expected<std::string, WebhookError> WebhookVerifier::verify_custom(std::span<const HeaderView> headers,
                                                                        std::string_view body,
                                                                        std::int64_t now) const {
  const WebhookTemplate& t = settings_.custom;
  bool twice = false;
  const auto signature = single_header(headers, t.signature_header, twice);
  if (!signature) return refuse(WebhookRefusal::signature_missing, "no " + t.signature_header + " header");
  if (twice) return refuse(WebhookRefusal::signature_invalid, t.signature_header + " sent more than once");
  if (signature->size() > kMaxSignatureHeader) {
    return refuse(WebhookRefusal::signature_invalid, t.signature_header + " is longer than 4096 bytes");
  }
  std::optional<std::string_view> timestamp;
  std::optional<std::int64_t> ts;
  if (!t.timestamp_header.empty()) {
    timestamp = single_header(headers, t.timestamp_header, twice);
    if (!timestamp) return refuse(WebhookRefusal::signature_missing, "no " + t.timestamp_header + " header");
    if (twice) return refuse(WebhookRefusal::signature_invalid, t.timestamp_header + " sent more than once");
    ts = parse_timestamp(*timestamp);
    if (!ts) return refuse(WebhookRefusal::signature_invalid, t.timestamp_header + " is not a number");
    timestamp = trim(*timestamp);
  }
  // The key header is read before the MAC when it is signed ({key}); a body key only after.
  std::optional<std::string> key;
  if (!t.key_header.empty()) {
    const auto value = single_header(headers, t.key_header, twice);
    if (!value || trim(*value).empty() || twice) {
      return refuse(WebhookRefusal::webhook_id_missing, "no " + t.key_header + " header (or more than one)");
    }
    key = std::string(trim(*value));
  }
  std::string_view value = trim(*signature);
  if (value.substr(0, t.prefix.size()) != t.prefix) {
    return refuse(WebhookRefusal::signature_invalid, t.signature_header + " does not start with " + t.prefix);
  }
  value.remove_prefix(t.prefix.size());
  const auto mac = t.encoding == WebhookTemplate::Encoding::hex ? decode_hex(value) : decode_base64(value);
  if (!mac || mac->size() != mac_size(t.algorithm)) {
    return refuse(WebhookRefusal::signature_invalid, t.signature_header + " is not a signature of the configured form");
  }
  // The signed payload: the template's literal text with its placeholders' values in place.
  std::vector<std::string_view> payload;
  std::string_view rest = t.signed_payload;
  while (!rest.empty()) {
    const std::size_t open = rest.find('{');
    if (open == std::string_view::npos) {
      payload.push_back(rest);
      break;
    }
    if (open > 0) payload.push_back(rest.substr(0, open));
    rest.remove_prefix(open);
    if (rest.starts_with("{body}")) {
      payload.push_back(body);
      rest.remove_prefix(6);
    } else if (rest.starts_with("{timestamp}")) {
      payload.push_back(timestamp.value_or(std::string_view()));
      rest.remove_prefix(11);
    } else if (rest.starts_with("{key}")) {
      payload.push_back(key ? std::string_view(*key) : std::string_view());
      rest.remove_prefix(5);
    } else {
      payload.push_back(rest.substr(0, 1));
      rest.remove_prefix(1);
    }
  }
  const std::string candidates[] = {*mac};
  if (!any_matches(candidates, payload, t.algorithm)) {
    return refuse(WebhookRefusal::signature_invalid, "the signature does not match a configured secret");
  }
  if (ts) {
    if (auto late = check_timestamp(*ts, now, settings_.tolerance)) return std::unexpected(std::move(*late));
  }
  if (!key) {
    key = key_in_body(body, pointer_tokens_);
    if (!key) {
      return refuse(WebhookRefusal::webhook_id_missing,
                    "the body has no string or integer at " + t.key_pointer + " (key_pointer)");
    }
  }
  return std::move(*key);
}

}  // namespace idem::gateway
