#pragma once

#include <cstddef>
#include <expected>
#include <span>
#include <string>
#include <string_view>

namespace idem {

/// Whether every character is visible ASCII (0x21-0x7E): the character rule for keys (SPEC §2),
/// verbatim tenants and message ids. True for an empty string; callers bound the length.
bool all_visible_ascii(std::string_view s);

/// Length bounds for keys after unquoting (SPEC §2).
struct KeyRules {
  std::size_t min_length = 16;
  std::size_t max_length = 256;
};

/// Why a key header was refused.
enum class KeyErrc { missing, invalid };

/// A refused key header, with a sentence for the client saying what was wrong.
struct KeyError {
  KeyErrc code = KeyErrc::invalid;
  std::string detail;
};

/// Parses the values of every occurrence of the key header in one request.
///
/// Accepts exactly one occurrence, either a Structured Field string (`"abc"` with `\"` and `\\`
/// escapes) or the bare form Stripe clients send (`abc`). The unquoted key must be within the
/// length bounds and made only of visible ASCII (0x21-0x7E). No occurrence is `missing`; two
/// occurrences, or a list (a comma in the bare form, anything after the closing quote), are
/// `invalid`: proxies merge repeated headers into comma lists, so a comma is ambiguous.
std::expected<std::string, KeyError> parse_key(std::span<const std::string_view> header_values,
                                               const KeyRules& rules = {});

}  // namespace idem
