#include "service.hpp"

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <sqlite3.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/tcp_stream.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

#include <charconv>
#include <cstdio>
#include <ctime>
#include <expected>
#include <filesystem>
#include <optional>
#include <stdexcept>

#include "idem/engine.hpp"
#include "idem/http/async.hpp"
#include "idem/http/beast.hpp"
#include "idem/http/lookup.hpp"
#include "idem/http/message.hpp"
#include "idem/payments/ledger.hpp"
#include "idem/problem.hpp"
#include "idem/sqlite_outbox.hpp"
#include "idem/sqlite_store.hpp"
#include "idem/tenant.hpp"

namespace idem::payments {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using tcp = asio::ip::tcp;
using idem::http::Request;
using idem::http::Response;
constexpr auto kAwait = asio::use_awaitable;
constexpr std::size_t kBodyLimit = 64 * 1024;

auto with(beast::error_code& ec) { return asio::redirect_error(kAwait, ec); }

std::int64_t unix_now() { return static_cast<std::int64_t>(std::time(nullptr)); }

using PlanFn = Plan (*)(sqlite3*, std::string_view, std::string, std::int64_t);

// The POST routes: path, id prefix, planner.
struct WriteRoute {
  std::string_view path;
  std::string_view prefix;
  PlanFn plan;
};
constexpr WriteRoute kWriteRoutes[] = {
    {"/v1/accounts", "acct_", &plan_open_account},
    {"/v1/payments", "pay_", &plan_payment},
    {"/v1/orders", "ord_", &plan_order},
    {"/v1/bonuses", "bon_", &plan_bonus},
    {"/v1/refunds", "re_", &plan_refund},
};

constexpr std::string_view kLookup = "/v1/payments/by-idempotency-key/";

// A percent-encoded path segment, decoded; nullopt for a malformed escape.
std::optional<std::string> percent_decode(std::string_view in) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      if (in[i] == '/' || in[i] == '?') return std::nullopt;  // one segment, no query
      out.push_back(in[i]);
      continue;
    }
    if (i + 2 >= in.size()) return std::nullopt;
    const int hi = hex(in[i + 1]), lo = hex(in[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

// The attempt fence of a keyed request the gateway forwarded: its key, Idempotency-Tenant and
// Idempotency-Attempt (docs/security.md). Without the attempt header (a client talking to the
// service directly) there is none; a malformed one is a 400, never a guess.
std::expected<AttemptFence, Outcome> fence_of(const Request& req, std::string key) {
  AttemptFence fence;
  fence.key = std::move(key);
  if (const auto tenant = req.find(http::kTenantHeader); tenant != req.end()) fence.tenant = std::string(tenant->value());
  const auto attempt = req.find(http::kAttemptHeader);
  if (attempt == req.end() || fence.key.empty()) return fence;
  const std::string_view v = attempt->value();
  std::uint32_t n = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (ec != std::errc{} || end != v.data() + v.size() || n == 0) {
    return std::unexpected(problem(400, "invalid_request", "The request is invalid",
                                   std::string(http::kAttemptHeader) + " must be a positive integer"));
  }
  fence.attempt = n;
  return fence;
}

Response make_response(const Outcome& outcome, unsigned version, bool keep_alive) {
  Response res{static_cast<bhttp::status>(outcome.status), version};
  res.set(bhttp::field::content_type, outcome.problem() ? "application/problem+json" : "application/json");
  if (outcome.problem()) res.set(bhttp::field::cache_control, "no-store");
  res.body() = outcome.body;
  res.keep_alive(keep_alive);
  res.prepare_payload();
  return res;
}

// A blocking-free call of SqliteStore::complete_in_transaction. The coroutine keeps this in its
// frame; the adapter's lambda captures only a pointer to it (GCC 12: no temporaries with
// destructors across co_await).
struct TxnCall {
  SqliteStore* store;
  CompleteRequest request;
  SqliteWork work;
};

sqlite3* open_ledger(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr) !=
      SQLITE_OK) {
    std::string message = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    throw std::runtime_error("--db " + path + ": " + message);
  }
  sqlite3_busy_timeout(db, 5000);
  std::string error;
  char* msg = nullptr;
  if (sqlite3_exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL;", nullptr, nullptr, &msg) != SQLITE_OK ||
      idem::sqlite_configure_connection(db) != SQLITE_OK) {
    error = msg ? msg : sqlite3_errmsg(db);
    sqlite3_free(msg);
    sqlite3_close(db);
    throw std::runtime_error("--db " + path + ": " + error);
  }
  if (!migrate(db, error)) {
    sqlite3_close(db);
    throw std::runtime_error("--db " + path + ": " + error);
  }
  // In-process mode the store's migrations made it; off mode this service writes its own events.
  if (auto created = SqliteOutbox::create_table(db); !created) {
    sqlite3_close(db);
    throw std::runtime_error("--db " + path + ": outbox: " + created.error().message);
  }
  return db;
}

}  // namespace

