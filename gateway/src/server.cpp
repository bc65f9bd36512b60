#include "server.hpp"

#include "worker.hpp"

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/http/empty_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

#include <algorithm>
#include <csignal>
#include <exception>
#include <optional>
#include <stdexcept>
#include <thread>

#include "idem/gateway/log.hpp"
#include "idem/http/async.hpp"
#include "idem/http/message.hpp"
#include "idem/encrypted_store.hpp"
#include "idem/redact.hpp"

namespace idem::gateway {
namespace {

namespace bhttp = beast::http;
using Clock = std::chrono::steady_clock;

auto with(beast::error_code& ec) { return asio::redirect_error(kAwait, ec); }

// co_spawn completion: an exception escaping a coroutine is logged, never fatal.
struct LogFailure {
  const char* what;
  void operator()(std::exception_ptr e) const {
    if (!e) return;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& ex) {
      log::write(LogLevel::error, std::string(what) + ": " + ex.what());
    } catch (...) {
      log::write(LogLevel::error, std::string(what) + ": unknown exception");
    }
  }
};

tcp::endpoint resolve_listen(asio::io_context& io, const ListenAddress& address, std::string_view what) {
  beast::error_code ec;
  const auto ip = asio::ip::make_address(address.host, ec);
  if (!ec) return tcp::endpoint(ip, address.port);
  tcp::resolver resolver(io);
  const auto results = resolver.resolve(address.host, std::to_string(address.port), ec);
  if (ec || results.empty()) {
    throw std::runtime_error(std::string(what) + " " + address.text() + ": cannot resolve host: " + ec.message());
  }
  return *results.begin();
}

// Why a lookup of the upstream found nothing usable; nullopt when it did.
std::optional<std::string> resolve_failure(const beast::error_code& ec, const tcp::resolver::results_type& results) {
  if (ec) return ec.message();
  if (results.empty()) return std::string("no address");
  return std::nullopt;
}

UpstreamAddresses::Endpoints endpoints_of(const tcp::resolver::results_type& results) {
  UpstreamAddresses::Endpoints endpoints;
  for (const auto& r : results) endpoints.push_back(r.endpoint());
  return endpoints;
}

void open_acceptor(Acceptor& acceptor, const tcp::endpoint& endpoint, const ListenAddress& address,
                   std::string_view what) {
  beast::error_code ec;
  acceptor.open(endpoint.protocol(), ec);
  if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor.bind(endpoint, ec);
  if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) throw std::runtime_error(std::string(what) + " " + address.text() + ": " + ec.message());
}

std::string describe(const tcp::endpoint& e) {
  const auto a = e.address();
  return (a.is_v6() ? "[" + a.to_string() + "]" : a.to_string()) + ":" + std::to_string(e.port());
}

}  // namespace

std::size_t thread_count(const Config& c) { return c.threads != 0 ? c.threads : std::max(1u, std::thread::hardware_concurrency()); }

std::shared_ptr<const Snapshot> first_snapshot(std::shared_ptr<const Config> config) {
  auto upstream = std::make_shared<UpstreamAddresses>(config->upstream);
  return std::make_shared<const Snapshot>(std::make_shared<const Runtime>(std::move(config), 1), std::move(upstream));
}

struct Gateway::Impl {
  Impl(std::shared_ptr<const Config> c, Engine& e, EncryptedStore* enc, Reloader r)
      : initial(c),
        config(*initial),
        engine(e),
        encrypted(enc),
        reloader(std::move(r)),
        metrics(thread_count(*c)),
        shared(e, first_snapshot(c)) {
    const std::size_t n = thread_count(*c);
    for (std::size_t i = 0; i < n; ++i) workers.push_back(std::make_unique<Worker>(i, shared, metrics.shard(i)));
  }

  asio::io_context& io0() { return *workers[0]->io; }

  std::size_t open_connections() const {
    std::size_t total = 0;
    for (const auto& w : workers) total += w->open.load(std::memory_order_relaxed);
    return total;
  }

  void start();
  void run();
  Task<void> accept_loop(Acceptor& listener, bool tls);
  Task<void> admin_loop();
  Task<void> admin_session(Socket socket);
  Task<std::optional<std::string>> ready();
  Task<void> reaper();
  Task<void> resolve_upstream();
  Task<void> housekeeping(Worker& w);
  Task<void> watch_deadlines(Worker& w);
  Task<void> drain();
  Task<void> reload();
  void on_signal();
  void stop_all();

