#pragma once

// Files that hold secrets (the [encryption] key file, webhook secret files): read only when no
// other user can read or change them.

#include <cstddef>
#include <expected>
#include <string>
#include <string_view>

namespace idem {

/// The bytes of `path`, which must be a regular file that other users can neither read nor
/// write, nor its group write (0600, or 0640 for the service's group), checked on the opened
/// descriptor so that a file swapped in between cannot slip through; at most `max_size` bytes.
/// Errors name the file as `what` ("key file") and the limit as `size_text` ("1 MiB"), never its
/// contents. A failed read wipes what was read; the caller wipes the bytes it gets when done.
std::expected<std::string, std::string> read_private_file(const std::string& path, std::string_view what,
                                                          std::size_t max_size, std::string_view size_text);

}  // namespace idem
