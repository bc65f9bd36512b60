#include "idem/client/key.hpp"

#include <openssl/err.h>
#include <openssl/rand.h>

#include <array>
#include <cstdint>

namespace idem::client {

std::expected<std::string, std::string> new_key() {
  std::array<unsigned char, 16> bytes{};
  if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1) {
    char reason[256];
    ERR_error_string_n(ERR_get_error(), reason, sizeof reason);
    return std::unexpected(std::string("RAND_bytes failed: ") + reason);
  }
  // RFC 4122 §4.4: version 4 in the high nibble of byte 6, variant 10xx in byte 8.
  bytes[6] = static_cast<unsigned char>((bytes[6] & 0x0f) | 0x40);
  bytes[8] = static_cast<unsigned char>((bytes[8] & 0x3f) | 0x80);

  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(36);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out.push_back('-');
    out.push_back(kHex[bytes[i] >> 4]);
    out.push_back(kHex[bytes[i] & 0x0f]);
  }
  return out;
}

bool is_uuid_v4(std::string_view s) {
  if (s.size() != 36) return false;
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (i == 8 || i == 13 || i == 18 || i == 23) {
      if (c != '-') return false;
      continue;
    }
    const bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
    if (!hex) return false;
  }
  const char variant = s[19];
  return s[14] == '4' && (variant == '8' || variant == '9' || variant == 'a' || variant == 'b' ||
                          variant == 'A' || variant == 'B');
}

}  // namespace idem::client