  /// The configuration in force now (a reload may have replaced the one the gateway started
  /// with); what cannot change without a restart (listen, store, threads) is the same in every one.
  std::shared_ptr<const Snapshot> current() const { return shared.current(); }

  /// The configuration the gateway started with: listen and admin addresses, the store.
  std::shared_ptr<const Config> initial;
  const Config& config;
  Engine& engine;
  EncryptedStore* encrypted;  // null without [encryption]
  Reloader reloader;
  Metrics metrics;
  Shared shared;
  std::vector<std::unique_ptr<Worker>> workers;

  // Worker 0's thread only.
  std::optional<Acceptor> acceptor;      // the plain listener (none with listen = "off")
  std::optional<Acceptor> tls_acceptor;  // [tls]'s
  std::optional<Acceptor> admin;
  std::optional<asio::signal_set> signals;
  std::optional<asio::steady_timer> reaper_timer;
  std::optional<asio::steady_timer> resolve_timer;
  bool draining = false;
  bool stopped = false;
  bool reloading = false;      // a reload is running (on worker 0's thread)
  bool reload_again = false;   // SIGHUP arrived meanwhile: reload once more when it is done
};

void Gateway::Impl::start() {
  asio::io_context& io = io0();
  {
    // An upstream that does not resolve yet (its container not started) is no reason not to
    // start: requests get 502 and /readyz says why until resolve_upstream finds it.
    tcp::resolver resolver(io);
    beast::error_code ec;
    const auto results = resolver.resolve(config.upstream.host, std::to_string(config.upstream.port), ec);
    if (auto why = resolve_failure(ec, results)) {
      current()->upstream->set_error(*why);
      log::write(LogLevel::warn, "upstream " + config.upstream.text() + ": the host does not resolve (" +
                                     *why + "); answering 502 until it does");
    } else {
      current()->upstream->set(endpoints_of(results));
    }
  }
  if (config.plain_listener) {
    acceptor.emplace(io);
    open_acceptor(*acceptor, resolve_listen(io, config.listen, "listen"), config.listen, "listen");
  }
  if (config.tls_listen) {
    tls_acceptor.emplace(io);
    open_acceptor(*tls_acceptor, resolve_listen(io, *config.tls_listen, "[tls] listen"), *config.tls_listen,
                  "[tls] listen");
  }
  if (config.admin_listen) {
    admin.emplace(io);
    open_acceptor(*admin, resolve_listen(io, *config.admin_listen, "admin_listen"), *config.admin_listen,
                  "admin_listen");
  }
}

void Gateway::Impl::run() {
  asio::io_context& io = io0();
  // SIGHUP reloads the configuration (Impl::reload); SIGINT and SIGTERM drain and stop.
  signals.emplace(io, SIGINT, SIGTERM, SIGHUP);
  std::function<void()> arm = [this, &arm] {
    signals->async_wait([this, &arm](const beast::error_code& ec, int signal_number) {
      if (ec || stopped) return;
      if (signal_number == SIGHUP) {
        if (reloading) {
          reload_again = true;
        } else if (!draining) {
          asio::co_spawn(io0(), reload(), LogFailure{"reload"});
        }
      } else {
        on_signal();
      }
      arm();
    });
  };
  arm();

  std::string line = "listening on ";
  if (acceptor) line += describe(acceptor->local_endpoint());
  if (acceptor && tls_acceptor) line += " and ";
  if (tls_acceptor) line += describe(tls_acceptor->local_endpoint()) + " (TLS)";
  line += ", upstream " + config.upstream.text() + ", store " + redact_url(config.store.text) + ", " +
          std::to_string(workers.size()) + " threads";
  if (admin) line += ", admin on " + describe(admin->local_endpoint());
  log::notice(line);

  if (acceptor) asio::co_spawn(io, accept_loop(*acceptor, false), LogFailure{"listener"});
  if (tls_acceptor) asio::co_spawn(io, accept_loop(*tls_acceptor, true), LogFailure{"TLS listener"});
  if (admin) asio::co_spawn(io, admin_loop(), LogFailure{"admin listener"});
  if (engine.store().expires_records_itself()) {
    // A periodic purge would SCAN a Redis keyspace for what Redis deletes by itself.
    if (config.reaper_interval.count() > 0) log::write(LogLevel::info, "reaper: off, the store expires records by itself");
  } else {
    // Runs even with reaper_interval = "0s", idle, so that a reload can turn it on.
    reaper_timer.emplace(io);
    asio::co_spawn(io, reaper(), LogFailure{"reaper"});
  }
  for (auto& w : workers) {
    asio::co_spawn(*w->io, housekeeping(*w), LogFailure{"housekeeping"});
    asio::co_spawn(*w->io, watch_deadlines(*w), LogFailure{"deadlines"});
  }
  resolve_timer.emplace(io);
  asio::co_spawn(io, resolve_upstream(), LogFailure{"upstream resolver"});

  auto loop = [](asio::io_context& ctx) {
    log::buffer_this_thread();
    for (;;) {
      try {
        ctx.run();
        break;
      } catch (const std::exception& e) {
        log::write(LogLevel::error, std::string("event loop: ") + e.what());
      }
    }
    log::flush();
  };
  std::vector<std::thread> threads;
  for (std::size_t i = 1; i < workers.size(); ++i) threads.emplace_back(loop, std::ref(*workers[i]->io));
  loop(io);
  for (auto& t : threads) t.join();
  log::notice("stopped");
}

