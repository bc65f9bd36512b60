#pragma once

// A Redis reply owned by us: hiredis's redisReply is converted once, on the node thread, so
// callbacks can keep it and hiredis stays out of every header but connection.hpp's source.

#include <cstdint>
#include <string>
#include <vector>

namespace idem::redis_detail {

/// One RESP2 reply.
struct Reply {
  enum class Type : std::uint8_t { string, array, integer, nil, status, error };
  Type type = Type::nil;
  std::string str;               ///< string, status and error replies
  long long integer = 0;         ///< integer replies
  std::vector<Reply> elements;   ///< array replies

  bool is_error() const { return type == Type::error; }
  bool is_array() const { return type == Type::array; }
  /// Bulk or status text.
  bool is_text() const { return type == Type::string || type == Type::status; }
};

}  // namespace idem::redis_detail
