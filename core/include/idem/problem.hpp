#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "idem/engine.hpp"

namespace idem {

/// An RFC 9457 problem as idem answers it (SPEC §7), independent of any HTTP library.
struct Problem {
  int status = 500;
  std::string code;   ///< e.g. "idempotency_key_in_use"
  std::string title;  ///< short, the same for every occurrence of the code
  std::string detail; ///< this occurrence
  std::optional<long> retry_after_seconds;  ///< send as Retry-After
  bool conflict = false;                    ///< send X-Idempotency-Conflict: true
  /// Send as WWW-Authenticate (401 answers, RFC 9110 §11.6.1), e.g. `Bearer error="invalid_token"`.
  std::optional<std::string> www_authenticate;
};

/// The problem to answer for a refusing verdict; nullopt for pass_through, execute and replay.
std::optional<Problem> problem_for(const Decision& decision);

/// 413 request_too_large, for bodies above the configured limit.
Problem request_too_large(std::string detail);

/// A problem with any status and code, for errors outside the idempotency contract
/// (502 upstream_unreachable, 504 upstream_timeout, ...).
Problem make_problem(int status, std::string code, std::string title, std::string detail);

/// The application/problem+json body: {"type","title","status","detail","code"}.
std::string problem_json(const Problem& problem);

/// Media type of problem bodies.
inline constexpr std::string_view kProblemContentType = "application/problem+json";

}  // namespace idem
