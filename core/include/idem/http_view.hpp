#pragma once

#include <cstddef>
#include <span>
#include <string_view>

namespace idem {

/// A header as the core reads it: borrowed views into the caller's request.
struct HeaderView {
  std::string_view name;
  std::string_view value;
};

/// What the core needs of an HTTP request, independent of any HTTP library. Views borrow the
/// caller's buffers, which must outlive the call they are passed to.
struct RequestView {
  std::string_view method;  ///< e.g. "POST"
  std::string_view path;    ///< the target's path, without the query
  std::string_view query;   ///< the target's query, without '?'; empty if none
  std::span<const HeaderView> headers;
  std::string_view body;
};

/// ASCII case-insensitive equality, for header names. Inline: it runs for every header of every
/// message, mostly against constant names of another length, which the caller then rejects at
/// once.
inline bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    unsigned char x = static_cast<unsigned char>(a[i]);
    unsigned char y = static_cast<unsigned char>(b[i]);
    if (x >= 'A' && x <= 'Z') x += 'a' - 'A';
    if (y >= 'A' && y <= 'Z') y += 'a' - 'A';
    if (x != y) return false;
  }
  return true;
}

/// The first value of header `name`, or an empty view if absent.
std::string_view find_header(std::span<const HeaderView> headers, std::string_view name);

}  // namespace idem