namespace {

// What a listener does when accept fails, out of file descriptors mostly: the connection stays
// queued, so accepting again at once would fail again at once and spin. It counts the failure,
// logs at most one line per 10 s (with how many it did not log), and the caller waits 50 ms.
class AcceptFailures {
 public:
  AcceptFailures(std::string_view listener, std::atomic<std::uint64_t>& counter)
      : listener_(listener), counter_(counter) {}

  void record(const beast::error_code& ec) {
    counter_.fetch_add(1, std::memory_order_relaxed);
    const auto now = std::chrono::steady_clock::now();
    if (last_logged_ && now - *last_logged_ < std::chrono::seconds(10)) {
      ++not_logged_;
      return;
    }
    std::string line = std::string(listener_) + " accept: " + ec.message() + "; retrying every 50 ms";
    if (not_logged_ > 0) line += " (" + std::to_string(not_logged_) + " more failures since the last line)";
    log::write(LogLevel::warn, line);
    last_logged_ = now;
    not_logged_ = 0;
  }

  static constexpr auto kRetryAfter = std::chrono::milliseconds(50);

 private:
  std::string_view listener_;
  std::atomic<std::uint64_t>& counter_;
  std::optional<std::chrono::steady_clock::time_point> last_logged_;
  std::uint64_t not_logged_ = 0;
};

}  // namespace

Task<void> Gateway::Impl::accept_loop(Acceptor& listener, bool tls) {
  std::size_t next = 0;
  asio::steady_timer backoff(io0());
  AcceptFailures failures(tls ? "TLS client" : "client", workers.front()->metrics.accept_errors);
  for (;;) {
    Worker& w = *workers[next];
    next = (next + 1) % workers.size();
    beast::error_code ec;
    Socket socket = co_await listener.async_accept(*w.io, with(ec));
    if (ec) {
      if (ec == asio::error::operation_aborted || !listener.is_open()) co_return;
      failures.record(ec);
      backoff.expires_after(AcceptFailures::kRetryAfter);
      co_await backoff.async_wait(with(ec));
      continue;
    }
    if (open_connections() >= current()->config().max_connections) {
      w.metrics.connections_refused.fetch_add(1, std::memory_order_relaxed);
      socket.close(ec);
      continue;
    }
    // A TLS connection handshakes with the certificate in force now, and keeps it.
    std::shared_ptr<asio::ssl::context> context = tls ? current()->listener_tls : nullptr;
    asio::co_spawn(*w.io, run_session(w, std::move(socket), std::move(context)), LogFailure{"session"});
  }
}

Task<void> Gateway::Impl::housekeeping(Worker& w) {
  asio::steady_timer timer(*w.io);
  for (unsigned tick = 0;; ++tick) {
    timer.expires_after(std::chrono::milliseconds(250));
    beast::error_code ec;
    co_await timer.async_wait(with(ec));
    if (ec) co_return;
    log::flush();
    if (tick % 4 == 0) w.pool.sweep(w.config()->config());
  }
}

// How often each event loop looks for operations past their deadline (TimedStream, store
// calls): an eighth of the shortest timeout (the lingering close's second included), between
// 5 ms and 250 ms. A timeout fires at most one tick late.
static std::chrono::milliseconds deadline_tick(const Config& c) {
  const Millis shortest = std::min({c.client_timeout, c.idle_timeout, c.upstream_timeout,
                                    c.upstream_connect_timeout, c.store_timeout, Millis(std::chrono::seconds(1))});
  return std::clamp(std::chrono::duration_cast<std::chrono::milliseconds>(shortest) / 8,
                    std::chrono::milliseconds(5), std::chrono::milliseconds(250));
}

