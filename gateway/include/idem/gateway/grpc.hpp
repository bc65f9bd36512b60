#pragma once

// gRPC over the gateway (docs/gateway.md, gRPC): what a unary call's answers look like when the
// gateway makes them itself, and how the upstream's grpc-status decides what is stored. A gRPC
// call is an HTTP/2 POST whose content-type begins with application/grpc; its answers are HTTP
// 200 with the call's status in grpc-status (a "trailers-only" answer when the gateway refuses).

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace idem::gateway::grpc {

/// The gRPC status codes (grpc/status.h).
enum class Code : std::uint8_t {
  ok = 0,
  cancelled = 1,
  unknown = 2,
  invalid_argument = 3,
  deadline_exceeded = 4,
  not_found = 5,
  already_exists = 6,
  permission_denied = 7,
  resource_exhausted = 8,
  failed_precondition = 9,
  aborted = 10,
  out_of_range = 11,
  unimplemented = 12,
  internal = 13,
  unavailable = 14,
  data_loss = 15,
  unauthenticated = 16,
};

/// "UNAVAILABLE" for Code::unavailable; the names gRPC's documentation and config use.
std::string_view name(Code code);
/// The code of a name ("UNAVAILABLE", any case) or of its number ("14"); nullopt for neither.
std::optional<Code> parse_code(std::string_view text);

/// Whether a request is a gRPC call: its content-type is application/grpc or application/grpc+...
/// (or ;params).
bool is_grpc_content_type(std::string_view content_type);

/// The status of a grpc-status field's value; nullopt when it is not a number 0..16.
std::optional<Code> parse_status(std::string_view value);

/// A grpc-timeout value ("100m", "5S": 1 to 8 digits and a unit H M S m u n); nullopt when malformed.
std::optional<std::chrono::nanoseconds> parse_timeout(std::string_view value);

/// grpc-message's encoding: percent-encoding of every byte outside printable ASCII and of '%'.
std::string percent_encode(std::string_view message);

/// The gRPC status of a problem the gateway answers with (docs/gateway.md, gRPC: the mapping), by
/// its code ("idempotency_key_in_use") and, for codes not listed, its HTTP status.
Code code_for_problem(std::string_view problem_code, int http_status);

/// The statuses whose answer is not stored by default: the key is left for the retry to execute
/// again (a route's grpc_retryable). DEADLINE_EXCEEDED is not one: a server whose deadline fired
/// may still complete the call, so the key stays in progress until its lease expires.
inline constexpr std::uint32_t kDefaultRetryable =
    (1u << static_cast<unsigned>(Code::unavailable)) | (1u << static_cast<unsigned>(Code::resource_exhausted)) |
    (1u << static_cast<unsigned>(Code::aborted));

/// The field name prefix that marks a trailer among a response's fields inside the gateway (a
/// record's headers, a response on its way to an HTTP/2 client): "trailer:grpc-status". The colon
/// makes it a name no real header can have.
inline constexpr std::string_view kTrailerPrefix = "trailer:";

}  // namespace idem::gateway::grpc
