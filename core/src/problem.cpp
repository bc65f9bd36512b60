#include "idem/problem.hpp"

#include "idem/error_envelope.hpp"

namespace idem {

Problem make_problem(int status, std::string code, std::string title, std::string detail) {
  Problem p;
  p.status = status;
  p.code = std::move(code);
  p.title = std::move(title);
  p.detail = std::move(detail);
  return p;
}

std::optional<Problem> problem_for(const Decision& decision) {
  switch (decision.verdict) {
    case Verdict::pass_through:
    case Verdict::execute:
    case Verdict::replay:
    case Verdict::ask:  // the caller holds the key; it asks the upstream before answering
      return std::nullopt;
    case Verdict::key_missing:
      return make_problem(400, "idempotency_key_missing", "Idempotency-Key is missing", decision.detail);
    case Verdict::key_invalid:
      return make_problem(400, "idempotency_key_invalid", "Idempotency-Key is invalid", decision.detail);
    case Verdict::in_use: {
      auto p = make_problem(409, "idempotency_key_in_use", "A request with this key is in progress",
                            decision.detail);
      p.retry_after_seconds = std::max<long>(1, decision.retry_after.count());
      return p;
    }
    case Verdict::outcome_unknown:
      return make_problem(409, "idempotency_outcome_unknown",
                          "The outcome of the request with this key is unknown", decision.detail);
    case Verdict::mismatch: {
      auto p = make_problem(422, "idempotency_key_mismatch",
                            "This key was used with a different request", decision.detail);
      p.conflict = true;
      return p;
    }
    case Verdict::store_unavailable: {
      auto p = make_problem(503, "idempotency_store_unavailable", "The idempotency store is unavailable",
                            decision.detail);
      p.retry_after_seconds = std::max<long>(1, decision.retry_after.count());
      return p;
    }
    case Verdict::record_unreadable:
      // No Retry-After: the same keys give the same answer; an operator restoring the key does.
      return make_problem(500, "idempotency_record_unreadable", "The stored response for this key cannot be read",
                          decision.detail);
  }
  return std::nullopt;
}

Problem request_too_large(std::string detail) {
  return make_problem(413, "request_too_large", "The request is too large", std::move(detail));
}

std::string problem_json(const Problem& problem) {
  std::string out;
  out.reserve(160 + problem.detail.size());
  out += "{\"type\":";
  append_json_string(out, "https://idem.dev/problems/" + problem.code);
  out += ",\"title\":";
  append_json_string(out, problem.title);
  out += ",\"status\":" + std::to_string(problem.status) + ",\"detail\":";
  append_json_string(out, problem.detail);
  out += ",\"code\":";
  append_json_string(out, problem.code);
  out += "}";
  return out;
}

}  // namespace idem
