#pragma once

#include <memory>

#include "idem/engine.hpp"
#include "idem/gateway/config.hpp"

namespace idem::gateway {

/// idem-gateway's server: the client listener, one event loop per thread, the admin listener,
/// the reaper and graceful shutdown. Keeps Boost out of main.cpp.
class Gateway {
 public:
  /// `config`, `engine` and the engine's store must outlive the Gateway.
  Gateway(const Config& config, Engine& engine);
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
  void run();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::gateway
