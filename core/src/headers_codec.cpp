#include "idem/headers_codec.hpp"

#include <cstdint>

namespace idem {
namespace {

constexpr unsigned char kVersion = 0x01;

void put_varint(std::string& out, std::uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

// Reads a varint at the front of `in` and consumes it; nullopt when truncated or longer than a
// 64-bit value can be.
std::optional<std::uint64_t> take_varint(std::string_view& in) {
  std::uint64_t value = 0;
  for (int shift = 0, i = 0; i < 10 && i < static_cast<int>(in.size()); ++i, shift += 7) {
    const auto byte = static_cast<std::uint8_t>(in[static_cast<std::size_t>(i)]);
    if (i == 9 && byte > 1) return std::nullopt;  // would overflow 64 bits
    value |= static_cast<std::uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) {
      in.remove_prefix(static_cast<std::size_t>(i) + 1);
      return value;
    }
  }
  return std::nullopt;
}

std::optional<std::string> take_bytes(std::string_view& in) {
  auto size = take_varint(in);
  if (!size || *size > in.size()) return std::nullopt;
  std::string bytes(in.substr(0, static_cast<std::size_t>(*size)));
  in.remove_prefix(static_cast<std::size_t>(*size));
  return bytes;
}

}  // namespace

std::string encode_headers(const Headers& headers) {
  std::size_t size = 1 + 10;
  for (const auto& h : headers) size += h.name.size() + h.value.size() + 20;
  std::string out;
  out.reserve(size);
  out.push_back(static_cast<char>(kVersion));
  put_varint(out, headers.size());
  for (const auto& h : headers) {
    put_varint(out, h.name.size());
    out += h.name;
    put_varint(out, h.value.size());
    out += h.value;
  }
  return out;
}

std::optional<Headers> decode_headers(std::string_view blob) {
  if (blob.empty() || static_cast<unsigned char>(blob.front()) != kVersion) return std::nullopt;
  blob.remove_prefix(1);
  auto count = take_varint(blob);
  // Each header takes at least two bytes (two empty lengths): a larger count is a lie, and
  // trusting it would reserve unbounded memory.
  if (!count || *count > blob.size() / 2) return std::nullopt;
  Headers headers;
  headers.reserve(static_cast<std::size_t>(*count));
  for (std::uint64_t i = 0; i < *count; ++i) {
    auto name = take_bytes(blob);
    if (!name) return std::nullopt;
    auto value = take_bytes(blob);
    if (!value) return std::nullopt;
    headers.push_back(Header{std::move(*name), std::move(*value)});
  }
  if (!blob.empty()) return std::nullopt;
  return headers;
}

}  // namespace idem
