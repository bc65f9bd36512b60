#include "idem/error_envelope.hpp"

#include <cstdio>
#include <fstream>
#include <sstream>

#include "idem/jcs.hpp"

namespace idem {
namespace {

constexpr std::size_t kMaxTemplate = 64 * 1024;

constexpr std::string_view kPlaceholders[] = {"status", "code", "title", "detail", "retry_after", "type"};

bool known_placeholder(std::string_view name) {
  for (const auto p : kPlaceholders) {
    if (p == name) return true;
  }
  return false;
}

std::string problem_type(const Problem& p) { return "https://idem.dev/problems/" + p.code; }

// The placeholder's value as the text inside a longer string (escaped by the caller).
std::string inline_value(const Problem& p, std::string_view name) {
  if (name == "status") return std::to_string(p.status);
  if (name == "code") return p.code;
  if (name == "title") return p.title;
  if (name == "detail") return p.detail;
  if (name == "retry_after") return p.retry_after_seconds ? std::to_string(*p.retry_after_seconds) : std::string();
  return problem_type(p);
}

// The placeholder's value as a whole JSON value.
void append_value(std::string& out, const Problem& p, std::string_view name) {
  if (name == "status") {
    out += std::to_string(p.status);
  } else if (name == "retry_after") {
    out += p.retry_after_seconds ? std::to_string(*p.retry_after_seconds) : std::string("null");
  } else {
    append_json_string(out, inline_value(p, name));
  }
}

// Escaped string content without the quotes.
void append_json_text(std::string& out, std::string_view s) {
  std::string quoted;
  append_json_string(quoted, s);
  out.append(quoted, 1, quoted.size() - 2);
}

// Whether `s` is a media type "type/subtype" with optional parameters, printable ASCII only.
bool is_media_type(std::string_view s) {
  const auto slash = s.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 >= s.size()) return false;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c >= 0x7f) return false;
  }
  return true;
}

// Splits a template into literal text and placeholders, tracking JSON strings so that a
// placeholder can only stand where a string does (the result then stays JSON whatever the values).
std::expected<std::vector<ErrorEnvelope::Segment>, std::string> split_template(std::string_view text) {
  using Segment = ErrorEnvelope::Segment;
  std::vector<Segment> out;
  auto literal = [&](std::string_view s) {
    if (s.empty()) return;
    if (out.empty() || out.back().kind != Segment::Kind::text) out.push_back({Segment::Kind::text, {}});
    out.back().text += s;
  };
  std::size_t i = 0;
  while (i < text.size()) {
    if (text.compare(i, 2, "{{") == 0) return std::unexpected(std::string("a placeholder must be inside a JSON string, e.g. \"{{code}}\""));
    if (text[i] != '"') {
      literal(text.substr(i, 1));
      ++i;
      continue;
    }
    // A string: find its end, honouring escapes.
    std::size_t end = i + 1;
    while (end < text.size() && text[end] != '"') end += text[end] == '\\' ? 2 : 1;
    if (end >= text.size()) return std::unexpected(std::string("a JSON string is not closed"));
    const std::string_view content = text.substr(i + 1, end - i - 1);
    // One whole-string placeholder: the value replaces the quotes too.
    if (content.size() > 4 && content.starts_with("{{") && content.ends_with("}}") &&
        content.find("{{", 2) == std::string_view::npos) {
      const std::string_view name = content.substr(2, content.size() - 4);
      if (!known_placeholder(name)) return std::unexpected("unknown placeholder {{" + std::string(name) + "}}");
      out.push_back({Segment::Kind::value, std::string(name)});
      i = end + 1;
      continue;
    }
    literal("\"");
    std::size_t j = 0;
    while (j < content.size()) {
      const auto open = content.find("{{", j);
      if (open == std::string_view::npos) {
        literal(content.substr(j));
        break;
      }
      literal(content.substr(j, open - j));
      const auto close = content.find("}}", open + 2);
      if (close == std::string_view::npos) return std::unexpected(std::string("a \"{{\" is not closed by \"}}\""));
      const std::string_view name = content.substr(open + 2, close - open - 2);
      if (!known_placeholder(name)) return std::unexpected("unknown placeholder {{" + std::string(name) + "}}");
      out.push_back({Segment::Kind::inline_text, std::string(name)});
      j = close + 2;
    }
    literal("\"");
    i = end + 1;
  }
  return out;
}

}  // namespace

void append_json_string(std::string& out, std::string_view s) {
  out.push_back('"');
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20) {
          char escape[8];
          std::snprintf(escape, sizeof escape, "\\u%04x", c);
          out += escape;
        } else {
          out.push_back(ch);
        }
    }
  }
  out.push_back('"');
}