Task<void> Gateway::Impl::watch_deadlines(Worker& w) {
  asio::steady_timer timer(*w.io);
  for (;;) {
    timer.expires_after(deadline_tick(w.config()->config()));  // the timeouts may have been reloaded
    beast::error_code ec;
    co_await timer.async_wait(with(ec));
    if (ec) co_return;
    const auto now = Deadlines::Clock::now();
    w.deadlines.sweep(now);
    w.store_deadlines.sweep(now);
  }
}

static std::string describe(const UpstreamAddresses::Endpoints& endpoints) {
  std::string out;
  for (const auto& e : endpoints) {
    if (!out.empty()) out += ", ";
    out += e.address().to_string();
  }
  return out;
}

// Looks the upstream host up again every upstream_resolve_interval, and every second while it
// does not resolve or a worker saw a connection fail; the addresses found replace the old ones
// (connections already open stay until they close). A failed lookup keeps the last addresses.
// Follows the upstream of the configuration in force: after a reload that names another one,
// that one. An IP address is never looked up again: it cannot change.
Task<void> Gateway::Impl::resolve_upstream() {
  tcp::resolver resolver(io0());
  const UpstreamAddresses* watched = nullptr;
  auto last = Clock::now();
  bool failing = false;
  for (;;) {
    resolve_timer->expires_after(std::chrono::seconds(1));
    beast::error_code ec;
    co_await resolve_timer->async_wait(with(ec));
    if (ec || stopped) co_return;
    const auto snapshot = current();
    UpstreamAddresses& upstream = *snapshot->upstream;
    const UpstreamUrl& url = upstream.url();
    if (&upstream != watched) {
      watched = &upstream;
      last = Clock::now();
      failing = !upstream.error().empty();
    }
    beast::error_code not_literal;
    asio::ip::make_address(url.host, not_literal);
    if (!not_literal) continue;
    const bool asked = upstream.take_refresh_request();
    const Millis interval = snapshot->config().upstream_resolve_interval;
    const bool due = interval.count() > 0 && Clock::now() - last >= interval;
    if (!failing && !asked && !due) continue;
    last = Clock::now();
    const auto results = co_await resolver.async_resolve(url.host, std::to_string(url.port), with(ec));
    if (stopped) co_return;
    if (auto why = resolve_failure(ec, results)) {
      upstream.set_error(*why);
      if (!failing) {
        log::write(LogLevel::warn, "upstream " + url.text() + ": the host no longer resolves (" + *why +
                                       "); keeping its last addresses");
      }
      failing = true;
      continue;
    }
    UpstreamAddresses::Endpoints found = endpoints_of(results);
    const auto before = upstream.get();
    if (found != *before) {
      log::notice("upstream " + url.text() + " now resolves to " + describe(found) +
                  (before->empty() ? std::string() : " (was " + describe(*before) + ")"));
    }
    upstream.set(std::move(found));
    failing = false;
  }
}

Task<void> Gateway::Impl::reaper() {
  Store& store = engine.store();
  MetricsShard& m = metrics.shard(0);
  for (;;) {
    // The interval and batch of the configuration in force; "0s" waits, idle, for a reload.
    const auto snapshot = current();
    const Millis interval = snapshot->config().reaper_interval;
    const std::size_t batch = snapshot->config().reaper_batch;
    reaper_timer->expires_after(interval.count() > 0 ? Millis(interval) : Millis(std::chrono::seconds(1)));
    beast::error_code ec;
    co_await reaper_timer->async_wait(with(ec));
    if (ec || stopped) co_return;
    if (interval.count() == 0) continue;
    std::size_t total = 0;
    for (;;) {
      const auto t0 = Clock::now();
      auto r = co_await http::async_purge_expired(store, engine.clock().now(), batch, kAwait);
      m.store_call(StoreCall::purge).observe(Clock::now() - t0);
      if (!r) {
        log::write(LogLevel::warn, "reaper: purging expired records failed: " + r.error().message);
        break;
      }
      total += *r;
      m.reaper_deleted.fetch_add(*r, std::memory_order_relaxed);
      if (*r < batch || stopped) break;
    }
    if (total > 0) log::write(LogLevel::debug, "reaper: deleted " + std::to_string(total) + " expired records");
  }
}

