#pragma once

// What idem-consume and idem-relay share around their work: settings read from a TOML file and
// then from flags (flags win), with one definition of each key for both; and the stop signal.

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.hpp"
#include "idem/gateway/config.hpp"  // ConfigError, ListenAddress, parse_duration, parse_size

namespace idem::sidecar {

using gateway::ConfigError;
using gateway::ListenAddress;

/// The keys a sidecar accepts, each bound to the variable it sets. A key is set from the TOML
/// file (typed: strings, integers, booleans; durations and sizes as strings with units, sizes
/// also as integers) and from a flag (always text, parsed like the file's string form).
/// Errors are ConfigErrors naming the file or flag, the key and the line: "consume.toml:
/// workers: 0 is outside 1..256 (line 3)".
class Settings {
 public:
  /// A URL or name; `secret` values (URLs with passwords) are never echoed in errors.
  void text(std::string key, std::string& target, bool secret = false);
  void duration(std::string key, Millis& target, bool allow_zero = false);
  void size(std::string key, std::size_t& target, std::uint64_t min = 0);
  void integer(std::string key, std::int64_t min, std::int64_t max, std::function<void(std::int64_t)> set);
  void boolean(std::string key, bool& target);
  /// One of `choices`.
  void choice(std::string key, std::vector<std::string> choices, std::function<void(const std::string&)> set);
  /// "HOST:PORT", or "off" for none.
  void listen(std::string key, std::optional<ListenAddress>& target);
  /// File paths: a string or an array of strings in the file; comma-separated in a flag. Each
  /// given value replaces the list.
  void paths(std::string key, std::vector<std::string>& target);

  /// Reads a TOML file: every key must be one of the above.
  void read_file(const std::string& path);
  /// The same for TOML text; `source` names it in errors.
  void read_text(std::string_view toml, std::string_view source);
  /// A flag: `flag` ("--source") names it in errors.
  void set_from_flag(const std::string& key, std::string_view flag, std::string_view value);

  /// Whether `key` was given, by the file or a flag.
  bool given(const std::string& key) const { return given_.count(key) > 0; }

 private:
  struct Key {
    enum class Kind { text, duration, size, integer, boolean, choice, listen, paths } kind;
    std::function<void(const std::string& text)> from_text;   // throws ConfigError (no context)
    std::function<void(std::int64_t)> from_integer;           // sizes and integers
    std::function<void(bool)> from_bool;
    bool secret = false;
    std::function<void(const std::vector<std::string>&)> from_list = {};  // paths: a TOML array
  };
  void add(std::string key, Key k);
  std::map<std::string, Key> keys_;
  std::map<std::string, bool> given_;
};

/// "--admin-listen" for the key "admin_listen".
std::string flag_for(std::string_view key);

/// "HOSTNAME-PID": a name no other process has at the same time (a relay's lease owner, a
/// stream consumer's name).
std::string host_and_pid();

/// The flags a sidecar was given: the configuration file, and (key, value) pairs that replace
/// the file's values.
struct Flags {
  std::optional<std::string> config;
  std::vector<std::pair<std::string, std::string>> settings;
};

/// Blocks SIGTERM, SIGINT and SIGHUP in the calling thread (call it first in main, before any
/// thread starts, so every thread inherits the mask) and starts a thread that waits for them:
/// SIGTERM and SIGINT call `stop` once (a second one exits at once with status 1); SIGHUP calls
/// `hangup`, if given (otherwise it is ignored). The calls run on that thread.
class StopSignals {
 public:
  explicit StopSignals(std::function<void(int signal)> stop, std::function<void()> hangup = {});
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  struct Impl;
  Impl* impl_;
};

/// Blocks the stop signals in the calling thread; StopSignals does it too, for the threads
/// started after it.
void block_stop_signals();

}  // namespace idem::sidecar
