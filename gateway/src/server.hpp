#pragma once

#include <expected>
#include <functional>
#include <memory>
#include <string>

#include "idem/engine.hpp"
#include "idem/gateway/config.hpp"

namespace idem {
class EncryptedStore;
}

namespace idem::gateway {

/// Loads the configuration again for a reload (SIGHUP): the same file and command-line flags as at
/// start-up. The new configuration, or why not in one line (a ConfigError's message).
using Reloader = std::function<std::expected<std::shared_ptr<const Config>, std::string>()>;

/// idem-gateway's server: the client listener, one event loop per thread, the admin listener,
/// the reaper, reloads on SIGHUP and graceful shutdown. Keeps Boost out of main.cpp.
class Gateway {
 public:
  /// `engine`, the engine's store and `encrypted` (the store's encrypting decorator, null without
  /// [encryption]: a reload swaps its key ring) must outlive the Gateway. `reloader` reads the
  /// configuration again on SIGHUP.
  Gateway(std::shared_ptr<const Config> config, Engine& engine, EncryptedStore* encrypted, Reloader reloader);
  /// Destroys the event loops (and any request still suspended in them). Destroy the store
  /// before the Gateway, after run() returned, so its last callbacks find their loops.
  ~Gateway();
  Gateway(const Gateway&) = delete;
  Gateway& operator=(const Gateway&) = delete;

  /// Resolves the upstream and binds both listeners; throws std::runtime_error naming what
  /// failed ("listen 127.0.0.1:8080: Address already in use").
  void start();

  /// Serves until SIGINT/SIGTERM, then stops accepting, lets in-flight requests finish (at most
  /// drain_timeout) and returns once every event loop has stopped. A second signal stops at once.
  /// SIGHUP reloads the configuration (docs/gateway.md, Reloading).
  void run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::gateway