// The store's readiness: nullopt when it answered a ping within 2 s, else why not.
Task<std::optional<std::string>> Gateway::Impl::ready() {
  if (draining) co_return std::string("shutting down");
  const auto snapshot = current();
  if (snapshot->upstream->get()->empty()) {
    co_return "the upstream host " + snapshot->upstream->url().host + " does not resolve: " + snapshot->upstream->error();
  }
  struct State {
    explicit State(asio::io_context& io) : timer(io) {}
    asio::steady_timer timer;
    std::optional<StoreResult<Done>> result;
  };
  auto state = std::make_shared<State>(io0());
  state->timer.expires_after(std::chrono::seconds(2));
  const auto t0 = Clock::now();
  // The store may call back on any thread; the answer is handed to this loop by post.
  engine.store().ping([state, ex = io0().get_executor()](StoreResult<Done> r) mutable {
    asio::post(ex, [state, r = std::move(r)]() mutable {
      state->result = std::move(r);
      state->timer.cancel();
    });
  });
  beast::error_code ec;
  if (!state->result) co_await state->timer.async_wait(with(ec));
  metrics.shard(0).store_call(StoreCall::ping).observe(Clock::now() - t0);
  if (!state->result) co_return std::string("store did not answer a ping within 2s");
  if (!*state->result) co_return "store unavailable: " + state->result->error().message;
  co_return std::nullopt;
}

Task<void> Gateway::Impl::admin_session(Socket socket) {
  Stream stream(workers[0]->deadlines, std::move(socket));
  beast::flat_buffer buffer;
  for (;;) {
    bhttp::request_parser<bhttp::empty_body> parser;
    parser.header_limit(8192);
    beast::error_code ec;
    stream.expires_after(std::chrono::seconds(10));
    co_await bhttp::async_read(stream, buffer, parser, with(ec));
    if (ec) break;
    const auto& req = parser.get();
    http::Response res;
    res.version(req.version());
    res.keep_alive(req.keep_alive());
    const auto path = http::split_target(req.target()).path;
    if (req.method() != bhttp::verb::get && req.method() != bhttp::verb::head) {
      res.result(bhttp::status::method_not_allowed);
      res.set(bhttp::field::allow, "GET, HEAD");
      res.body() = "method not allowed\n";
    } else if (path == "/metrics") {
      res.result(bhttp::status::ok);
      res.set(bhttp::field::content_type, "text/plain; version=0.0.4; charset=utf-8");
      res.body() = metrics.render();
    } else if (path == "/healthz") {
      res.result(bhttp::status::ok);
      res.body() = "ok\n";
    } else if (path == "/readyz") {
      auto why_not = co_await ready();
      res.result(why_not ? bhttp::status::service_unavailable : bhttp::status::ok);
      res.body() = why_not ? "not ready: " + *why_not + "\n" : std::string("ready\n");
    } else {
      res.result(bhttp::status::not_found);
      res.body() = "not found; try /metrics, /healthz or /readyz\n";
    }
    if (!res.has_content_length() && res.find(bhttp::field::content_type) == res.end()) {
      res.set(bhttp::field::content_type, "text/plain; charset=utf-8");
    }
    res.prepare_payload();
    if (req.method() == bhttp::verb::head) res.body().clear();
    stream.expires_after(std::chrono::seconds(10));
    co_await bhttp::async_write(stream, res, with(ec));
    if (ec || !res.keep_alive() || stopped) break;
  }
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
}

Task<void> Gateway::Impl::admin_loop() {
  asio::steady_timer backoff(io0());
  AcceptFailures failures("admin", workers.front()->metrics.accept_errors);
  for (;;) {
    beast::error_code ec;
    Socket socket = co_await admin->async_accept(with(ec));
    if (ec) {
      if (ec == asio::error::operation_aborted || !admin->is_open()) co_return;
      failures.record(ec);
      backoff.expires_after(AcceptFailures::kRetryAfter);
      co_await backoff.async_wait(with(ec));
      continue;
    }
    asio::co_spawn(io0(), admin_session(std::move(socket)), LogFailure{"admin session"});
  }
}

