#pragma once

// Internal to idem-gateway: what the Beast translation units (proxy.cpp, server.cpp) share.

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "idem/engine.hpp"
#include "idem/gateway/config.hpp"
#include "idem/gateway/metrics.hpp"
#include "idem/gateway/routes.hpp"
#include "idem/gateway/tenant.hpp"
#include "idem/http/beast.hpp"
#include "store_deadline.hpp"
#include "timed_stream.hpp"

namespace idem::gateway {

namespace asio = boost::asio;
namespace beast = boost::beast;
using tcp = asio::ip::tcp;

// Every coroutine, socket and stream of the gateway runs on one io_context, so they name its
// executor type (Executor, timed_stream.hpp) instead of the type-erased any_io_executor, whose
// copies, moves and property queries go through function pointers on every operation of the
// request path.
template <class T>
using Task = asio::awaitable<T, Executor>;
using Stream = TimedStream;
using Acceptor = asio::basic_socket_acceptor<tcp, Executor>;
inline constexpr asio::use_awaitable_t<Executor> kAwait{};

/// The upstream's addresses, shared by every event loop. The gateway resolves the host again
/// while it runs (Gateway::Impl::resolve_upstream), so an upstream whose address changes (a
/// container that restarted) or that does not resolve yet at start-up is followed without a
/// restart. Thread-safe.
class UpstreamAddresses {
 public:
  using Endpoints = std::vector<tcp::endpoint>;

  /// The addresses last resolved: empty while the host has never resolved.
  std::shared_ptr<const Endpoints> get() const {
    std::lock_guard lock(mutex_);
    return endpoints_;
  }
  /// Why the last resolution failed; empty when it succeeded.
  std::string error() const {
    std::lock_guard lock(mutex_);
    return error_;
  }
  void set(Endpoints endpoints) {
    std::lock_guard lock(mutex_);
    endpoints_ = std::make_shared<const Endpoints>(std::move(endpoints));
    error_.clear();
  }
  /// The last good addresses stay in use.
  void set_error(std::string why) {
    std::lock_guard lock(mutex_);
    error_ = std::move(why);
  }
  /// A connection to the upstream failed: look the host up again soon.
  void request_refresh() const { refresh_.store(true, std::memory_order_relaxed); }
  bool take_refresh_request() { return refresh_.exchange(false, std::memory_order_relaxed); }

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<const Endpoints> endpoints_ = std::make_shared<const Endpoints>();
  std::string error_;
  mutable std::atomic<bool> refresh_{false};
};

/// State every event loop shares: read-only but for the upstream's addresses.
struct Shared {
  const Config& config;
  const Router& router;
  Engine& engine;
  UpstreamAddresses upstream;
};

/// One upstream connection and the bytes read from it but not yet parsed.
struct UpstreamConn {
  UpstreamConn(Deadlines& deadlines, const Executor& ex) : stream(deadlines, ex) {}
  Stream stream;
  beast::flat_buffer buffer;
  std::chrono::steady_clock::time_point idle_since{};
};

/// Keep-alive connections to the upstream, one pool per event loop (so no locks): LIFO reuse
/// (the most recently used connection is the least likely to have been closed by the upstream),
/// idle connections closed after upstream_idle_timeout, and a liveness check before reusing a
/// connection that sat idle for a second or more (see acquire).
class UpstreamPool {
 public:
  UpstreamPool(asio::io_context& io, Deadlines& deadlines, const Shared& shared, MetricsShard& metrics)
      : io_(io), deadlines_(deadlines), shared_(shared), metrics_(metrics) {}

  /// A connection: a pooled one unless `fresh`, else a new one. On failure `conn` is null and
  /// `ec` says why; nothing was sent anywhere.
  struct Acquired {
    std::unique_ptr<UpstreamConn> conn;
    bool reused = false;
    beast::error_code ec;
  };
  Task<Acquired> acquire(bool fresh);

  /// Returns a connection whose last response was read completely and which the upstream keeps
  /// alive; it is closed instead when the pool is full.
  void release(std::unique_ptr<UpstreamConn> conn);

  /// Closes idle connections older than upstream_idle_timeout.
  void sweep();

  /// Closes every idle connection.
  void clear() { idle_.clear(); }

 private:
  asio::io_context& io_;
  Deadlines& deadlines_;
  const Shared& shared_;
  MetricsShard& metrics_;
  std::vector<std::unique_ptr<UpstreamConn>> idle_;
};

struct Session;

/// One event loop: its io_context, thread-confined upstream pool, metrics shard and sessions.
class Worker {
 public:
  Worker(std::size_t index, const Shared& shared, MetricsShard& metrics)
      : store_deadlines(metrics.store_timeouts),
        index(index),
        shared(shared),
        metrics(metrics),
        pool(*io, deadlines, shared, metrics),
        tenants(shared.config.tenant, shared.config.routes) {}
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  std::unique_ptr<asio::io_context> io = std::make_unique<asio::io_context>(1);
  Deadlines deadlines;  // of every stream on this loop; swept by Gateway::Impl::watch_deadlines
  StoreDeadlines store_deadlines;  // of every store call on this loop; swept with `deadlines`
  const std::size_t index;
  const Shared& shared;
  MetricsShard& metrics;
  UpstreamPool pool;
  /// This loop's tenant derivation, with its JWT verifiers and their caches (no locks).
  TenantSources tenants;

  // Touched only on this worker's thread.
  bool draining = false;
  Session* sessions = nullptr;  // intrusive list of live sessions

  /// Open client connections; read by other threads (max_connections, drain).
  std::atomic<std::size_t> open{0};

  /// Sets `draining` and closes every session waiting for its next request. On this thread.
  void drain();
};

/// Serves one client connection until it closes, times out, or the worker drains.
Task<void> run_session(Worker& worker, Socket socket);

}  // namespace idem::gateway
