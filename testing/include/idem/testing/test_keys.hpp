#pragma once

// Encryption keys for tests: fixed bytes, never random (a failing test must fail the same way
// again), written as key-file lines (idem/encryption.hpp).

#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include "idem/encryption.hpp"

namespace idem::testing {

/// Standard padded base64 (RFC 4648 §4) of `bytes`.
inline std::string test_base64(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  std::size_t i = 0;
  const auto at = [&](std::size_t j) { return static_cast<unsigned>(static_cast<unsigned char>(bytes[j])); };
  for (; i + 2 < bytes.size(); i += 3) {
    const unsigned n = (at(i) << 16) | (at(i + 1) << 8) | at(i + 2);
    for (int s : {18, 12, 6, 0}) out.push_back(kAlphabet[(n >> s) & 63]);
  }
  if (i + 1 == bytes.size()) {
    const unsigned n = at(i) << 16;
    out += {kAlphabet[(n >> 18) & 63], kAlphabet[(n >> 12) & 63], '=', '='};
  } else if (i + 2 == bytes.size()) {
    const unsigned n = (at(i) << 16) | (at(i + 1) << 8);
    out += {kAlphabet[(n >> 18) & 63], kAlphabet[(n >> 12) & 63], kAlphabet[(n >> 6) & 63], '='};
  }
  return out;
}

/// Test key number `n`: 32 bytes of value n.
inline std::string test_key_bytes(unsigned char n) { return std::string(32, static_cast<char>(n)); }

/// A key-file line for test key `n` under `id`, with an optional flag ("decrypt-only").
inline std::string test_key_line(std::string_view id, unsigned char n, std::string_view flag = "") {
  std::string line = std::string(id) + " " + test_base64(test_key_bytes(n));
  if (!flag.empty()) line += " " + std::string(flag);
  return line + "\n";
}

/// The ring of a key file's text; throws if it does not parse (a bug in the test).
inline std::shared_ptr<const KeyRing> test_key_ring(const std::string& text) {
  auto ring = KeyRing::parse(text, "test keys");
  if (!ring) throw std::invalid_argument(ring.error());
  return *ring;
}

}  // namespace idem::testing
