#pragma once

// Percent-decoding for the parsers of idem's URLs (broker sources and sinks).

#include <expected>
#include <string>
#include <string_view>
#include <vector>

namespace idem {

/// `in` with its %XX escapes decoded. Strict: a '%' must start a two-digit hex escape (a stray
/// '%' in a password is a typo to report, not a character to guess about). The error names
/// `what` ("the password", ...), never the text itself, which may be a secret.
std::expected<std::string, std::string> percent_decode(std::string_view in, std::string_view what);

struct UrlParameter {
  std::string name;
  std::string value;
};

/// A URL's query (what follows '?'), split at '&', each name and value percent-decoded, in
/// order: empty items are skipped, an item without '=' has an empty value, a name given twice is
/// refused. Errors name the parameter, never quote a value (it may be a password).
std::expected<std::vector<UrlParameter>, std::string> query_parameters(std::string_view query);

}  // namespace idem
