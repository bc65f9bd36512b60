#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "idem/http_view.hpp"

namespace idem::gateway {

/// What the log says about one request that had an idempotency policy (docs/gateway.md, Logs):
/// rendered as `key tenant=... verdict=...` text or as one JSON object, by log_format. Views into
/// the request; never a body, a token or key material.
struct KeyLine {
  std::optional<std::string_view> tenant;  ///< nullopt: refused before a tenant was derived
  std::optional<std::string_view> key;     ///< nullopt: no key, or an invalid one
  std::string_view method;
  std::string_view path;
  std::string_view verdict;                ///< execute, replay, ..., or a tenant refusal's code
  std::string_view takeover;               ///< "", lease_expired, after_failure
  /// on_lease_expiry = "ask": what the lookup answered (happened, not_found, unknown, ...), or ""
  std::string_view lookup;
  /// The claim's attempt number (0: no claim); the text form shows it from 2 on, JSON always.
  std::uint32_t attempt = 0;
  unsigned status = 0;                     ///< sent to the client; 0 if nothing was sent
  std::string_view record;                 ///< "" or what was written: stored, released, ...
  std::string_view upstream_error;         ///< "" or unreachable, timeout, dropped
  std::optional<std::string_view> store_error;  ///< why the store refused (503, 500)
  std::optional<std::string_view> reason;       ///< a tenant refusal's detail
  double ms = 0;                            ///< from the request's arrival to its answer
  std::optional<double> upstream_ms;        ///< from sending to the upstream to its response head
  std::string_view request_id;
  std::optional<std::string_view> trace_id;  ///< of a valid W3C traceparent
};

/// `key tenant="acme" key="..." method=POST path="/v1/payments" verdict=execute status=201
/// record=stored ms=3.41 upstream_ms=3.02 request_id="..." trace_id="..."`.
std::string render_text(const KeyLine& line);

/// The members of the JSON object (without braces), after "time", "level" and "event": "key":
/// `"tenant":"acme","key":"...","method":"POST",...`; absent values are null (tenant, key,
/// upstream_ms, trace_id) or left out (takeover, record, upstream_error, store_error, reason).
std::string render_json_members(const KeyLine& line);

/// The trace id (32 lowercase hex digits) of a W3C Trace Context `traceparent` header
/// (`00-<trace-id>-<parent-id>-<flags>`), or nullopt when there is none, several, or it is not
/// valid (wrong length, upper case, all-zero ids, version ff).
std::optional<std::string_view> trace_id_of(std::span<const HeaderView> headers);

/// The request's id for the log: the client's X-Request-Id when it is 1-128 visible ASCII
/// characters, else a fresh random one (32 hex digits) written into `generated`.
std::string_view request_id_of(std::span<const HeaderView> headers, std::string& generated);

/// Appends `s` as a JSON string, escaping control bytes and every byte above 0x7e as \u00XX (a
/// log line stays valid UTF-8 whatever a client sent).
void append_log_json_string(std::string& out, std::string_view s);

}  // namespace idem::gateway
