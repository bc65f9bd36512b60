#pragma once

// Internal to idem-gateway: what the Beast translation units (proxy.cpp, server.cpp) share.

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <boost/asio/awaitable.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>

#include <algorithm>
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
#include "idem/gateway/runtime.hpp"
#include "idem/gateway/tenant.hpp"
#include "idem/http/beast.hpp"
#include "store_deadline.hpp"
#include "stream.hpp"
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
using Acceptor = asio::basic_socket_acceptor<tcp, Executor>;
inline constexpr asio::use_awaitable_t<Executor> kAwait{};

/// The addresses of one upstream URL, shared by every event loop. The gateway resolves the host
/// again while it runs (Gateway::Impl::resolve_upstream), so an upstream whose address changes (a
/// container that restarted) or that does not resolve yet at start-up is followed without a
/// restart. A reload that names another upstream makes a new one: requests that started before
/// it keep going to the old upstream. Thread-safe.
class UpstreamAddresses {
 public:
  using Endpoints = std::vector<tcp::endpoint>;

  explicit UpstreamAddresses(UpstreamUrl url) : url_(std::move(url)), id_(next_id_.fetch_add(1) + 1) {}

  /// The URL these are the addresses of.
  const UpstreamUrl& url() const { return url_; }
  /// Unique in the process: what pooled connections remember their upstream by.
  std::uint64_t id() const { return id_; }

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
  inline static std::atomic<std::uint64_t> next_id_{0};
  const UpstreamUrl url_;
  const std::uint64_t id_;
  mutable std::mutex mutex_;
  std::shared_ptr<const Endpoints> endpoints_ = std::make_shared<const Endpoints>();
  std::string error_;
  mutable std::atomic<bool> refresh_{false};
};

/// One configuration as the event loops serve it: the Runtime, the addresses of its upstream,
/// and the TLS contexts its certificates were loaded into.
struct Snapshot {
  Snapshot(std::shared_ptr<const Runtime> r, std::shared_ptr<UpstreamAddresses> u)
      : runtime(std::move(r)),
        upstream(std::move(u)),
        listener_tls(asio_context(runtime->config().tls_context)),
        upstream_tls(asio_context(runtime->config().upstream_tls_context)) {}

  std::shared_ptr<const Runtime> runtime;
  std::shared_ptr<UpstreamAddresses> upstream;
  /// The TLS listener's context (null without [tls]): a connection accepted now handshakes with
  /// it and keeps it, so a reload with a new certificate never touches an open connection.
  std::shared_ptr<asio::ssl::context> listener_tls;
  /// An https:// upstream's (null for http://).
  std::shared_ptr<asio::ssl::context> upstream_tls;
  const Config& config() const { return runtime->config(); }
};

/// on_lease_expiry = "ask": at most lookup_rate lookups a second from the whole gateway (a token
/// bucket holding one second's worth), so that a storm of retries of stuck keys is not a storm of
/// lookups against the upstream. Lookups are rare (a lease ran out); one mutex is cheap enough.
class LookupBudget {
 public:
  /// Whether one more lookup may be sent now.
  bool take(double per_second, std::chrono::steady_clock::time_point now) {
    std::lock_guard lock(mutex_);
    if (!started_) {
      started_ = true;
      tokens_ = per_second;
    } else {
      const double elapsed = std::chrono::duration<double>(now - last_).count();
      tokens_ = std::min(per_second, tokens_ + per_second * std::max(0.0, elapsed));
    }
    last_ = now;
    if (tokens_ < 1) return false;
    tokens_ -= 1;
    return true;
  }

 private:
  std::mutex mutex_;
  bool started_ = false;
  double tokens_ = 0;
  std::chrono::steady_clock::time_point last_{};
};

/// State every event loop shares: the engine, and the configuration in force behind an atomic
/// pointer that a reload swaps (Gateway::Impl::reload).
class Shared {
 public:
  Shared(Engine& engine, std::shared_ptr<const Snapshot> first)
      : engine(engine), current_(std::move(first)), generation_(current_.load()->runtime->generation()) {}

  Engine& engine;
  mutable LookupBudget lookups;

  /// The configuration in force now.
  std::shared_ptr<const Snapshot> current() const { return current_.load(); }
  /// Its generation: read on every request (a relaxed load) to notice a reload.
  std::uint64_t generation() const { return generation_.load(std::memory_order_acquire); }
  /// Puts `next` in force for requests that start from now on.
  void publish(std::shared_ptr<const Snapshot> next) {
    const std::uint64_t g = next->runtime->generation();
    current_.store(std::move(next));
    generation_.store(g, std::memory_order_release);
  }

 private:
  std::atomic<std::shared_ptr<const Snapshot>> current_;
  std::atomic<std::uint64_t> generation_;
};

/// One event loop's copy of a Snapshot, with the loop's own tenant sources (JWT verifiers and
/// their caches, which take no locks). A request holds the one it started with until it is
/// answered; the loop makes a new one when a reload published another Snapshot.
struct LoopConfig {
  explicit LoopConfig(std::shared_ptr<const Snapshot> s)
      : snapshot(std::move(s)), tenants(snapshot->config().tenant, snapshot->config().routes) {}
  LoopConfig(const LoopConfig&) = delete;
  LoopConfig& operator=(const LoopConfig&) = delete;

