#include "idem/key.hpp"

#include <algorithm>
#include <string>

namespace idem {
namespace {

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::unexpected<KeyError> invalid(std::string detail) {
  return std::unexpected(KeyError{KeyErrc::invalid, std::move(detail)});
}

// RFC 8941 sf-string: DQUOTE *( unescaped / "\" ( DQUOTE / "\" ) ) DQUOTE, where unescaped is
// 0x20-0x7E except DQUOTE and "\". Nothing may follow (no parameters, no list members).
std::expected<std::string, KeyError> unquote_sf_string(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  std::size_t i = 1;  // past the opening quote
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '\\') {
      if (i + 1 >= s.size() || (s[i + 1] != '"' && s[i + 1] != '\\')) {
        return invalid("the key's quoted string has an escape other than \\\" or \\\\");
      }
      out.push_back(s[++i]);
    } else if (c == '"') {
      break;
    } else if (c < 0x20 || c > 0x7e) {
      return invalid("the key contains a control or non-ASCII character");
    } else {
      out.push_back(c);
    }
  }
  if (i >= s.size()) return invalid("the key's quoted string has no closing quote");
  if (i + 1 != s.size()) {
    return invalid("the key header must hold one string; found more after the closing quote");
  }
  return out;
}

}  // namespace

bool all_visible_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x21 && c <= 0x7e; });
}

std::expected<std::string, KeyError> parse_key(std::span<const std::string_view> header_values,
                                               const KeyRules& rules) {
  if (header_values.empty()) {
    return std::unexpected(KeyError{KeyErrc::missing, "this request needs an Idempotency-Key header"});
  }
  if (header_values.size() > 1) return invalid("the key header appears more than once");

  const std::string_view raw = trim_ows(header_values.front());
  std::string key;
  if (!raw.empty() && raw.front() == '"') {
    auto unquoted = unquote_sf_string(raw);
    if (!unquoted) return unquoted;
    key = std::move(*unquoted);
  } else {
    if (raw.find(',') != std::string_view::npos) {
      return invalid("the key header holds a list; send exactly one key");
    }
    key.assign(raw);
  }

  if (key.empty()) return invalid("the key is empty");
  if (!all_visible_ascii(key)) {
    return invalid("the key may contain only visible ASCII characters (0x21-0x7E), no spaces");
  }
  if (key.size() < rules.min_length || key.size() > rules.max_length) {
    return invalid("the key must be " + std::to_string(rules.min_length) + " to " +
                   std::to_string(rules.max_length) + " characters long; it has " + std::to_string(key.size()));
  }
  return key;
}

}  // namespace idem
