#pragma once

// The `response_headers` column (bytea): stored headers as one compact blob.
// The same format as the SQLite store's (a copy of stores/sqlite/src/headers_codec.*), so tools
// read both alike; the two copies belong in the core once a third store needs them.
//
// Layout (version 1):   0x01  count  (name_len name value_len value){count}
// where count and the lengths are unsigned LEB128 varints and names and values are raw bytes,
// so any byte (NUL, CR/LF, non-UTF-8) survives. The leading version byte lets a later format
// coexist with rows written by this one.

#include <optional>
#include <string>
#include <string_view>

#include "idem/record.hpp"

namespace idem::postgres_detail {

/// Encodes headers, in order, repeats included.
std::string encode_headers(const Headers& headers);

/// Decodes what encode_headers produced; nullopt for anything malformed (truncated, overlong,
/// trailing bytes, unknown version).
std::optional<Headers> decode_headers(std::string_view blob);

}  // namespace idem::postgres_detail
