#pragma once

// Redis Cluster key slots: CRC16-CCITT (XMODEM) of the key's hash tag, modulo 16384, exactly as
// the server computes them (cluster.c keyHashSlot), so the store routes each key to its owner.

#include <cstdint>
#include <string_view>

namespace idem::redis_detail {

/// Number of hash slots of a Redis Cluster.
inline constexpr int kSlots = 16384;

/// CRC16 (polynomial 0x1021, initial value 0, no reflection) — the XMODEM variant Redis uses.
std::uint16_t crc16(std::string_view data);

/// The slot of `key`: the CRC16 of its hash tag (the bytes between the first `{` and the next
/// `}`, when that is non-empty), else of the whole key, modulo 16384.
int key_slot(std::string_view key);

}  // namespace idem::redis_detail
