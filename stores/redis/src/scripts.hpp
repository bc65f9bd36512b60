#pragma once

// The Lua scripts, one per step, each on a single key. Their sources are stores/redis/lua/*.lua,
// compiled in by CMake (scripts.cpp.in), so the store and bench/redis_benchmark.sh run the
// same text and hence the same SHA1.

#include <cstdint>
#include <string>
#include <string_view>

namespace idem::redis_detail {

/// One script: its name, its source and the SHA1 EVALSHA knows it by.
struct Script {
  std::string_view name;
  std::string_view source;
  std::string sha1;  ///< lowercase hex, as SCRIPT LOAD answers
};

enum class ScriptId : std::uint8_t { claim, complete, fail, release, mark_retryable, resolve, purge, abandon };

/// The script `id` (SHA1 computed once, at first use).
const Script& script(ScriptId id);

/// Lowercase hex SHA1 of `data` (what Redis names a script by).
std::string sha1_hex(std::string_view data);

}  // namespace idem::redis_detail
