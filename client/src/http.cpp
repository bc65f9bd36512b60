#include "idem/client/http.hpp"

#include <array>
#include <cstddef>

namespace idem::client {
namespace {

char lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c; }

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// Just enough JSON to read one top-level string member of an object, tolerant of anything else
// in the document; never throws, bounded nesting.
class JsonScanner {
 public:
  explicit JsonScanner(std::string_view text) : s_(text) {}

  std::optional<std::string> top_level_string(std::string_view name) {
    skip_ws();
    if (!eat('{')) return std::nullopt;
    skip_ws();
    if (eat('}')) return std::nullopt;
    std::optional<std::string> found;
    while (true) {
      skip_ws();
      std::string member;
      if (!string(&member)) return std::nullopt;
      skip_ws();
      if (!eat(':')) return std::nullopt;
      skip_ws();
      if (member == name && peek() == '"') {
        std::string value;
        if (!string(&value)) return std::nullopt;
        if (!found) found = std::move(value);  // first occurrence wins
      } else if (!skip_value(0)) {
        return std::nullopt;
      }
      skip_ws();
      if (eat(',')) continue;
      if (eat('}')) return found;
      return std::nullopt;
    }
  }

 private:
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  bool eat(char c) {
    if (peek() != c || i_ >= s_.size()) return false;
    ++i_;
    return true;
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }

  // A JSON string; escapes decoded (\u escapes outside ASCII become '?': codes are ASCII).
  bool string(std::string* out) {
    if (!eat('"')) return false;
    while (i_ < s_.size()) {
      const char c = s_[i_++];
      if (c == '"') return true;
      if (c != '\\') {
        if (out) out->push_back(c);
        continue;
      }
      if (i_ >= s_.size()) return false;
      const char e = s_[i_++];
      char decoded = '\0';
      switch (e) {
        case '"': decoded = '"'; break;
        case '\\': decoded = '\\'; break;
        case '/': decoded = '/'; break;
        case 'b': decoded = '\b'; break;
        case 'f': decoded = '\f'; break;
        case 'n': decoded = '\n'; break;
        case 'r': decoded = '\r'; break;
        case 't': decoded = '\t'; break;
        case 'u': {
          if (i_ + 4 > s_.size()) return false;
          unsigned value = 0;
          for (int k = 0; k < 4; ++k) {
            const char h = s_[i_++];
            value <<= 4;
            if (h >= '0' && h <= '9') value |= static_cast<unsigned>(h - '0');
            else if (h >= 'a' && h <= 'f') value |= static_cast<unsigned>(h - 'a' + 10);
            else if (h >= 'A' && h <= 'F') value |= static_cast<unsigned>(h - 'A' + 10);
            else return false;
          }
          decoded = value < 0x80 ? static_cast<char>(value) : '?';
          break;
        }
        default: return false;
      }
      if (out) out->push_back(decoded);
    }
    return false;
  }

  bool skip_value(int depth) {
    if (depth > 64) return false;
    const char c = peek();
    if (c == '"') return string(nullptr);
    if (c == '{' || c == '[') {
      const char close = c == '{' ? '}' : ']';
      ++i_;
      skip_ws();
      if (eat(close)) return true;
      while (true) {
        skip_ws();
        if (c == '{') {
          if (!string(nullptr)) return false;
          skip_ws();
          if (!eat(':')) return false;
          skip_ws();
        }
        if (!skip_value(depth + 1)) return false;
        skip_ws();
        if (eat(',')) continue;
        return eat(close);
      }
    }
    // number, true, false, null
    const std::size_t start = i_;
    while (i_ < s_.size()) {
      const char t = s_[i_];
      const bool token = (t >= '0' && t <= '9') || (t >= 'a' && t <= 'z') || t == '-' || t == '+' || t == '.' ||
                         t == 'E';
      if (!token) break;
      ++i_;
    }
    return i_ > start;
  }

  std::string_view s_;
  std::size_t i_ = 0;
};

}  // namespace

bool header_name_equals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

std::optional<std::string_view> find_header(const Headers& headers, std::string_view name) {
  for (const auto& h : headers) {
    if (header_name_equals(h.name, name)) return std::string_view(h.value);
  }
  return std::nullopt;
}

bool is_replay(const Headers& headers) {
  // Stripe's spelling first; the others are what other servers in the wild send.
  static constexpr std::array<std::string_view, 3> kNames{"Idempotent-Replayed", "Idempotency-Replayed",
                                                          "X-Idempotent-Replayed"};
  for (const auto& h : headers) {
    for (const auto name : kNames) {
      if (header_name_equals(h.name, name) && header_name_equals(trim_ows(h.value), "true")) return true;
    }
  }
  return false;
}

std::optional<std::string> problem_code(std::string_view body) {
  return JsonScanner(body).top_level_string("code");
}

}  // namespace idem::client
