#pragma once

#include <cstddef>
#include <expected>
#include <span>
#include <string>
#include <string_view>

namespace idem {

/// Why a text is not JSON this canonicaliser accepts.
struct JsonError {
  std::string message;  ///< one line, e.g. "duplicate object key \"a\""
  std::size_t offset = 0;  ///< byte offset in the input where it went wrong
};

/// Canonicalises JSON per RFC 8785 (JCS): members sorted by their UTF-16 code units, no
/// insignificant whitespace, strings with minimal escaping, numbers in ECMAScript's
/// Number.prototype.toString form. Rejects what RFC 8785 rejects: invalid JSON (RFC 8259),
/// duplicate member names, lone surrogates, numbers that are not finite IEEE-754 doubles.
///
/// `exclude` lists RFC 6901 JSON Pointers whose values are left out of the result (e.g.
/// "/client_ts"); a pointer that matches nothing is ignored, and so are "" (the whole document)
/// and malformed pointers. Indices refer to the input's arrays. Excluded values must still be
/// valid JSON.
///
/// Also rejected: nesting deeper than 512 arrays/objects, inputs over 256 MiB. Numbers too
/// small for a double read as 0, as ECMAScript's JSON.parse does; too large ones are errors.
std::expected<std::string, JsonError> canonicalize_json(std::string_view json,
                                                        std::span<const std::string> exclude = {});

/// Formats a double as ECMAScript's Number.prototype.toString does (RFC 8785 §3.2.2.3).
/// `value` should be finite: NaN and infinities give "NaN", "Infinity", "-Infinity", not JSON.
std::string format_json_number(double value);

}  // namespace idem
