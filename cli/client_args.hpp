#pragma once

// Options every command that sends shares (send, dead-letters retry, resume): the retry policy and
// the transport, as flags, turned into a Client.

#include <memory>
#include <string>

#include "idem/client/client.hpp"

namespace CLI {
class App;
}

namespace idem::cli {

/// The flags, as parsed (durations still text: CLI11 validates them).
struct ClientArgs {
  int attempts = client::RetryOptions{}.max_attempts;
  std::string timeout = "30s";      ///< RetryOptions::attempt_timeout
  std::string deadline = "5m";      ///< RetryOptions::deadline
  std::string retry_delay = "1s";   ///< RetryOptions::base_delay
  std::string key_header = "Idempotency-Key";
  bool insecure = false;
  std::string cacert;
};

/// Adds --attempts, --timeout, --deadline, --retry-delay, --key-header, -k/--insecure, --cacert.
void add_client_options(CLI::App* cmd, const std::shared_ptr<ClientArgs>& args);

/// The ClientOptions the flags describe.
client::ClientOptions client_options(const ClientArgs& args);

/// Whether a command may start a journal. Only `send` may: the commands that read what was sent
/// (pending, dead-letters, resume) would turn a mistyped path into an empty journal that says
/// "nothing pending" while the real one still holds unanswered operations.
enum class JournalUse { may_create, must_exist };

/// A Client with a libcurl transport configured by the flags, and the journal at `journal_path`
/// (none when empty). Ends the command (exit 1) if the journal cannot be opened.
std::unique_ptr<client::Client> make_client(const ClientArgs& args, const std::string& journal_path, JournalUse use);

/// Opens the journal at `path` or ends the command (exit 1).
std::shared_ptr<client::Journal> open_journal_or_fail(const std::string& path, JournalUse use);

}  // namespace idem::cli
