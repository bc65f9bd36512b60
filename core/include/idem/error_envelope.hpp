#pragma once

#include <expected>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "idem/problem.hpp"
#include "idem/record.hpp"

namespace idem {

/// The shape of the bodies idem answers with when it answers itself (SPEC §7): RFC 9457
/// problem+json by default, or the error object the API's own clients already parse, so that a
/// client library which raises only on its API's envelope never reads a refusal as a success.
/// Only the body and its media type change: status, Retry-After, X-Idempotency-Conflict,
/// WWW-Authenticate and Cache-Control are the same in every style. Immutable; shared by threads.
class ErrorEnvelope {
 public:
  /// Which kind of envelope.
  enum class Style : unsigned char {
    problem_json,  ///< {"type","title","status","detail","code"}, application/problem+json
    stripe,        ///< {"error": {"type","code","message"}}, application/json (Stripe's error object)
    custom,        ///< a JSON template with placeholders (from_template)
  };

  /// The default: application/problem+json.
  static std::shared_ptr<const ErrorEnvelope> problem_json();
  /// Stripe's error object; `type` is stripe_error_type(problem).
  static std::shared_ptr<const ErrorEnvelope> stripe();

  /// A template: JSON in which strings may hold placeholders `{{status}}`, `{{code}}`,
  /// `{{title}}`, `{{detail}}`, `{{retry_after}}` and `{{type}}` (the problem type URI). A
  /// string that is exactly one placeholder becomes that value as JSON (`"{{status}}"` -> 422,
  /// `"{{retry_after}}"` -> 1 or null, the others JSON strings); a placeholder inside a longer
  /// string is replaced by its text, escaped (`"{{code}}: {{detail}}"`; a missing Retry-After is
  /// empty there). Errors (one sentence): not JSON, an unknown placeholder, a placeholder outside
  /// a string, an unclosed `{{`, an empty or over-64-KiB template, a content type that is not a
  /// media type. `name` says where the template came from, in messages and logs.
  static std::expected<std::shared_ptr<const ErrorEnvelope>, std::string> from_template(std::string_view text,
                                                                                        std::string content_type,
                                                                                        std::string name);
  /// from_template on the contents of a file.
  static std::expected<std::shared_ptr<const ErrorEnvelope>, std::string> load_template(const std::string& path,
                                                                                        std::string content_type);

  /// The style.
  Style style() const { return style_; }
  /// "problem+json", "stripe", or "template FILE": what the configuration said.
  const std::string& name() const { return name_; }
  /// The Content-Type of its bodies.
  const std::string& content_type() const { return content_type_; }
  /// The body answering `problem`.
  std::string body(const Problem& problem) const;

  /// One piece of a template: literal text, or a placeholder (whole string or inside one).
  struct Segment {
    enum class Kind : unsigned char { text, value, inline_text };
    Kind kind = Kind::text;
    std::string text;       ///< for text: the bytes; otherwise the placeholder's name
  };

 private:
  ErrorEnvelope(Style style, std::string name, std::string content_type, std::vector<Segment> segments = {});

  Style style_;
  std::string name_;
  std::string content_type_;
  std::vector<Segment> segments_;  // custom only
};

/// The Stripe error `type` for a problem: `idempotency_error` for the idempotency conflicts (409
/// idempotency_key_in_use and idempotency_outcome_unknown, 422 idempotency_key_mismatch),
/// `api_error` for 5xx, `invalid_request_error` for every other 4xx (a missing or invalid key, a
/// refused token, a request too large or malformed), as Stripe types each case.
std::string_view stripe_error_type(const Problem& problem);

/// What is stored for an executed request whose response body exceeded `limit`
/// (max_stored_response): 410 idempotency_response_not_stored in `envelope`, with
/// Idempotent-Original-Status, so a retry learns the request was executed instead of executing it
/// again. The gateway stores it; `idemctl reconcile` stores the same for an oversized lookup answer.
StoredResponse not_stored_response(int original_status, std::size_t limit, const ErrorEnvelope& envelope);

/// Appends `s` as a JSON string literal (quotes included), escaping quotes, backslashes and
/// control characters.
void append_json_string(std::string& out, std::string_view s);

}  // namespace idem
