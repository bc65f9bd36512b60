#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "idem/record.hpp"

namespace idem::client {

/// One HTTP request as the client sends it: exactly these bytes, on every attempt.
struct HttpRequest {
  std::string method = "POST";
  std::string url;  ///< absolute http:// or https:// URL
  Headers headers;  ///< sent in order; the client adds the idempotency key header itself
  std::string body;
  bool operator==(const HttpRequest&) const = default;
};

/// One HTTP response: status, headers in the order received, exact body bytes.
struct HttpResponse {
  int status = 0;
  Headers headers;
  std::string body;
  bool operator==(const HttpResponse&) const = default;
};

/// The value of the first header called `name` (ASCII case-insensitive); nullopt if absent.
std::optional<std::string_view> find_header(const Headers& headers, std::string_view name);

/// Whether two header names are the same name (ASCII case-insensitive).
bool header_name_equals(std::string_view a, std::string_view b);

/// Whether the response says it is a replay of a stored answer: `Idempotent-Replayed`,
/// `Idempotency-Replayed` or `X-Idempotent-Replayed` (any case) with the value `true` (any case).
bool is_replay(const Headers& headers);

/// The `code` member of a JSON object body (RFC 9457 problem+json, e.g. "idempotency_key_in_use");
/// nullopt when the body is not a JSON object or has no string `code` at its top level.
std::optional<std::string> problem_code(std::string_view body);

}  // namespace idem::client
