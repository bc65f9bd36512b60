#pragma once

#include <string>
#include <string_view>

#include "common.hpp"

namespace CLI {
class App;
}

namespace idem::cli {

/// Adds `idemctl canonicalize` (RFC 8785 form of the JSON on stdin).
void register_canonicalize(CLI::App& app);

/// Adds `idemctl fingerprint` (SPEC §5 fingerprint of a request whose body is on stdin).
void register_fingerprint(CLI::App& app);

/// Adds `idemctl send` (one request with the client's retry semantics).
void register_send(CLI::App& app);

/// Adds `idemctl pending`, `idemctl dead-letters` and `idemctl resume` (a client journal).
void register_journal(CLI::App& app);

/// Adds the operator's store commands: get, list, purge, release, resolve, stats.
void register_store(CLI::App& app);

/// Adds `idemctl reconcile` (keys with an unknown outcome, resolved by the upstream's lookup).
void register_reconcile(CLI::App& app);

/// Adds `idemctl outbox` and its commands: list, show, retry, drop, stats.
void register_outbox(CLI::App& app);

/// Adds `idemctl holds` and its commands: list, show, drop, forget (keys a consumer holds).
void register_holds(CLI::App& app);

/// Adds `idemctl keys` and its commands: add, list, usage (encryption at rest).
void register_keys(CLI::App& app);

/// All of standard input, as bytes. Throws CLI::RuntimeError(kExitFailure) if it cannot be read.
std::string read_stdin();

/// Writes `text` to standard output. Throws CLI::RuntimeError(kExitFailure) if it cannot.
void write_stdout(std::string_view text);

/// Prints "idemctl: <message>" on stderr and ends the command with `exit_code`, by throwing
/// CLI::RuntimeError, which main() turns into the process's exit status.
[[noreturn]] void fail(int exit_code, std::string_view message);

/// Ends a command with `exit_code` after flushing stdout (a failed flush is exit 1 with a
/// message): how commands that return an exit code hand it to main().
void finish(int exit_code);

}  // namespace idem::cli
