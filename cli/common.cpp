#include "common.hpp"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <iterator>
#include <limits>

namespace idem::cli {
namespace {

bool is_token_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

int error(const Output& o, int exit_code, std::string_view message) {
  o.err << "idemctl: " << message << '\n';
  o.err.flush();
  return exit_code;
}

void write_json(std::ostream& out, const nlohmann::json& value) {
  out << value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
}

std::optional<Header> parse_header_line(std::string_view line) {
  const std::size_t colon = line.find(':');
  if (colon == std::string_view::npos || colon == 0) return std::nullopt;
  const std::string_view name = line.substr(0, colon);
  for (const char c : name) {
    if (!is_token_char(c)) return std::nullopt;
  }
  const std::string_view value = trim(line.substr(colon + 1));
  if (value.find_first_of(std::string_view("\r\n\0", 3)) != std::string_view::npos) return std::nullopt;
  return Header{std::string(name), std::string(value)};
}

std::optional<Millis> parse_duration(std::string_view text) {
  if (text.empty()) return std::nullopt;
  std::int64_t total = 0;
  while (!text.empty()) {
    std::int64_t n = 0;
    std::size_t digits = 0;
    while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') {
      if (n > std::numeric_limits<std::int64_t>::max() / 10 - 9) return std::nullopt;
      n = n * 10 + (text[digits] - '0');
      ++digits;
    }
    if (digits == 0) return std::nullopt;
    text.remove_prefix(digits);
    std::int64_t unit = 0;
    if (text.starts_with("ms")) {
      unit = 1;
      text.remove_prefix(2);
    } else if (!text.empty()) {
      switch (text.front()) {
        case 's': unit = 1000; break;
        case 'm': unit = 60'000; break;
        case 'h': unit = 3'600'000; break;
        case 'd': unit = 86'400'000; break;
        default: return std::nullopt;
      }
      text.remove_prefix(1);
    } else {
      return std::nullopt;  // a bare number: which unit was meant?
    }
    if (n > (std::numeric_limits<std::int64_t>::max() - total) / unit) return std::nullopt;
    total += n * unit;
  }
  return Millis{total};
}

std::string format_duration(Millis d) {
  const std::int64_t ms = d.count();
  struct Unit {
    std::int64_t ms;
    const char* name;
  };
  for (const Unit u : {Unit{86'400'000, "d"}, Unit{3'600'000, "h"}, Unit{60'000, "m"}, Unit{1000, "s"}}) {
    if (ms != 0 && ms % u.ms == 0) return std::to_string(ms / u.ms) + u.name;
  }
  return std::to_string(ms) + "ms";
}

std::string format_time(TimePoint t) {
  const std::int64_t ms = to_epoch_ms(t);
  std::int64_t secs = ms / 1000;
  std::int64_t frac = ms % 1000;
  if (frac < 0) {
    frac += 1000;
    --secs;
  }
  const std::time_t tt = static_cast<std::time_t>(secs);
  std::tm tm{};
  if (gmtime_r(&tt, &tm) == nullptr) return std::to_string(ms) + "ms";
  char buf[80];  // room for any int the compiler can imagine in each field
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ", tm.tm_year + 1900, tm.tm_mon + 1,
                tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<int>(frac));
  return buf;
}

std::optional<std::string> read_data_argument(const std::string& arg, std::string& error_message) {
  if (!arg.starts_with('@')) return arg;
  const std::string path = arg.substr(1);
  std::string data;
  if (path == "-") {
    char buf[1 << 16];
    for (;;) {
      const std::size_t n = std::fread(buf, 1, sizeof buf, stdin);
      data.append(buf, n);
      if (n < sizeof buf) break;
    }
    if (std::ferror(stdin)) {
      error_message = std::string("cannot read stdin: ") + std::strerror(errno);
      return std::nullopt;
    }
    return data;
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    error_message = "cannot read " + path + ": " + std::strerror(errno);
    return std::nullopt;
  }
  data.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (in.bad()) {
    error_message = "cannot read " + path;
    return std::nullopt;
  }
  return data;
}

std::string pad(std::string s, std::size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

std::string shell_quote(std::string_view s) {
  std::string out = "'";
  for (const char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

std::string json_quoted(std::string_view s) {
  return nlohmann::json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string base64(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const std::uint32_t v = (std::uint32_t(std::uint8_t(bytes[i])) << 16) |
                            (std::uint32_t(std::uint8_t(bytes[i + 1])) << 8) | std::uint8_t(bytes[i + 2]);
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += kAlphabet[(v >> 6) & 63];
    out += kAlphabet[v & 63];
  }
  if (const std::size_t rest = bytes.size() - i; rest > 0) {
    std::uint32_t v = std::uint32_t(std::uint8_t(bytes[i])) << 16;
    if (rest == 2) v |= std::uint32_t(std::uint8_t(bytes[i + 1])) << 8;
    out += kAlphabet[v >> 18];
    out += kAlphabet[(v >> 12) & 63];
    out += rest == 2 ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

nlohmann::json headers_json(const Headers& headers) {
  nlohmann::json out = nlohmann::json::array();
  for (const Header& h : headers) out.push_back({h.name, h.value});
  return out;
}

}  // namespace idem::cli
