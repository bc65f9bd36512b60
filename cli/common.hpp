#pragma once

// What idemctl's commands share: argument parsing (headers, durations, data arguments) and output
// (ISO-8601 times, JSON). No CLI11 here, so the command functions can be tested in-process.

#include <nlohmann/json.hpp>

#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include "idem/clock.hpp"
#include "idem/record.hpp"

namespace idem::cli {

/// Exit codes: what a script calling idemctl can branch on.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  ///< could not do the work, not found, wrong state, non-2xx
inline constexpr int kExitUsage = 2;    ///< bad arguments or bad input (e.g. invalid JSON)

/// Where a command writes: `out` gets the result (raw bytes or JSON), `err` one-line messages
/// prefixed "idemctl: ". Tests pass string streams.
struct Output {
  std::ostream& out;
  std::ostream& err;
  bool json = false;  ///< machine-readable output on `out` instead of text
};

/// Writes "idemctl: <message>\n" to `o.err` and returns `exit_code`, for `return error(...)`.
int error(const Output& o, int exit_code, std::string_view message);

/// Writes `value` as one line of JSON (invalid UTF-8 replaced, never thrown on).
void write_json(std::ostream& out, const nlohmann::json& value);

/// "Name: value" -> {Name, value} with the value's surrounding blanks trimmed; nullopt unless the
/// name is a non-empty HTTP token and the value has no CR, LF or NUL.
std::optional<Header> parse_header_line(std::string_view line);

/// A duration as the gateway's config writes them: integers with a unit (ms, s, m, h, d), several
/// summed ("1h30m"). nullopt for anything else, a bare number included.
std::optional<Millis> parse_duration(std::string_view text);

/// Shortest form parse_duration reads back: "1500ms", "30s", "5m", "24h".
std::string format_duration(Millis d);

/// ISO-8601 UTC with milliseconds: "2024-05-01T12:00:00.123Z".
std::string format_time(TimePoint t);

/// A data argument as curl reads them: "@FILE" is the file's bytes, "@-" standard input, anything
/// else the argument itself. The error says which file could not be read.
std::optional<std::string> read_data_argument(const std::string& arg, std::string& error_message);

/// `s` padded with spaces to `width` (text tables).
std::string pad(std::string s, std::size_t width);

/// `s` quoted for a POSIX shell ('...'), for commands printed as hints.
std::string shell_quote(std::string_view s);

/// `s` as a JSON string literal ("..."), for names and messages quoted in one-line output.
std::string json_quoted(std::string_view s);

/// Standard base64 (RFC 4648 §4, padded): how JSON output carries bodies that may be binary.
std::string base64(std::string_view bytes);

/// Headers as JSON: [["Name","value"], ...], order and repeats kept.
nlohmann::json headers_json(const Headers& headers);

}  // namespace idem::cli