  const Runtime& runtime() const { return *snapshot->runtime; }
  const Config& config() const { return snapshot->config(); }
  UpstreamAddresses& upstream() const { return *snapshot->upstream; }

  const std::shared_ptr<const Snapshot> snapshot;
  TenantSources tenants;
};

/// One upstream connection and the bytes read from it but not yet parsed.
struct UpstreamConn {
  UpstreamConn(Deadlines& deadlines, const Executor& ex) : stream(deadlines, ex) {}
  std::shared_ptr<asio::ssl::context> tls_context;  // an https:// upstream's; outlives `stream`
  Stream stream;
  std::string tls_failure;  // why the upstream's certificate was refused (the handshake's callback writes it)
  bool session_kept = false;  // its TLS session is the pool's, for the next new connection to resume
  beast::flat_buffer buffer;
  std::chrono::steady_clock::time_point idle_since{};
  std::uint64_t upstream_id = 0;  ///< UpstreamAddresses::id() of the upstream it is connected to
};

/// Keep-alive connections to the upstream, one pool per event loop (so no locks): LIFO reuse
/// (the most recently used connection is the least likely to have been closed by the upstream),
/// idle connections closed after upstream_idle_timeout, and a liveness check before reusing a
/// connection that sat idle for a while (see acquire). After a reload that names another
/// upstream, connections to the old one are closed instead of reused.
class UpstreamPool {
 public:
  UpstreamPool(asio::io_context& io, Deadlines& deadlines, MetricsShard& metrics)
      : io_(io), deadlines_(deadlines), metrics_(metrics) {}

  /// A connection: a pooled one unless `fresh`, else a new one, over TLS for an https://
  /// upstream (`tls`: the Snapshot's upstream context, null for http://), offering ALPN h2
  /// instead of http/1.1 when `h2` (the caller checks what was chosen). On failure `conn` is
  /// null and `ec` says why (`failure` too, in words, when TLS failed); nothing was sent.
  struct Acquired {
    std::unique_ptr<UpstreamConn> conn;
    bool reused = false;
    beast::error_code ec;
    std::string failure;
  };
  Task<Acquired> acquire(bool fresh, UpstreamAddresses& upstream, const Config& config,
                         const std::shared_ptr<asio::ssl::context>& tls, bool h2 = false);

  /// Returns a connection whose last response was read completely and which the upstream keeps
  /// alive; it is closed instead when the pool is full.
  void release(std::unique_ptr<UpstreamConn> conn, const Config& config);

  /// Closes idle connections older than upstream_idle_timeout.
  void sweep(const Config& config);

  /// Closes every idle connection.
  void clear() { idle_.clear(); }

 private:
  struct SessionFree {
    void operator()(SSL_SESSION* s) const { SSL_SESSION_free(s); }
  };
  Task<bool> handshake(UpstreamConn& conn, UpstreamAddresses& upstream, const Config& config, Acquired& out, bool h2);
  bool keep_session(UpstreamConn& conn);  // whether it kept the connection's session

  asio::io_context& io_;
  Deadlines& deadlines_;
  MetricsShard& metrics_;
  std::vector<std::unique_ptr<UpstreamConn>> idle_;
  // The latest TLS session with the upstream, resumed by the next new connection (an abbreviated
  // handshake: no certificate chain sent or verified again), for the context it was made with.
  std::unique_ptr<SSL_SESSION, SessionFree> session_;
  std::uint64_t session_upstream_ = 0;
  SSL_CTX* session_context_ = nullptr;
  std::chrono::steady_clock::time_point last_tls_warning_{};
  std::string last_tls_warning_text_;
  std::uint64_t tls_warnings_skipped_ = 0;
};

struct Session;
class H2Upstream;

/// One event loop: its io_context, thread-confined upstream pool, metrics shard and sessions.
class Worker {
 public:
  // Both in session.cpp, where the members they destroy are complete types.
  Worker(std::size_t index, const Shared& shared, MetricsShard& metrics);
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
  /// upstream_protocol = "h2": this loop's HTTP/2 connections to the upstream (made on first use).
  std::unique_ptr<H2Upstream> h2_upstream;

  /// The configuration in force for a request starting now, on this thread: this loop's copy of
  /// the Snapshot last published, made anew after a reload.
  const std::shared_ptr<LoopConfig>& config() {
    if (shared.generation() != config_->runtime().generation()) config_ = std::make_shared<LoopConfig>(shared.current());
    return config_;
  }

  // Touched only on this worker's thread.
  bool draining = false;
  Session* sessions = nullptr;  // intrusive list of live sessions

  /// Open client connections; read by other threads (max_connections, drain).
  std::atomic<std::size_t> open{0};

  /// Sets `draining` and closes every session waiting for its next request. On this thread.
  void drain();

 private:
  std::shared_ptr<LoopConfig> config_;
};

/// Serves one client connection until it closes, times out, or the worker drains; over TLS with
/// `tls` (the [tls] listener's context at accept time) unless it is null.
Task<void> run_session(Worker& worker, Socket socket, std::shared_ptr<asio::ssl::context> tls);

}  // namespace idem::gateway
