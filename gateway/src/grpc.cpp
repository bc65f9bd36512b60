// gRPC's statuses, timeouts and messages, and the gateway's mapping of its answers onto them
// (docs/gateway.md, gRPC).
#include "idem/gateway/grpc.hpp"

#include <array>
#include <cctype>

namespace idem::gateway::grpc {
namespace {

constexpr std::array<std::string_view, 17> kNames = {
    "OK",        "CANCELLED",          "UNKNOWN",           "INVALID_ARGUMENT",  "DEADLINE_EXCEEDED", "NOT_FOUND",
    "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED",
    "OUT_OF_RANGE", "UNIMPLEMENTED",    "INTERNAL",          "UNAVAILABLE",       "DATA_LOSS",        "UNAUTHENTICATED",
};

bool equals_upper(std::string_view text, std::string_view upper) {
  if (text.size() != upper.size()) return false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (std::toupper(static_cast<unsigned char>(text[i])) != upper[i]) return false;
  }
  return true;
}

}  // namespace

std::string_view name(Code code) {
  const auto i = static_cast<std::size_t>(code);
  return i < kNames.size() ? kNames[i] : std::string_view("UNKNOWN");
}

std::optional<Code> parse_status(std::string_view value) {
  if (value.empty() || value.size() > 2) return std::nullopt;
  unsigned n = 0;
  for (char c : value) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + static_cast<unsigned>(c - '0');
  }
  if (n >= kNames.size()) return std::nullopt;
  return static_cast<Code>(n);
}

std::optional<Code> parse_code(std::string_view text) {
  if (auto numeric = parse_status(text)) return numeric;
  for (std::size_t i = 0; i < kNames.size(); ++i) {
    if (equals_upper(text, kNames[i])) return static_cast<Code>(i);
  }
  return std::nullopt;
}

bool is_grpc_content_type(std::string_view content_type) {
  constexpr std::string_view kGrpc = "application/grpc";
  if (content_type.size() < kGrpc.size()) return false;
  for (std::size_t i = 0; i < kGrpc.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(content_type[i])) != kGrpc[i]) return false;
  }
  return content_type.size() == kGrpc.size() || content_type[kGrpc.size()] == '+' || content_type[kGrpc.size()] == ';';
}

std::optional<std::chrono::nanoseconds> parse_timeout(std::string_view value) {
  if (value.size() < 2 || value.size() > 9) return std::nullopt;
  std::int64_t n = 0;
  for (char c : value.substr(0, value.size() - 1)) {
    if (c < '0' || c > '9') return std::nullopt;
    n = n * 10 + (c - '0');
  }
  using namespace std::chrono;
  switch (value.back()) {
    case 'H': return duration_cast<nanoseconds>(hours(n));
    case 'M': return duration_cast<nanoseconds>(minutes(n));
    case 'S': return duration_cast<nanoseconds>(seconds(n));
    case 'm': return duration_cast<nanoseconds>(milliseconds(n));
    case 'u': return duration_cast<nanoseconds>(microseconds(n));
    case 'n': return nanoseconds(n);
    default: return std::nullopt;
  }
}

std::string percent_encode(std::string_view message) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(message.size());
  for (char ch : message) {
    const auto c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c <= 0x7e && c != '%') {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xf]);
    }
  }
  return out;
}

Code code_for_problem(std::string_view problem_code, int http_status) {
  // The gateway's own refusals, by what a gRPC client should do about them.
  if (problem_code == "idempotency_key_in_use") return Code::aborted;  // retry after the pushback
  if (problem_code == "idempotency_key_mismatch") return Code::failed_precondition;  // a new key for a new request
  if (problem_code == "idempotency_outcome_unknown") return Code::failed_precondition;  // an operator decides
  if (problem_code == "idempotency_response_not_stored") return Code::failed_precondition;  // executed: look it up
  if (problem_code == "upstream_response_too_large") return Code::internal;  // executed, answer not relayable
  if (problem_code == "idempotency_store_unavailable") return Code::unavailable;
  if (problem_code == "upstream_unreachable") return Code::unavailable;
  if (problem_code == "upstream_timeout") return Code::deadline_exceeded;
  if (problem_code == "request_too_large" || problem_code == "request_header_too_large") return Code::resource_exhausted;
  if (problem_code == "not_implemented") return Code::unimplemented;
  switch (http_status) {
    case 400: return Code::invalid_argument;  // key missing or invalid, malformed, tenant refused
    case 401: return Code::unauthenticated;
    case 403: return Code::permission_denied;
    case 404: return Code::not_found;
    case 409: return Code::aborted;
    case 413: case 431: return Code::resource_exhausted;
    case 429: return Code::resource_exhausted;
    case 501: return Code::unimplemented;
    case 502: case 503: return Code::unavailable;
    case 504: return Code::deadline_exceeded;
    default: break;
  }
  return http_status >= 500 ? Code::internal : Code::unknown;
}

}  // namespace idem::gateway::grpc
