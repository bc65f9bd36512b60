#pragma once

// Stored response headers as one compact, binary-safe blob: the form every store persists.
//
// Layout (version 1):   0x01  count  (name_len name value_len value){count}
// where count and the lengths are unsigned LEB128 varints and names and values are raw bytes,
// so any byte (NUL, CR/LF, non-UTF-8) survives. The leading version byte lets a later format
// coexist with rows written by this one.

#include <optional>
#include <string>
#include <string_view>

#include "idem/record.hpp"

namespace idem {

/// Encodes headers, in order, repeats included.
std::string encode_headers(const Headers& headers);

/// Decodes what encode_headers produced; nullopt for anything malformed (truncated, overlong,
/// trailing bytes, unknown version).
std::optional<Headers> decode_headers(std::string_view blob);

}  // namespace idem
