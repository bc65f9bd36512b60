#include "idem/redact.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <vector>

namespace idem {
namespace {

constexpr std::string_view kHidden = "***";

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX escapes decoded; a '%' not followed by two hex digits is kept as it is.
std::string percent_decoded(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size()) {
      const int hi = hex_digit(text[i + 1]);
      const int lo = hex_digit(text[i + 2]);
      if (hi >= 0 && lo >= 0) {
        out.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        continue;
      }
    }
    out.push_back(text[i]);
  }
  return out;
}

bool starts_parameter(char c) { return c == '?' || c == '&' || c == ';' || c == ' ' || c == '\t' || c == '\n'; }
bool ends_value(char c) { return c == '&' || c == ';' || c == ' ' || c == '\t' || c == '\n' || c == '#'; }

// [begin, end) of a secret inside the text it was found in.
struct Span {
  std::size_t begin = 0;
  std::size_t end = 0;
};

// The values of every secret-naming `name=value` in text[from, to), in order.
void find_secret_parameters(std::string_view text, std::size_t from, std::size_t to, std::vector<Span>& out) {
  std::size_t pos = from;
  while ((pos = text.find('=', pos)) != std::string_view::npos && pos < to) {
    std::size_t name_end = pos;
    while (name_end > from && text[name_end - 1] == ' ') --name_end;
    std::size_t name_begin = name_end;
    while (name_begin > from && !starts_parameter(text[name_begin - 1])) --name_begin;
    const std::string_view name = text.substr(name_begin, name_end - name_begin);
    std::size_t value_begin = pos + 1;
    // libpq's keyword form allows spaces around '=': `password = 'x'`.
    while (value_begin < to && text[value_begin] == ' ') ++value_begin;
    std::size_t value_end = value_begin;
    if (value_end < to && (text[value_end] == '\'' || text[value_end] == '"')) {
      const char quote = text[value_end++];
      while (value_end < to && text[value_end] != quote) {
        if (text[value_end] == '\\' && value_end + 1 < to) ++value_end;
        ++value_end;
      }
      if (value_end < to) ++value_end;  // the closing quote
    } else {
      while (value_end < to && !ends_value(text[value_end])) ++value_end;
    }
    if (is_secret_parameter(name) && value_end > value_begin) out.push_back({value_begin, value_end});
    pos = std::max(value_end, pos + 1);
  }
}

bool valid_scheme(std::string_view scheme) {
  if (scheme.empty() || !std::isalpha(static_cast<unsigned char>(scheme.front()))) return false;
  return std::all_of(scheme.begin(), scheme.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '+' || c == '-' || c == '.';
  });
}

// Every secret in a URL (or a keyword=value list), in order, not overlapping.
std::vector<Span> secret_spans(std::string_view url) {
  std::vector<Span> spans;
  std::size_t tail = 0;
  const auto scheme_end = url.find("://");
  if (scheme_end != std::string_view::npos && valid_scheme(url.substr(0, scheme_end))) {
    const std::size_t authority = scheme_end + 3;
    // The last '@' ends the userinfo: a password may hold a raw '@' (Redis's parser reads it
    // so, and for any other library it is the safe reading: more is hidden, never less).
    const auto at = url.rfind('@');
    if (at != std::string_view::npos && at >= authority) {
      const auto colon = url.find(':', authority);
      if (colon != std::string_view::npos && colon < at) {
        spans.push_back({colon + 1, at});
      } else if (url.starts_with("redis")) {
        spans.push_back({authority, at});  // redis://PASS@host: the default user's password
      } else {
        find_secret_parameters(url, authority, at, spans);
      }
      tail = at + 1;
    }
  }
  find_secret_parameters(url, tail, url.size(), spans);
  return spans;
}

}  // namespace

bool is_secret_parameter(std::string_view name) {
  static constexpr std::array<std::string_view, 13> kSecrets = {
      "password", "sslpassword", "pass",    "passwd", "pwd",           "secret",          "token",
      "access_token", "auth",    "api_key", "apikey", "sasl_password", "ssl_key_password"};  // Kafka's last two
  // "%70assword" names a secret as well as "PassWord" does.
  std::string n = percent_decoded(name);
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return std::find(kSecrets.begin(), kSecrets.end(), n) != kSecrets.end();
}

std::string redact_url(std::string_view url) {
  std::string out;
  out.reserve(url.size());
  std::size_t copied = 0;
  for (const Span& span : secret_spans(url)) {
    out.append(url.substr(copied, span.begin - copied)).append(kHidden);
    copied = span.end;
  }
  out.append(url.substr(copied));
  return out;
}

std::string redact_text(std::string_view text) {
  auto delimits = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '"' || c == '\'' || c == '<' || c == '>'; };
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    if (delimits(text[i])) {
      out.push_back(text[i++]);
      continue;
    }
    std::size_t end = i;
    while (end < text.size() && !delimits(text[end])) ++end;
    const std::string_view word = text.substr(i, end - i);
    const auto scheme = word.find("://");
    if (scheme == std::string_view::npos) {
      out.append(word);
    } else {
      // "store=postgres://..." or "(postgres://...": the URL starts at its scheme.
      std::size_t start = scheme;
      while (start > 0 && (std::isalnum(static_cast<unsigned char>(word[start - 1])) || word[start - 1] == '+' ||
                           word[start - 1] == '-' || word[start - 1] == '.')) {
        --start;
      }
      out.append(word.substr(0, start)).append(redact_url(word.substr(start)));
    }
    i = end;
  }
  return out;
}

std::string scrub_secrets(std::string_view text, std::string_view url) {
  std::vector<std::string> secrets;
  for (const Span& span : secret_spans(url)) {
    std::string_view raw = url.substr(span.begin, span.end - span.begin);
    if (raw.size() >= 2 && (raw.front() == '\'' || raw.front() == '"') && raw.back() == raw.front()) {
      raw = raw.substr(1, raw.size() - 2);
    }
    secrets.emplace_back(raw);
    secrets.push_back(percent_decoded(raw));
  }
  // Longest first, so that a secret holding another is replaced whole.
  std::sort(secrets.begin(), secrets.end(), [](const auto& a, const auto& b) { return a.size() > b.size(); });
  std::string out(text);
  for (const std::string& secret : secrets) {
    if (secret.size() < 3) continue;
    for (auto pos = out.find(secret); pos != std::string::npos; pos = out.find(secret, pos + kHidden.size())) {
      out.replace(pos, secret.size(), kHidden);
    }
  }
  return out;
}

}  // namespace idem
