#pragma once

// The lookup contract (docs/gateway.md, "on_lease_expiry = \"ask\""): how idem-gateway and
// `idemctl reconcile` ask an upstream whether an operation whose outcome they lost took place,
// and how its answer reads. No I/O here: the gateway sends lookups over its upstream pool,
// idemctl over libcurl, and both read the answer with interpret_lookup.
//
// The request:   GET <target>          the route's `ask`, {key} and {tenant} filled in
//                <key header>: KEY     (Idempotency-Key unless the route renames it)
//                Idempotency-Tenant: TENANT
//                Idempotency-Attempt: N     the asker's attempt: higher than the lost holder's
// The answers:   2xx + <key header>: KEY   the operation happened; the body, the headers and the
//                                          status (Idempotency-Original-Status when not the 2xx's
//                                          own) are its original response
//                404 + Idempotency-Lookup: not_found + <key header>: KEY
//                                          it never happened (and, having seen attempt N, the
//                                          upstream will refuse any lower attempt's write)
//                anything else             unknown: the key stays unresolved

#include <cstdint>
#include <expected>
#include <string>
#include <string_view>

#include "idem/record.hpp"

namespace idem::http {

/// Default names of the headers the gateway sends the upstream with every keyed request and
/// every lookup (configurable: upstream_attempt_header, upstream_tenant_header).
inline constexpr std::string_view kAttemptHeader = "Idempotency-Attempt";
inline constexpr std::string_view kTenantHeader = "Idempotency-Tenant";
/// A lookup's 404 says "never happened" only with this header and value: a 404 from a missing
/// route, a proxy or a framework's default handler must not read as an operation that did not
/// take place.
inline constexpr std::string_view kLookupHeader = "Idempotency-Lookup";
inline constexpr std::string_view kLookupNotFound = "not_found";
/// The original response's status, when the lookup answers with another (200 for a 201).
inline constexpr std::string_view kOriginalStatusHeader = "Idempotency-Original-Status";

/// A route's `ask`: a GET and its target, `{key}` and `{tenant}` placeholders in it.
struct Lookup {
  std::string target;  ///< origin-form, e.g. "/v1/payments/by-idempotency-key/{key}"
};

/// Parses `GET /path[?query]` with {key} and {tenant} placeholders; a one-line reason otherwise.
std::expected<Lookup, std::string> parse_lookup(std::string_view text);

/// The target with `{key}` and `{tenant}` replaced, percent-encoded (everything but RFC 3986's
/// unreserved characters), so that no key can change the path's shape.
std::string lookup_target(const Lookup& lookup, std::string_view tenant, std::string_view key);

/// The header names of one lookup request (and the key header its answers must carry).
struct LookupHeaders {
  std::string key = "Idempotency-Key";
  std::string tenant = std::string(kTenantHeader);
  std::string attempt = std::string(kAttemptHeader);
};

/// The headers a lookup request carries, in this order: key, tenant, attempt.
Headers lookup_request_headers(const LookupHeaders& names, std::string_view tenant, std::string_view key,
                               std::uint32_t attempt);

/// What an answer said.
enum class LookupAnswer : std::uint8_t {
  happened,   ///< the operation took place: `response` is its outcome
  not_found,  ///< it never happened: execute it
  unknown,    ///< the upstream could not say (5xx, 404 without the marker, another status)
  malformed,  ///< an answer breaking the contract (no key header, a bad original status, ...)
  mismatch,   ///< an answer for another key: refused
};

/// "happened", "not_found", "unknown", "malformed", "mismatch" (metric labels, logs).
std::string_view to_string(LookupAnswer answer);

/// A lookup's answer as received. `headers` in wire order; `truncated` when the body was longer
/// than the caller's limit (max_stored_response) and was not read whole.
struct LookupReply {
  int status = 0;
  Headers headers;
  std::string body;
  bool truncated = false;
};

/// How interpret_lookup reads an answer.
struct LookupRules {
  std::string key_header = "Idempotency-Key";
  /// Whether 5xx responses are stored (the route's store_server_errors): only an outcome the
  /// gateway would have stored can be the outcome of a lookup.
  bool store_server_errors = false;
};

/// The meaning of a reply.
struct LookupResult {
  LookupAnswer answer = LookupAnswer::unknown;
  /// happened: the response to store and replay: the original status, the reply's end-to-end
  /// headers but the contract's own (key, tenant, attempt, marker, original status) and
  /// Content-Length, and its body.
  StoredResponse response;
  /// happened, with a body above the caller's limit (LookupReply::truncated): `response` holds
  /// only the original status; store what is stored for any response too large to replay
  /// (the gateway's 410 idempotency_response_not_stored), so retries learn it was executed.
  bool oversized = false;
  /// For anything but happened and not_found: why, in one line (status, header, value).
  std::string detail;
};

/// Reads a lookup's answer for `key` (see the contract above).
LookupResult interpret_lookup(const LookupReply& reply, std::string_view key, const LookupRules& rules);

}  // namespace idem::http