// SIGHUP: reads the configuration again (Reloader: the same file and command-line flags) and puts
// it in force for requests that start from now on; requests in flight finish with the one they
// started with. A configuration that does not load changes nothing: one warning line says why.
// What only a restart can change keeps its running value, with a warning line each.
Task<void> Gateway::Impl::reload() {
  reloading = true;
  do {
    reload_again = false;
    const auto running = current();
    std::expected<std::shared_ptr<const Config>, std::string> loaded =
        reloader ? reloader() : std::unexpected(std::string("this gateway cannot reload"));
    if (!loaded) {
      log::write(LogLevel::warn, "reload failed, keeping the running configuration: " + redact_text(loaded.error()));
      continue;
    }
    for (const auto& line : restart_needed(running->config(), **loaded)) log::write(LogLevel::warn, "reload: " + line);
    std::shared_ptr<const Config> next = keep_restart_settings(running->config(), **loaded);
    // Another upstream: resolved before it is put in force, so the first request finds it (a
    // name that does not resolve yet is followed as at start-up: 502 until it does).
    std::shared_ptr<UpstreamAddresses> upstream = running->upstream;
    if (next->upstream.host != running->upstream->url().host || next->upstream.port != running->upstream->url().port ||
        next->upstream.authority != running->upstream->url().authority || next->upstream.tls != running->upstream->url().tls) {
      upstream = std::make_shared<UpstreamAddresses>(next->upstream);
      tcp::resolver resolver(io0());
      beast::error_code ec;
      const auto results = co_await resolver.async_resolve(next->upstream.host, std::to_string(next->upstream.port), with(ec));
      if (stopped) break;
      if (auto why = resolve_failure(ec, results)) {
        upstream->set_error(*why);
        log::write(LogLevel::warn, "reload: upstream " + next->upstream.text() + ": the host does not resolve (" +
                                       *why + "); answering 502 until it does");
      } else {
        upstream->set(endpoints_of(results));
      }
    }
    for (const auto& warning : next->warnings) log::write(LogLevel::warn, "reload: " + warning);
    // The key ring swaps behind the store's own atomic pointer: a claim or completion in flight
    // finishes with the ring it started with.
    if (encrypted != nullptr && next->encryption_keys) encrypted->set_keys(next->encryption_keys);
    log::set_level(next->log_level);
    log::set_format(next->log_format);
    const std::uint64_t generation = running->runtime->generation() + 1;
    shared.publish(std::make_shared<const Snapshot>(std::make_shared<const Runtime>(next, generation), std::move(upstream)));
    log::notice("reload: configuration " + std::to_string(generation) + " in force: " + describe_reload(*next));
  } while (reload_again && !stopped);
  reloading = false;
}

void Gateway::Impl::on_signal() {
  if (draining) {
    log::write(LogLevel::warn, "second signal: stopping now, without waiting for in-flight requests");
    stop_all();
    return;
  }
  draining = true;
  beast::error_code ec;
  if (acceptor) acceptor->close(ec);
  if (tls_acceptor) tls_acceptor->close(ec);
  log::notice("shutting down: stopped accepting; waiting up to " + std::to_string(current()->config().drain_timeout.count()) +
              " ms for " + std::to_string(open_connections()) + " open connections");
  for (auto& w : workers) asio::post(*w->io, [w = w.get()] { w->drain(); });
  asio::co_spawn(io0(), drain(), LogFailure{"drain"});
}

Task<void> Gateway::Impl::drain() {
  const auto deadline = Clock::now() + current()->config().drain_timeout;
  asio::steady_timer timer(io0());
  for (;;) {
    const std::size_t open = open_connections();
    if (open == 0) break;
    if (Clock::now() >= deadline) {
      log::write(LogLevel::warn, "drain_timeout reached with " + std::to_string(open) +
                                     " connections open; their requests' records stay in progress until their leases expire");
      break;
    }
    timer.expires_after(std::chrono::milliseconds(20));
    beast::error_code ec;
    co_await timer.async_wait(with(ec));
    if (stopped) co_return;
  }
  stop_all();
}

void Gateway::Impl::stop_all() {
  if (stopped) return;
  stopped = true;
  beast::error_code ec;
  if (acceptor) acceptor->close(ec);
  if (tls_acceptor) tls_acceptor->close(ec);
  if (admin) admin->close(ec);
  if (reaper_timer) reaper_timer->cancel();
  if (resolve_timer) resolve_timer->cancel();
  if (signals) signals->cancel(ec);
  for (auto& w : workers) w->io->stop();
}

Gateway::Gateway(std::shared_ptr<const Config> config, Engine& engine, EncryptedStore* encrypted, Reloader reloader)
    : impl_(std::make_unique<Impl>(std::move(config), engine, encrypted, std::move(reloader))) {}

Gateway::~Gateway() = default;

void Gateway::start() { impl_->start(); }

void Gateway::run() { impl_->run(); }

}  // namespace idem::gateway