struct Service::Impl {
  explicit Impl(const ServiceOptions& o) : options(o), acceptor(io), signals(io, SIGINT, SIGTERM) {
    const std::filesystem::path path(o.db_path);
    if (path.has_parent_path()) std::filesystem::create_directories(path.parent_path());
    if (o.inprocess) {
      // The store first: it creates the file and its own tables; the ledger's live beside them,
      // because complete_in_transaction runs the ledger writes on the store's connection.
      auto opened = SqliteStore::open({.path = o.db_path, .reaper_interval = Millis{60'000}});
      if (!opened) throw std::runtime_error("--db " + o.db_path + ": " + opened.error().message);
      store = std::move(*opened);
      engine.emplace(*store);
      policy.key_required = true;
      policy.lease = o.lease;
    }
    db = open_ledger(o.db_path);
    beast::error_code ec;
    const tcp::endpoint endpoint(asio::ip::make_address(o.host, ec), o.port);
    if (ec) throw std::runtime_error("--listen " + o.host + ": " + ec.message());
    acceptor.open(endpoint.protocol(), ec);
    if (!ec) acceptor.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acceptor.bind(endpoint, ec);
    if (!ec) acceptor.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) throw std::runtime_error("listen " + o.host + ":" + std::to_string(o.port) + ": " + ec.message());
  }

  ~Impl() {
    store.reset();  // finishes queued completions while the io_context still exists
    sqlite3_close_v2(db);
  }

  asio::awaitable<void> accept_loop();
  asio::awaitable<void> session(tcp::socket socket);
  asio::awaitable<Response> handle(const Request& req);
  asio::awaitable<Response> write_inprocess(const Request& req, const WriteRoute& route);
  Response write_off(const Request& req, const WriteRoute& route);
  Response lookup(const Request& req, std::string_view encoded_key);

  ServiceOptions options;
  asio::io_context io;  // declared before the store: destroyed after it
  tcp::acceptor acceptor;
  asio::signal_set signals;
  std::unique_ptr<SqliteStore> store;
  std::optional<Engine> engine;
  Policy policy;
  TenantRule tenant_rule{.source = TenantRule::Source::authorization};
  sqlite3* db = nullptr;  // the service's own connection: reads; and writes in off mode
};

asio::awaitable<void> Service::Impl::accept_loop() {
  for (;;) {
    beast::error_code ec;
    tcp::socket socket = co_await acceptor.async_accept(with(ec));
    if (ec) {
      if (!acceptor.is_open()) co_return;
      // Out of file descriptors, mostly: the connection stays queued, so accepting again at once
      // would fail at once, in a loop that takes a core. Wait a little first.
      asio::steady_timer pause(io, std::chrono::milliseconds(50));
      co_await pause.async_wait(with(ec));
      continue;
    }
    asio::co_spawn(io, session(std::move(socket)), asio::detached);
  }
}

asio::awaitable<void> Service::Impl::session(tcp::socket socket) {
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  for (;;) {
    bhttp::request_parser<bhttp::string_body> parser;
    parser.body_limit(kBodyLimit);
    stream.expires_after(std::chrono::seconds(60));
    beast::error_code ec;
    co_await bhttp::async_read(stream, buffer, parser, with(ec));
    if (ec) {
      if (ec == bhttp::error::body_limit) {
        const Outcome too_large = problem(413, "request_too_large", "The request is too large", "the body limit is 64 KiB");
        Response res = make_response(too_large, 11, false);
        co_await bhttp::async_write(stream, res, with(ec));
      }
      break;
    }
    const Request& req = parser.get();
    Response res = co_await handle(req);
    res.keep_alive(req.keep_alive());
    stream.expires_after(std::chrono::seconds(30));
    co_await bhttp::async_write(stream, res, with(ec));
    if (ec || !res.keep_alive()) break;
  }
  beast::error_code ignored;
  stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
}

asio::awaitable<Response> Service::Impl::handle(const Request& req) {
  const auto target = idem::http::split_target(req.target());
  const std::string_view path = target.path;
  const unsigned version = req.version();
  const bool keep_alive = req.keep_alive();
  if (req.method() == bhttp::verb::get) {
    constexpr std::string_view kAccounts = "/v1/accounts/", kPayments = "/v1/payments/";
    if (path.starts_with(kLookup)) co_return lookup(req, path.substr(kLookup.size()));
    if (path.starts_with(kAccounts) && path.size() > kAccounts.size()) {
      co_return make_response(get_account(db, path.substr(kAccounts.size())), version, keep_alive);
    }
    if (path.starts_with(kPayments) && path.size() > kPayments.size()) {
      co_return make_response(get_payment(db, path.substr(kPayments.size())), version, keep_alive);
    }
    if (path == "/healthz") co_return make_response(Outcome{200, R"({"status":"ok"})"}, version, keep_alive);
  }
  for (const WriteRoute& route : kWriteRoutes) {
    if (path != route.path) continue;
    if (req.method() != bhttp::verb::post) {
      co_return make_response(problem(405, "method_not_allowed", "Method not allowed", "use POST"), version, keep_alive);
    }
    if (!engine) {
      if (options.hold_attempt != 0) {
        const auto attempt = req.find(http::kAttemptHeader);
        if (attempt != req.end() && attempt->value() == std::to_string(options.hold_attempt)) {
          asio::steady_timer hold(co_await asio::this_coro::executor, options.hold);
          beast::error_code ignored;
          co_await hold.async_wait(with(ignored));
        }
      }
      co_return write_off(req, route);
    }
    Response res = co_await write_inprocess(req, route);
    co_return res;
  }
  co_return make_response(problem(404, "not_found", "Not found", "no route for this path"), version, keep_alive);
}

Response Service::Impl::write_off(const Request& req, const WriteRoute& route) {
  auto fence = fence_of(req, std::string(req[policy.key_header]));
  if (!fence) return make_response(fence.error(), req.version(), req.keep_alive());
  const std::string_view body = req.body();
  Outcome outcome = execute_now(db, *fence, [&](sqlite3* conn) {
    Plan plan = route.plan(conn, body, new_id(route.prefix), unix_now());
    plan.request_key = fence->key;
    plan.request_tenant = fence->tenant;
    if (options.outbox) with_events(plan);
    return plan;
  });
  return make_response(outcome, req.version(), req.keep_alive());
}

// The gateway's lookup (docs/gateway.md, on_lease_expiry = "ask"): the payment made with a key,
// as its 201 was, or a 404 marked "not found". Only a 404 that truly found nothing carries the
// marker; a failed read answers 503, which the gateway reads as "unknown".
Response Service::Impl::lookup(const Request& req, std::string_view encoded_key) {
  const unsigned version = req.version();
  const bool keep_alive = req.keep_alive();
  auto key = percent_decode(encoded_key);
  if (!key || key->empty()) {
    return make_response(problem(400, "invalid_request", "The request is invalid", "the key in the path is malformed"),
                         version, keep_alive);
  }
  if (const auto header = req.find(policy.key_header); header != req.end() && header->value() != *key) {
    return make_response(problem(400, "invalid_request", "The request is invalid",
                                 "the key in the path and the " + policy.key_header + " header differ"),
                         version, keep_alive);
  }
  if (req.find(http::kTenantHeader) == req.end()) {
    // Without the tenant the key is ambiguous (another tenant may have used it): not a "no".
    return make_response(problem(400, "invalid_request", "The request is invalid",
                                 "a lookup names the key's tenant in " + std::string(http::kTenantHeader)),
                         version, keep_alive);
  }
  auto fence = fence_of(req, *key);
  if (!fence) return make_response(fence.error(), version, keep_alive);
  const Outcome found = lookup_payment(db, *fence);
  Response res = make_response(found, version, keep_alive);
  if (found.status == 200) {
    res.set(http::kOriginalStatusHeader, "201");  // what POST /v1/payments answered
    res.set(policy.key_header, *key);
  } else if (found.status == 404) {
    res.set(http::kLookupHeader, http::kLookupNotFound);
    res.set(policy.key_header, *key);
  }
  return res;
}

asio::awaitable<Response> Service::Impl::write_inprocess(const Request& req, const WriteRoute& route) {
  const unsigned version = req.version();
  const bool keep_alive = req.keep_alive();
  idem::http::BeastRequestView beast_view;
  const RequestView& view = beast_view.assign(req);
  const auto tenant = derive_tenant(tenant_rule, view.headers);
  if (!tenant) {
    const Problem ambiguous = make_problem(400, "tenant_ambiguous", "The tenant is ambiguous", tenant.error());
    co_return idem::http::problem_response(ambiguous, version, keep_alive);
  }
  Decision decision = co_await idem::http::async_begin(*engine, policy, view, *tenant, kAwait);

  if (decision.verdict == Verdict::replay) {
    co_return idem::http::replay_response(*decision.replay, version, keep_alive);
  }
  if (decision.verdict != Verdict::execute) {
    const std::optional<Problem> refusal = problem_for(decision);
    co_return idem::http::problem_response(*refusal, version, keep_alive);
  }

  const Ticket ticket = *decision.ticket;
  const std::string key(find_header(view.headers, policy.key_header));
  const std::string body(req.body());
  asio::steady_timer backoff(io);
  // Plan on our own connection, apply inside the store's transaction together with the key's
  // completion. A plan made from a read that another request's commit overtook is refused by
  // apply's guards (stale): plan again, still holding the key.
  for (int attempt = 0; attempt < 100; ++attempt) {
    Plan plan = route.plan(db, body, new_id(route.prefix), unix_now());
    plan.request_key = key;
    plan.request_tenant = *tenant;
    if (options.outbox) with_events(plan);
    Response res = make_response(plan.outcome, version, keep_alive);
    const TimePoint now = engine->clock().now();
    auto stale = std::make_shared<bool>(false);
    TxnCall call{store.get(),
                 CompleteRequest{ticket.fence, idem::http::to_stored_response(res.base(), res.result_int(), res.body()),
                                 now, now + ticket.retention},
                 [plan = std::move(plan), stale](sqlite3* conn, std::string& error) {
                   const Applied applied = apply(conn, plan, error);
                   if (applied == Applied::stale) {
                     *stale = true;
                     error = "stale plan";
                   }
                   return applied == Applied::ok;
                 }};
    TxnCall* c = &call;
    StoreResult<FenceStatus> result = co_await idem::http::detail::async_from_callback<StoreResult<FenceStatus>>(
        [c](auto done) { c->store->complete_in_transaction(std::move(c->request), std::move(c->work), std::move(done)); },
        kAwait);
    if (result && *result == FenceStatus::ok) co_return res;
    if (result) {
      // Our lease ran out and another request took the key over: it decides the outcome.
      const Problem lost = make_problem(409, "idempotency_key_in_use", "The key is in use",
                                        "the request took longer than its lease; retry to get the outcome");
      co_return idem::http::problem_response(lost, version, keep_alive);
    }
    if (!*stale) {
      // Nothing committed (unless in doubt): release the key so that a retry executes.
      if (!result.error().in_doubt) {
        StoreResult<FinishStatus> released = co_await idem::http::async_release(*engine, ticket, kAwait);
        (void)released;
      }
      const Outcome failed = problem(503, "ledger_unavailable", "The ledger is unavailable", result.error().message);
      co_return make_response(failed, version, keep_alive);
    }
    backoff.expires_after(std::chrono::milliseconds(1 + attempt));
    beast::error_code ec;
    co_await backoff.async_wait(with(ec));
  }
  const Outcome busy = problem(503, "ledger_busy", "The ledger is busy", "too many concurrent changes; retry");
  StoreResult<FinishStatus> released = co_await idem::http::async_release(*engine, ticket, kAwait);
  (void)released;
  co_return make_response(busy, version, keep_alive);
}

Service::Service(const ServiceOptions& options) : impl_(std::make_unique<Impl>(options)) {}
Service::~Service() = default;

void Service::run() {
  Impl& s = *impl_;
  s.signals.async_wait([&s](const beast::error_code& ec, int) {
    if (ec) return;
    beast::error_code ignored;
    s.acceptor.close(ignored);
    s.io.stop();
  });
  const auto bound = s.acceptor.local_endpoint();
  std::fprintf(stderr, "idem-payments: listening on %s:%u, db %s, idempotency %s\n",
               bound.address().to_string().c_str(), static_cast<unsigned>(bound.port()), s.options.db_path.c_str(),
               s.options.inprocess ? "inprocess" : "off");
  asio::co_spawn(s.io, s.accept_loop(), asio::detached);
  s.io.run();
  std::fprintf(stderr, "idem-payments: stopped\n");
}

}  // namespace idem::payments
