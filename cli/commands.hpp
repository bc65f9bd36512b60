#pragma once

#include <string>
#include <string_view>

namespace CLI {
class App;
}

namespace idem::cli {

/// Exit codes: what a script calling idemctl can branch on.
inline constexpr int kExitFailure = 1;  ///< could not do the work (I/O error, store down, ...)
inline constexpr int kExitUsage = 2;    ///< bad arguments or bad input (e.g. invalid JSON)

/// Adds `idemctl canonicalize` (RFC 8785 form of the JSON on stdin).
void register_canonicalize(CLI::App& app);

/// Adds `idemctl fingerprint` (SPEC §5 fingerprint of a request whose body is on stdin).
void register_fingerprint(CLI::App& app);

/// All of standard input, as bytes. Throws CLI::RuntimeError(kExitFailure) if it cannot be read.
std::string read_stdin();

/// Writes `text` to standard output. Throws CLI::RuntimeError(kExitFailure) if it cannot.
void write_stdout(std::string_view text);

/// Prints "idemctl: <message>" on stderr and ends the command with `exit_code`, by throwing
/// CLI::RuntimeError, which main() turns into the process's exit status.
[[noreturn]] void fail(int exit_code, std::string_view message);

}  // namespace idem::cli
