#include "netstring.hpp"

#include <cstddef>

namespace idem::client::detail {
namespace {

void append(std::string& out, std::string_view s) {
  out += std::to_string(s.size());
  out.push_back(':');
  out.append(s);
  out.push_back(',');
}

// Reads one netstring at `pos`, advancing it.
std::optional<std::string> read(std::string_view text, std::size_t& pos) {
  std::size_t length = 0;
  std::size_t digits = 0;
  while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
    if (++digits > 10) return std::nullopt;
    length = length * 10 + static_cast<std::size_t>(text[pos] - '0');
    ++pos;
  }
  if (digits == 0 || pos >= text.size() || text[pos] != ':') return std::nullopt;
  ++pos;
  if (text.size() - pos < length + 1 || text[pos + length] != ',') return std::nullopt;
  std::string value(text.substr(pos, length));
  pos += length + 1;
  return value;
}

}  // namespace

std::string encode_headers(const Headers& headers) {
  std::string out;
  for (const auto& h : headers) {
    append(out, h.name);
    append(out, h.value);
  }
  return out;
}

std::optional<Headers> decode_headers(std::string_view text) {
  Headers headers;
  std::size_t pos = 0;
  while (pos < text.size()) {
    auto name = read(text, pos);
    if (!name) return std::nullopt;
    auto value = read(text, pos);
    if (!value) return std::nullopt;
    headers.push_back({std::move(*name), std::move(*value)});
  }
  return headers;
}

}  // namespace idem::client::detail
