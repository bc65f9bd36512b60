#pragma once

// Percent-decoding for the parsers of idem's URLs (broker sources and sinks).

#include <expected>
#include <string>
#include <string_view>

namespace idem {

/// `in` with its %XX escapes decoded. Strict: a '%' must start a two-digit hex escape (a stray
/// '%' in a password is a typo to report, not a character to guess about). The error names
/// `what` ("the password", ...), never the text itself, which may be a secret.
std::expected<std::string, std::string> percent_decode(std::string_view in, std::string_view what);

}  // namespace idem
