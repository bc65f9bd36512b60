#pragma once

// idem-consume's configuration (docs/idem-consume.md): a TOML file, then flags.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "idem/consume_loop.hpp"
#include "idem/record.hpp"
#include "idem/sidecar/settings.hpp"

namespace idem::consume {

using namespace std::chrono_literals;

/// Everything idem-consume runs with; defaults are written here and in docs/idem-consume.md.
struct Config {
  std::string source;   ///< amqp://... or redis+stream://... (may carry a password)
  std::string deliver;  ///< the handler: http://HOST[:PORT]/PATH (may carry a password)
  std::string store = "sqlite:./var/consume.db";
  std::optional<sidecar::ListenAddress> admin_listen = sidecar::ListenAddress{"127.0.0.1", 9101};
  /// The consumer's name: records live under tenant "consumer NAME". Default: the source's queue,
  /// or STREAM/GROUP.
  std::string name;
  /// This replica's name at the broker (stream consumer, AMQP consumer tag, Kafka client id).
  /// Default HOSTNAME-PID. A stable one lets a restarted replica take its own unacknowledged
  /// stream entries first (before new ones: what ordering = "key" needs on Redis Streams).
  std::string consumer;

  std::size_t workers = 8;               ///< deliveries to the handler at once
  std::size_t prefetch = 64;             ///< deliveries held unacknowledged at once
  /// "key": deliveries with the same ordering key go to the handler one at a time, in delivery
  /// order (ConsumeOrdering::key); "none": side by side.
  ConsumeOrdering ordering = ConsumeOrdering::none;
  /// ordering = "key": after a delivery is dead-lettered, its key's later deliveries are parked
  /// behind it until replayed in order ("hold", ConsumeLoopOptions::holds), or run ("pass").
  bool hold_after_dead_letter = true;
  std::uint32_t max_attempts = 5;        ///< tries (the broker's deliveries included) before "poison"
  std::size_t max_message_bytes = 1024 * 1024;
  Millis handler_timeout = 30s;          ///< one POST to the handler, sent to answered
  /// Files of Standard Webhooks secrets (whsec_<base64>, one per line): every POST to the handler
  /// is signed with each of them (docs/webhooks.md, "Sending"). Empty: unsigned.
  std::vector<std::string> sign_secret_file;
  /// An https:// handler: a CA bundle to verify its certificate against instead of the system's.
  std::string handler_ca_file;
  /// An https:// handler that asks for one (mutual TLS): the client certificate (PEM) and its
  /// key, read like a private file (0600 or 0640); an encrypted key's passphrase in a file of its
  /// own (its first line).
  std::string handler_cert_file;
  std::string handler_key_file;
  std::string handler_key_passphrase_file;
  Millis lease = 5min;                   ///< how long a delivery holds its message id
  Millis retention = std::chrono::days(7);  ///< how long a processed id is remembered
  LeaseExpiry on_lease_expiry = LeaseExpiry::reexecute;
  Millis retry_min = 1s;
  Millis retry_max = 60s;
  Millis drain_timeout = 30s;
  Millis claim_idle = 60s;               ///< streams: reclaim entries idle this long at a dead consumer
  Millis connect_timeout = 5s;
  gateway::LogLevel log_level = gateway::LogLevel::info;
};

using sidecar::Flags;

/// Reads the file (if any), applies the flags, checks the whole. Throws sidecar::ConfigError with
/// one line naming the problem.
Config load(const Flags& flags);

/// The same for TOML text (tests).
Config parse(std::string_view toml, const Flags& flags);

}  // namespace idem::consume
