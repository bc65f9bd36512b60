#pragma once

// idem-relay's configuration (docs/outbox.md, "idem-relay"): a TOML file, then flags.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "idem/sidecar/settings.hpp"

namespace idem::relay {

using namespace std::chrono_literals;

/// Everything idem-relay runs with; defaults are written here and in docs/outbox.md.
struct Config {
  std::string outbox;  ///< sqlite:PATH or postgres://... (may carry a password)
  std::string sink;    ///< amqp://...?exchange=E, redis+stream://HOST:PORT/STREAM, http(s)://... (may carry a password)
  std::optional<sidecar::ListenAddress> admin_listen = sidecar::ListenAddress{"127.0.0.1", 9102};
  std::string name;                     ///< this relay's name on the rows it holds; default HOST-PID
  std::size_t batch = 100;              ///< rows claimed and published at once
  Millis poll_interval = 200ms;         ///< how long to wait when nothing is pending
  std::uint32_t max_attempts = 20;      ///< publishes of a row before it is dead
  Millis retry_min = 500ms;
  Millis retry_max = 60s;
  Millis lease = 60s;                   ///< PostgreSQL: rows held this long by a relay that vanished
  Millis retention = std::chrono::days(7);  ///< sent rows are deleted after this
  Millis webhook_timeout = 30s;         ///< one POST to a webhook
  /// Files of Standard Webhooks secrets (whsec_<base64>, one per line): the webhook sink signs
  /// every POST with each of them. Empty: unsigned.
  std::vector<std::string> webhook_secret_file;
  /// An https:// webhook: a CA bundle to verify its certificate against instead of the system's.
  std::string webhook_ca_file;
  /// An https:// webhook that asks for one (mutual TLS): the client certificate (PEM) and its
  /// key, read like a private file (0600 or 0640); an encrypted key's passphrase in a file of its
  /// own (its first line).
  std::string webhook_cert_file;
  std::string webhook_key_file;
  std::string webhook_key_passphrase_file;
  Millis connect_timeout = 5s;
  Millis confirm_timeout = 10s;         ///< a broker's publisher confirm
  /// What a dead row does to the later rows of its ordering key: "hold" them until an operator
  /// retries or drops it (the default), or let them "pass".
  std::string dead_rows = "hold";
  /// Destinations (comma-separated) whose dead rows let their key's later rows pass whatever
  /// dead_rows says.
  std::string dead_rows_pass;
  gateway::LogLevel log_level = gateway::LogLevel::info;
};

using sidecar::Flags;

/// Reads the file (if any), applies the flags, checks the whole. Throws sidecar::ConfigError.
Config load(const Flags& flags);

/// The same for TOML text (tests).
Config parse(std::string_view toml, const Flags& flags);

}  // namespace idem::relay