StoredResponse not_stored_response(int original_status, std::size_t limit, const ErrorEnvelope& envelope) {
  const Problem p = make_problem(
      410, "idempotency_response_not_stored", "The response to this request was not stored",
      "the request with this key was executed (upstream status " + std::to_string(original_status) +
          ") but its response body was larger than max_stored_response (" + std::to_string(limit) +
          " bytes), so it cannot be replayed; do not retry, look the result up instead");
  StoredResponse stored;
  stored.status = 410;
  stored.headers = {{"Content-Type", envelope.content_type()},
                    {"Cache-Control", "no-store"},
                    {"Idempotent-Original-Status", std::to_string(original_status)}};
  stored.body = envelope.body(p);
  return stored;
}

std::string_view stripe_error_type(const Problem& problem) {
  if (problem.code == "idempotency_key_mismatch" || problem.code == "idempotency_key_in_use" ||
      problem.code == "idempotency_outcome_unknown") {
    return "idempotency_error";
  }
  if (problem.status >= 500) return "api_error";
  return "invalid_request_error";
}

ErrorEnvelope::ErrorEnvelope(Style style, std::string name, std::string content_type, std::vector<Segment> segments)
    : style_(style), name_(std::move(name)), content_type_(std::move(content_type)), segments_(std::move(segments)) {}

std::shared_ptr<const ErrorEnvelope> ErrorEnvelope::problem_json() {
  static const std::shared_ptr<const ErrorEnvelope> kEnvelope(
      new ErrorEnvelope(Style::problem_json, "problem+json", std::string(kProblemContentType)));
  return kEnvelope;
}

std::shared_ptr<const ErrorEnvelope> ErrorEnvelope::stripe() {
  static const std::shared_ptr<const ErrorEnvelope> kEnvelope(
      new ErrorEnvelope(Style::stripe, "stripe", "application/json"));
  return kEnvelope;
}

std::expected<std::shared_ptr<const ErrorEnvelope>, std::string> ErrorEnvelope::from_template(
    std::string_view text, std::string content_type, std::string name) {
  if (text.empty()) return std::unexpected(std::string("the template is empty"));
  if (text.size() > kMaxTemplate) return std::unexpected(std::string("the template is larger than 64 KiB"));
  if (!is_media_type(content_type)) {
    return std::unexpected("content_type \"" + content_type + "\" is not a media type like \"application/json\"");
  }
  auto segments = split_template(text);
  if (!segments) return std::unexpected(segments.error());
  std::shared_ptr<const ErrorEnvelope> envelope(
      new ErrorEnvelope(Style::custom, std::move(name), std::move(content_type), std::move(*segments)));
  // Rendered once with and once without a Retry-After, and with text that needs escaping: a
  // template that is not JSON is refused here, not discovered in a client's parser.
  Problem sample = make_problem(409, "idempotency_key_in_use", "A \"title\"", "a detail\nwith \\ escapes");
  for (int round = 0; round < 2; ++round) {
    if (round == 1) sample.retry_after_seconds = 1;
    if (auto json = canonicalize_json(envelope->body(sample)); !json) {
      return std::unexpected("the template is not JSON: " + json.error().message + " (at byte " +
                             std::to_string(json.error().offset) + " of the rendered body)");
    }
  }
  return envelope;
}

std::expected<std::shared_ptr<const ErrorEnvelope>, std::string> ErrorEnvelope::load_template(const std::string& path,
                                                                                              std::string content_type) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::unexpected("template \"" + path + "\": cannot read the file");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  auto envelope = from_template(buffer.str(), std::move(content_type), "template " + path);
  if (!envelope) return std::unexpected("template \"" + path + "\": " + envelope.error());
  return envelope;
}

std::string ErrorEnvelope::body(const Problem& problem) const {
  switch (style_) {
    case Style::problem_json: return idem::problem_json(problem);
    case Style::stripe: {
      std::string out;
      out.reserve(96 + problem.code.size() + problem.detail.size());
      out += "{\"error\":{\"type\":";
      append_json_string(out, stripe_error_type(problem));
      out += ",\"code\":";
      append_json_string(out, problem.code);
      out += ",\"message\":";
      append_json_string(out, problem.detail);
      out += "}}";
      return out;
    }
    case Style::custom: break;
  }
  std::string out;
  for (const auto& s : segments_) {
    switch (s.kind) {
      case Segment::Kind::text: out += s.text; break;
      case Segment::Kind::value: append_value(out, problem, s.text); break;
      case Segment::Kind::inline_text: append_json_text(out, inline_value(problem, s.text)); break;
    }
  }
  return out;
}

}  // namespace idem
