// A client connection: read a request, decide with the engine, forward to the upstream or
// answer from the store, record the outcome, write the response. Also the upstream pool.
#include "worker.hpp"

#include <sys/socket.h>

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/serializer.hpp>
#include <boost/beast/http/write.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "idem/gateway/log.hpp"
#include "idem/http/async.hpp"
#include "idem/http/message.hpp"
#include "idem/key.hpp"
#include "idem/problem.hpp"
#include "idem/tenant.hpp"

namespace idem::gateway {
namespace {

namespace bhttp = beast::http;
using http::Request;
using http::Response;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kChunk = 64 * 1024;
constexpr std::uint32_t kUpstreamHeaderLimit = 64 * 1024;
constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

constexpr auto kCheckAfterIdle = std::chrono::milliseconds(20);

constexpr std::string_view kForwardedFor = "X-Forwarded-For";
constexpr std::string_view kForwardedProto = "X-Forwarded-Proto";

auto with(beast::error_code& ec) { return asio::redirect_error(kAwait, ec); }

// Whether a pooled socket is still open: nothing to read yet (EAGAIN) means alive; EOF, an
// error, or unsolicited bytes (the upstream should send nothing between responses) mean not.
bool still_open(Socket& socket) {
  char byte;
  const ssize_t n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

bool is_http_error(const beast::error_code& ec) {
  return &ec.category() == &bhttp::make_error_code(bhttp::error::bad_target).category();
}

UpstreamError failure_kind(const beast::error_code& ec) {
  return ec == beast::error::timeout ? UpstreamError::timeout : UpstreamError::dropped;
}

// Writes a whole message framed by Content-Length (or without a body): its head, built into
// `head`, and its body in one gather write, instead of Beast's serializer with a buffer per
// header field. A chunked message goes through Beast's serializer. Returns the bytes written.
template <class Message>
Task<std::size_t> write_message(Stream& stream, Message& message, std::string& head,
                                           beast::error_code& ec) {
  if (message.chunked()) co_return co_await bhttp::async_write(stream, message, with(ec));
  head.clear();
  http::append_head(head, message.base());
  const std::array<asio::const_buffer, 2> buffers{asio::buffer(head), asio::buffer(message.body())};
  co_return co_await asio::async_write(stream, buffers, with(ec));
}

std::string response_failure(const beast::error_code& ec) {
  if (ec == beast::error::timeout) return "the upstream did not send the whole response within upstream_timeout";
  if (is_http_error(ec) && ec != bhttp::error::partial_message) return "the upstream's response is not valid HTTP: " + ec.message();
  return "the upstream closed the connection in the middle of the response: " + ec.message();
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Upstream pool

Task<UpstreamPool::Acquired> UpstreamPool::acquire(bool fresh) {
  Acquired out;
  if (!fresh) {
    const auto now = Clock::now();
    while (!idle_.empty()) {
      auto conn = std::move(idle_.back());
      idle_.pop_back();
      const auto idle = now - conn->idle_since;
      if (idle >= shared_.config.upstream_idle_timeout) continue;
      // Upstreams close keep-alive connections after they sat idle for the upstream's own
      // timeout (seconds: gunicorn 2, Node.js 5, nginx 75). Checking costs a syscall, which is
      // a tenth of a proxied request's CPU; under load LIFO reuse happens within milliseconds,
      // so only connections idle for kCheckAfterIdle or more are checked.
      if (idle >= kCheckAfterIdle && !still_open(conn->stream.socket())) continue;
      metrics_.upstream_reuses.fetch_add(1, std::memory_order_relaxed);
      out.conn = std::move(conn);
      out.reused = true;
      co_return out;
    }
  }
  const auto endpoints = shared_.upstream.get();
  if (endpoints->empty()) {
    out.ec = asio::error::host_not_found;
    shared_.upstream.request_refresh();
    co_return out;
  }
  auto conn = std::make_unique<UpstreamConn>(deadlines_, io_.get_executor());
  conn->stream.expires_after(shared_.config.upstream_connect_timeout);
  co_await conn->stream.async_connect(*endpoints, with(out.ec));
  if (out.ec) {
    shared_.upstream.request_refresh();  // the upstream may have moved
    co_return out;
  }
  beast::error_code ignored;
  conn->stream.socket().set_option(tcp::no_delay(true), ignored);
  metrics_.upstream_connects.fetch_add(1, std::memory_order_relaxed);
  out.conn = std::move(conn);
  co_return out;
}

void UpstreamPool::release(std::unique_ptr<UpstreamConn> conn) {
  if (idle_.size() >= shared_.config.upstream_max_idle || shared_.config.upstream_idle_timeout.count() == 0) return;
  if (conn->buffer.size() != 0) return;  // bytes after the response: the connection is confused
  conn->stream.expires_never();
  conn->idle_since = Clock::now();
  idle_.push_back(std::move(conn));
}

void UpstreamPool::sweep() {
  const auto now = Clock::now();
  // Oldest first: they sit at the front.
  auto keep = std::find_if(idle_.begin(), idle_.end(), [&](const auto& c) {
    return now - c->idle_since < shared_.config.upstream_idle_timeout;
  });
  idle_.erase(idle_.begin(), keep);
}

// ---------------------------------------------------------------------------------------------
// Sessions

struct Session {
  Session(Worker& w, Socket socket) : worker(w), stream(w.deadlines, std::move(socket)) {
    next = w.sessions;
    if (next) next->prev = this;
    w.sessions = this;
    w.open.fetch_add(1, std::memory_order_relaxed);
    w.metrics.connections.fetch_add(1, std::memory_order_relaxed);
  }
  ~Session() {
    if (prev) prev->next = next;
    if (next) next->prev = prev;
    if (worker.sessions == this) worker.sessions = next;
    worker.metrics.connections.fetch_sub(1, std::memory_order_relaxed);
    worker.open.fetch_sub(1, std::memory_order_relaxed);
  }
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  Worker& worker;
  Stream stream;
  beast::flat_buffer buffer;
  http::BeastRequestView view;
  std::string head;  // the head of the message being written (write_message), reused
  std::string client_ip;
  bool idle = false;  // waiting for the first byte of the next request
  Session* prev = nullptr;
  Session* next = nullptr;
};

Worker::~Worker() {
  // Pooled sockets belong to the io_context: close them first. Sessions waiting for a store are
  // held by their store call, not by the io_context: destroy them while it still exists. Then
  // destroy the io_context, and with it every other suspended session, while the members those
  // sessions unlink from still live.
  pool.clear();
  store_deadlines.abandon_all();
  io.reset();
}

void Worker::drain() {
  draining = true;
  for (Session* s = sessions; s != nullptr; s = s->next) {
    if (s->idle) s->stream.cancel();
  }
}

namespace {

// What happened to one request, for the caller and the log line.
struct Exchange {
  unsigned status = 0;  // sent to the client; 0 if nothing was sent
  bool keep_alive = false;
  std::optional<FinishResult> record;
  std::optional<UpstreamError> upstream_error;
};

// The stored stand-in for a response too large to store: executed, not replayable.
StoredResponse not_stored(unsigned status, std::size_t limit) {
  Problem p = make_problem(
      410, "idempotency_response_not_stored", "The response to this request was not stored",
      "the request with this key was executed (upstream status " + std::to_string(status) +
          ") but its response body was larger than max_stored_response (" + std::to_string(limit) +
          " bytes), so it cannot be replayed; do not retry, look the result up instead");
  StoredResponse stored;
  stored.status = 410;
  stored.headers = {{"Content-Type", std::string(kProblemContentType)},
                    {"Cache-Control", "no-store"},
                    {"Idempotent-Original-Status", std::to_string(status)}};
  stored.body = problem_json(p);
  return stored;
}


// Helpers bound to one session.
class Handler {
 public:
  explicit Handler(Session& s)
      : s_(s), w_(s.worker), cfg_(s.worker.shared.config), m_(s.worker.metrics), engine_(s.worker.shared.engine) {}

  Task<bool> handle(Request& req);

 private:
  Task<Exchange> forward(Request& req, const Ticket* ticket, bool keep_alive);
  Task<Exchange> upstream_failed(UpstreamError kind, const Ticket* ticket, unsigned version,
                                            bool keep_alive, const std::string& detail);
  Task<Exchange> deliver(Response& res, const Ticket* ticket, unsigned version, bool keep_alive,
                                    bool head);
  Task<FinishResult> finish(const Ticket& ticket, StoredResponse&& stored);
  Task<FinishResult> release(const Ticket& ticket);
  // store_timeout, or zero (no deadline) for the memory store: it answers within the call, so
  // it cannot hang, and its calls skip the bookkeeping (an allocation and a list entry each).
  Millis store_deadline() const {
    return cfg_.store.kind == StoreUrl::Kind::memory ? Millis::zero() : cfg_.store_timeout;
  }
  // Engine::begin, finish and release, given up after store_timeout (store_deadline.hpp).
  // References are used when the call starts, that is when it is co_awaited.
  auto async_begin_within(const Policy& policy, const RequestView& view, std::string_view tenant);
  auto async_finish_within(const Ticket& ticket, StoredResponse&& stored);
  auto async_release_within(const Ticket& ticket);
  StoreError store_timeout_error() const;
  Task<bool> write(Response& res);
  StoredResponse to_record(const bhttp::fields& fields, unsigned status, std::string_view body, const Ticket& ticket);
  StoredResponse oversized_record(unsigned status, const Ticket& ticket);
  void prepare_forward(Request& req);
  void log_key(const Decision& d, const Policy& policy, const std::string& tenant, const Request& req,
               const Exchange& ex, Clock::time_point start);

  Session& s_;
  Worker& w_;
  const Config& cfg_;
  MetricsShard& m_;
  Engine& engine_;
};

Task<bool> Handler::write(Response& res) {
  beast::error_code ec;
  s_.stream.expires_after(cfg_.client_timeout);
  co_await write_message(s_.stream, res, s_.head, ec);
  co_return !ec;
}

// What is recorded for a response whose body exceeds max_stored_response: the status decides
// as usual (5xx fail, 408/409/425/429 release); a response that would be stored is replaced by
// a 410 stand-in, so a retry learns the request was executed instead of executing it again.
StoredResponse Handler::oversized_record(unsigned status, const Ticket& ticket) {
  StoredResponse stored;
  stored.status = static_cast<int>(status);
  if (classify_status(stored.status, ticket.store_server_errors) == Disposition::store) {
    m_.oversized_responses.fetch_add(1, std::memory_order_relaxed);
    return not_stored(status, cfg_.max_stored_response);
  }
  return stored;
}

StoredResponse Handler::to_record(const bhttp::fields& fields, unsigned status, std::string_view body,
                                  const Ticket& ticket) {
  if (body.size() > cfg_.max_stored_response) return oversized_record(status, ticket);
  return http::to_stored_response(fields, status, body);
}

StoreError Handler::store_timeout_error() const {
  return StoreError{StoreErrc::timeout,
                    "no answer from the store within store_timeout (" + std::to_string(cfg_.store_timeout.count()) +
                        " ms)",
                    /*in_doubt=*/true};
}

auto Handler::async_begin_within(const Policy& policy, const RequestView& view, std::string_view tenant) {
  auto timed_out = [this, retry_after = policy.retry_after] {
    Decision d;
    d.verdict = Verdict::store_unavailable;
    d.retry_after = retry_after;
    d.detail = "the idempotency store did not answer in time; nothing was executed, retry later";
    d.store_error = store_timeout_error();
    return d;
  };
  // A claim that succeeds after its request got its 503 holds a key nobody will use: release
  // it, so that the client's retry executes instead of waiting out the lease.
  auto on_late = [engine = &engine_, metrics = &m_](Decision late) {
    if (late.verdict != Verdict::execute || !late.ticket) return;
    metrics->late_claims_released.fetch_add(1, std::memory_order_relaxed);
    engine->release(*late.ticket, [key = late.ticket->fence.id.key](StoreResult<FinishStatus> r) {
      if (!r) {
        log::write(LogLevel::warn, "store: releasing key " + key + ", claimed after its request timed out, failed (" +
                                       r.error().message + "); it stays in progress until its lease expires");
      }
    });
  };
  return async_store_call<Decision>(
      w_.store_deadlines, store_deadline(), timed_out, on_late,
      [engine = &engine_, policy = &policy, view = &view, tenant = std::string(tenant)](auto done) mutable {
        engine->begin(*policy, *view, std::move(tenant), std::move(done));
      },
      kAwait);
}

auto Handler::async_finish_within(const Ticket& ticket, StoredResponse&& stored) {
  return async_store_call<StoreResult<FinishStatus>>(
      w_.store_deadlines, store_deadline(), [this] { return std::unexpected(store_timeout_error()); },
      [](StoreResult<FinishStatus>) {},
      [engine = &engine_, ticket = &ticket, stored = std::move(stored)](auto done) mutable {
        engine->finish(*ticket, std::move(stored), std::move(done));
      },
      kAwait);
}

auto Handler::async_release_within(const Ticket& ticket) {
  return async_store_call<StoreResult<FinishStatus>>(
      w_.store_deadlines, store_deadline(), [this] { return std::unexpected(store_timeout_error()); },
      [](StoreResult<FinishStatus>) {},
      [engine = &engine_, ticket = &ticket](auto done) mutable { engine->release(*ticket, std::move(done)); },
      kAwait);
}

Task<FinishResult> Handler::finish(const Ticket& ticket, StoredResponse&& stored) {
  const auto t0 = Clock::now();
  auto r = co_await async_finish_within(ticket, std::move(stored));
  m_.store_call(StoreCall::finish).observe(Clock::now() - t0);
  FinishResult result = FinishResult::error;
  if (!r) {
    log::write(LogLevel::error, "store: recording the outcome of key " + ticket.fence.id.key + " failed (" +
                                    std::string(to_string(r.error().code)) + ": " + r.error().message +
                                    "); the record stays in progress until its lease expires");
  } else {
    switch (*r) {
      case FinishStatus::stored: result = FinishResult::stored; break;
      case FinishStatus::released: result = FinishResult::released; break;
      case FinishStatus::failed_retryable: result = FinishResult::failed_retryable; break;
      case FinishStatus::fenced_out: result = FinishResult::fenced_out; break;
    }
  }
  m_.count(result);
  co_return result;
}

Task<FinishResult> Handler::release(const Ticket& ticket) {
  const auto t0 = Clock::now();
  auto r = co_await async_release_within(ticket);
  m_.store_call(StoreCall::release).observe(Clock::now() - t0);
  FinishResult result = FinishResult::error;
  if (!r) {
    log::write(LogLevel::error, "store: releasing key " + ticket.fence.id.key + " failed (" + r.error().message +
                                    "); the record stays in progress until its lease expires");
  } else {
    result = *r == FinishStatus::released ? FinishResult::released : FinishResult::fenced_out;
  }
  m_.count(result);
  co_return result;
}

void Handler::prepare_forward(Request& req) {
  http::strip_hop_by_hop(req.base());
  // One scan for the fields rewritten below: each lookup by name would be a case-insensitive
  // tree search, and most requests carry none of them but Host.
  bool has_host = false, has_expect = false, has_xff = false, has_xfp = false;
  for (const auto& f : req) {
    switch (f.name()) {
      case bhttp::field::host: has_host = true; break;
      case bhttp::field::expect: has_expect = true; break;
      default:
        if (iequals(f.name_string(), kForwardedFor)) has_xff = true;
        if (iequals(f.name_string(), kForwardedProto)) has_xfp = true;
        break;
    }
  }
  if (has_expect) req.erase(bhttp::field::expect);  // answered (100 Continue) and the body already read
  // X-Forwarded-For: the client's own chain, then the client.
  if (!has_xff) {
    req.insert(kForwardedFor, s_.client_ip);
  } else {
    std::string xff;
    for (auto [it, end] = req.equal_range(kForwardedFor); it != end; ++it) {
      xff += it->value();
      xff += ", ";
    }
    xff += s_.client_ip;
    req.set(kForwardedFor, xff);
  }
  if (has_xfp) req.erase(kForwardedProto);
  req.insert(kForwardedProto, "http");
  if (!has_host) req.insert(bhttp::field::host, cfg_.upstream.authority);
  req.version(11);
  // The body was read whole; send it with a Content-Length (never chunked). Requests without a
  // body keep no framing header, except methods whose body is expected.
  const auto method = req.method();
  if (!req.body().empty() || method == bhttp::verb::post || method == bhttp::verb::put ||
      method == bhttp::verb::patch) {
    req.content_length(req.body().size());
  } else {
    req.erase(bhttp::field::content_length);
  }
}

Task<Exchange> Handler::upstream_failed(UpstreamError kind, const Ticket* ticket, unsigned version,
                                                   bool keep_alive, const std::string& detail) {
  m_.count(kind);
  Exchange ex;
  ex.upstream_error = kind;
  Problem problem;
  if (kind == UpstreamError::unreachable) {
    // Nothing was sent: the operation did not happen, so the next retry may execute it.
    if (ticket) ex.record = co_await release(*ticket);
    problem = make_problem(502, "upstream_unreachable", "The upstream could not be reached", detail);
  } else {
    // The request was sent; whether it took effect is unknown. The record stays in progress
    // until its lease expires, then on_lease_expiry decides (SPEC 4.3).
    if (ticket) {
      ex.record = FinishResult::left_in_progress;
      m_.count(FinishResult::left_in_progress);
    }
    problem = make_problem(504, "upstream_timeout", "The upstream did not answer completely", detail);
  }
  Response res = http::problem_response(problem, version, keep_alive);
  ex.status = res.result_int();
  const bool written = co_await write(res);
  ex.keep_alive = keep_alive && written;
  co_return ex;
}

// Sends a complete upstream response to the client, recording it first when a key is held: a
// client that saw the response can always replay it.
Task<Exchange> Handler::deliver(Response& res, const Ticket* ticket, unsigned version, bool keep_alive,
                                           bool head) {
  Exchange ex;
  if (ticket) {
    StoredResponse record = to_record(res.base(), res.result_int(), res.body(), *ticket);
    ex.record = co_await finish(*ticket, std::move(record));
  }
  http::strip_hop_by_hop(res.base());
  res.version(version);
  res.keep_alive(keep_alive);
  const unsigned status = res.result_int();
  if (status == 204 || status < 200) {
    res.erase(bhttp::field::content_length);
  } else if (!head && status != 304) {
    res.content_length(res.body().size());
  }
  ex.status = status;
  const bool written = co_await write(res);
  ex.keep_alive = keep_alive && written;
  co_return ex;
}


Task<Exchange> Handler::forward(Request& req, const Ticket* ticket, bool keep_alive) {
  const unsigned version = req.version();
  const bool head = req.method() == bhttp::verb::head;
  const bool retry_safe = !ticket && http::is_idempotent_method(req.method_string());
  prepare_forward(req);

  std::unique_ptr<UpstreamConn> conn;
  std::optional<bhttp::response_parser<bhttp::string_body>> parser;
  beast::error_code ec;
  Clock::time_point sent_at;
  bool fresh = false;
  for (int attempt = 0;; ++attempt) {
    auto acquired = co_await w_.pool.acquire(fresh);
    if (!acquired.conn) {
      const std::string detail =
          acquired.ec == asio::error::host_not_found
              ? "the upstream host " + cfg_.upstream.host + " does not resolve: " + w_.shared.upstream.error()
              : "connecting to the upstream failed: " + acquired.ec.message();
      co_return co_await upstream_failed(UpstreamError::unreachable, ticket, version, keep_alive, detail);
    }
    conn = std::move(acquired.conn);
    conn->stream.expires_after(cfg_.upstream_timeout);
    sent_at = Clock::now();
    const std::size_t written = co_await write_message(conn->stream, req, s_.head, ec);
    if (ec) {
      if (written == 0) {
        // Not one byte left this process: the upstream cannot have seen the request. A reused
        // connection the upstream had closed is the usual cause; try once on a new one.
        if (acquired.reused && attempt == 0) {
          fresh = true;
          continue;
        }
        const std::string detail = "sending to the upstream failed: " + ec.message();
        co_return co_await upstream_failed(UpstreamError::unreachable, ticket, version, keep_alive, detail);
      }
      const UpstreamError kind = failure_kind(ec);
      const std::string detail = "the upstream connection failed while sending the request: " + ec.message();
      co_return co_await upstream_failed(kind, ticket, version, keep_alive, detail);
    }
    // Read the response header, skipping interim (1xx) responses.
    for (;;) {
      parser.emplace();
      parser->header_limit(kUpstreamHeaderLimit);
      parser->body_limit(std::numeric_limits<std::uint64_t>::max());
      if (head) parser->skip(true);
      co_await bhttp::async_read_header(conn->stream, conn->buffer, *parser, with(ec));
      if (ec) break;
      const unsigned status = parser->get().result_int();
      if (status >= 200 || status == 101) break;
    }
    if (ec) {
      // The upstream closed a reused connection without answering. If that raced with our
      // request it never processed it, but it may also have crashed while processing it; only
      // requests that are idempotent by method, and carry no key, are sent again.
      const bool silent = !parser->got_some() && conn->buffer.size() == 0 && ec != beast::error::timeout;
      if (silent && acquired.reused && attempt == 0 && retry_safe) {
        fresh = true;
        continue;
      }
      const UpstreamError kind = failure_kind(ec);
      std::string detail = "the upstream did not answer within upstream_timeout";
      if (kind == UpstreamError::dropped) {
        detail = is_http_error(ec) && ec != bhttp::error::partial_message && ec != bhttp::error::end_of_stream
                     ? "the upstream's response is not valid HTTP: " + ec.message()
                     : "the upstream closed the connection before answering: " + ec.message();
      }
      co_return co_await upstream_failed(kind, ticket, version, keep_alive, detail);
    }
    break;
  }
  m_.upstream.observe(Clock::now() - sent_at);

  const unsigned status = parser->get().result_int();
  if (status == 101) {
    const std::string detail = "the upstream switched protocols, which the gateway does not support";
    co_return co_await upstream_failed(UpstreamError::dropped, ticket, version, keep_alive, detail);
  }
  const std::size_t limit = cfg_.max_stored_response;
  const auto length = parser->content_length();

  if (parser->is_done() || (length && *length <= limit)) {
    // Fast path: the whole body fits; read it into the string body.
    if (!parser->is_done()) co_await bhttp::async_read(conn->stream, conn->buffer, *parser, with(ec));
    if (ec) {
      const std::string detail = response_failure(ec);
      co_return co_await upstream_failed(failure_kind(ec), ticket, version, keep_alive, detail);
    }
    const bool reusable = parser->keep_alive();
    Response res = parser->release();
    if (reusable) w_.pool.release(std::move(conn));
    conn.reset();
    co_return co_await deliver(res, ticket, version, keep_alive, head);
  }

  // Slow path: unknown length (chunked, or until EOF) or too large to store. Collect up to the
  // limit; beyond it, stream to the client.
  bhttp::response_parser<bhttp::buffer_body> bp{std::move(*parser)};
  std::string collected;
  auto chunk = std::make_unique<char[]>(kChunk);
  bool streaming = false;
  bhttp::response<bhttp::buffer_body> out;
  std::optional<bhttp::response_serializer<bhttp::buffer_body>> sr;
  Exchange ex;

  auto start_streaming = [&]() -> Task<bool> {
    // The outcome is decided by the status; the body cannot be stored.
    if (ticket) {
      StoredResponse record = oversized_record(status, *ticket);
      ex.record = co_await finish(*ticket, std::move(record));
    }
    out.base() = bp.get().base();
    http::strip_hop_by_hop(out.base());
    out.version(version);
    out.erase(bhttp::field::content_length);
    bool client_keep_alive = keep_alive;
    if (length) {
      out.content_length(*length);
    } else if (version >= 11) {
      out.chunked(true);
    } else {
      client_keep_alive = false;  // HTTP/1.0 without a length: the close delimits the body
    }
    out.keep_alive(client_keep_alive);
    ex.keep_alive = client_keep_alive;
    ex.status = status;
    sr.emplace(out);
    streaming = true;
    co_return true;
  };
  auto send = [&](const char* data, std::size_t size, bool more) -> Task<bool> {
    out.body().data = size ? const_cast<char*>(data) : nullptr;
    out.body().size = size;
    out.body().more = more;
    beast::error_code wec;
    s_.stream.expires_after(cfg_.client_timeout);
    co_await bhttp::async_write(s_.stream, *sr, with(wec));
    co_return !wec || wec == bhttp::error::need_buffer;
  };

  if (length && *length > limit) co_await start_streaming();
  for (;;) {
    bp.get().body().data = chunk.get();
    bp.get().body().size = kChunk;
    conn->stream.expires_after(cfg_.upstream_timeout);
    co_await bhttp::async_read(conn->stream, conn->buffer, bp, with(ec));
    if (ec == bhttp::error::need_buffer) ec = {};
    const std::size_t n = kChunk - bp.get().body().size;
    if (ec) {
      if (!streaming) {
        const std::string detail = response_failure(ec);
        co_return co_await upstream_failed(failure_kind(ec), ticket, version, keep_alive, detail);
      }
      // Headers are already out: all we can do is cut the client connection.
      ex.upstream_error = failure_kind(ec);
      m_.count(*ex.upstream_error);
      ex.keep_alive = false;
      co_return ex;
    }
    const bool done = bp.is_done();
    if (!streaming) {
      if (collected.size() + n <= limit) {
        collected.append(chunk.get(), n);
        if (!done) continue;
        // Everything fit after all: deliver it like a fast-path response.
        const bool reusable = bp.keep_alive();
        Response res{std::move(bp.get().base())};
        res.body() = std::move(collected);
        if (reusable) w_.pool.release(std::move(conn));
        co_return co_await deliver(res, ticket, version, keep_alive, head);
      }
      co_await start_streaming();
      if (!collected.empty()) {
        const bool sent = co_await send(collected.data(), collected.size(), true);
        if (!sent) {
          ex.keep_alive = false;
          co_return ex;
        }
      }
      collected.clear();
      collected.shrink_to_fit();
    }
    const bool sent = co_await send(chunk.get(), n, !done);
    if (!sent) {
      ex.keep_alive = false;
      co_return ex;
    }
    if (done) break;
  }
  if (bp.keep_alive()) w_.pool.release(std::move(conn));
  co_return ex;
}

// The request's key as the log shows it ("-" when it has none or an invalid one).
void append_key(std::string& line, const Policy& policy, const Request& req) {
  std::string_view values[4];
  std::size_t n = 0;
  for (const auto& f : req) {
    if (n < 4 && iequals(f.name_string(), policy.key_header)) values[n++] = f.value();
  }
  auto key = parse_key(std::span<const std::string_view>(values, n), policy.key);
  if (key) {
    log::append_quoted(line, *key);
  } else {
    line += '-';
  }
}

void append_request(std::string& line, const Request& req) {
  line += " method=";
  line += req.method_string();
  line += " path=";
  log::append_quoted(line, http::split_target(req.target()).path);
}

void append_ms(std::string& line, Clock::time_point start) {
  char ms[32];
  std::snprintf(ms, sizeof ms, " ms=%.2f", std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  line += ms;
}

// The key line of a request refused before its key was claimed because its tenant could not be
// derived: verdict=tenant_ambiguous or token_* with the reason (never the token or its claims).
void log_tenant_refusal(const Problem& problem, const Policy& policy, const Request& req, unsigned status,
                        Clock::time_point start) {
  if (!log::enabled(LogLevel::info)) return;
  std::string line;
  line.reserve(256);
  line += "key tenant=- key=";
  append_key(line, policy, req);
  append_request(line, req);
  line += " verdict=";
  line += problem.code;
  line += " status=";
  line += std::to_string(status);
  line += " reason=";
  log::append_quoted(line, problem.detail);
  append_ms(line, start);
  log::write(LogLevel::info, line);
}

void Handler::log_key(const Decision& d, const Policy& policy, const std::string& tenant, const Request& req,
                      const Exchange& ex, Clock::time_point start) {
  if (!log::enabled(LogLevel::info)) return;
  std::string line;
  line.reserve(256);
  line += "key tenant=";
  log::append_quoted(line, tenant);
  line += " key=";
  if (d.ticket) {
    log::append_quoted(line, d.ticket->fence.id.key);
  } else if (d.verdict == Verdict::key_invalid || d.verdict == Verdict::key_missing) {
    line += '-';
  } else {
    append_key(line, policy, req);
  }
  append_request(line, req);
  line += " verdict=";
  line += to_string(d.verdict);
  if (d.ticket && d.ticket->kind != ClaimKind::fresh) {
    line += d.ticket->kind == ClaimKind::after_lease_expiry ? " takeover=lease_expired" : " takeover=after_failure";
  }
  line += " status=";
  line += std::to_string(ex.status);
  if (ex.record) {
    static constexpr std::string_view kNames[] = {"stored",     "released", "failed_retryable",
                                                  "fenced_out", "error",    "left_in_progress"};
    line += " record=";
    line += kNames[static_cast<std::size_t>(*ex.record)];
  }
  if (ex.upstream_error) {
    static constexpr std::string_view kNames[] = {"unreachable", "timeout", "dropped"};
    line += " upstream=";
    line += kNames[static_cast<std::size_t>(*ex.upstream_error)];
  }
  if (d.store_error) {  // why the claim failed (503): the only place an operator can read it
    line += " store_error=";
    log::append_quoted(line, d.store_error->message);
  }
  append_ms(line, start);
  log::write(LogLevel::info, line);
}

// Whether the request carries a header of that name (even an empty one).
bool has_header(std::span<const HeaderView> headers, std::string_view name) {
  for (const auto& h : headers) {
    if (iequals(h.name, name)) return true;
  }
  return false;
}

Task<bool> Handler::handle(Request& req) {
  const auto start = Clock::now();
  const bool keep_alive = req.keep_alive() && !w_.draining;
  const unsigned version = req.version();
  const Router::Match route = w_.shared.router.match(req.method_string(), http::split_target(req.target()).path);
  const Policy* policy = route.policy;
  if (policy == nullptr) {
    m_.count(Outcome::passed_through);
    const Exchange ex = co_await forward(req, nullptr, keep_alive);
    co_return ex.keep_alive;
  }

  const RequestView& view = s_.view.assign(req);
  TenantSource& source = w_.tenants.for_route(route.route);
  std::string tenant;
  // A verified token scopes keys, so a request without a key needs none: it passes through (or
  // gets 400 idempotency_key_missing) and the upstream authenticates it as it always does. With
  // a key, the token is checked before anything is claimed, forwarded or replayed.
  if (!source.verifies_tokens() || has_header(view.headers, policy->key_header)) {
    auto derived = source.derive(view.headers);
    if (!derived) {
      const Problem& problem = derived.error();
      m_.count(problem.status == 401 ? Outcome::unauthorized : Outcome::bad_request);
      Response res = http::problem_response(problem, version, keep_alive);
      const unsigned status = res.result_int();
      const bool written = co_await write(res);
      log_tenant_refusal(problem, *policy, req, status, start);
      co_return written && keep_alive;
    }
    tenant = std::move(*derived);
  }
  const auto t0 = Clock::now();
  Decision d = co_await async_begin_within(*policy, view, tenant);
  if (d.verdict != Verdict::pass_through && d.verdict != Verdict::key_missing && d.verdict != Verdict::key_invalid) {
    m_.store_call(StoreCall::begin).observe(Clock::now() - t0);
  }
  m_.count(outcome_of(d.verdict));

  Exchange ex;
  switch (d.verdict) {
    case Verdict::pass_through:
      ex = co_await forward(req, nullptr, keep_alive);
      co_return ex.keep_alive;  // not an idempotent request: no key line
    case Verdict::execute:
      if (d.ticket->kind == ClaimKind::after_lease_expiry) m_.lease_takeovers.fetch_add(1, std::memory_order_relaxed);
      if (d.ticket->kind == ClaimKind::after_failure) m_.failure_retries.fetch_add(1, std::memory_order_relaxed);
      // forward() rewrites headers only; the log line needs the method, target and ticket.
      ex = co_await forward(req, &*d.ticket, keep_alive);
      log_key(d, *policy, tenant, req, ex, start);
      co_return ex.keep_alive;
    case Verdict::replay: {
      Response res = http::replay_response(*d.replay, version, keep_alive);
      ex.status = res.result_int();
      const bool written = co_await write(res);
  ex.keep_alive = keep_alive && written;
      break;
    }
    case Verdict::record_unreadable:
      // Only an operator can fix this (restore the key, or resolve the record), so it is said at
      // error level too, which log_level = "warn" still shows. The message names the record and
      // the key id, never key material; the client's problem says neither.
      log::write(LogLevel::error, "encryption: refused to replay, and did not execute: " +
                                      (d.store_error ? d.store_error->message : std::string("unreadable record")));
      [[fallthrough]];
    default: {
      Response res = http::problem_response(*problem_for(d), version, keep_alive);
      ex.status = res.result_int();
      const bool written = co_await write(res);
  ex.keep_alive = keep_alive && written;
      break;
    }
  }
  log_key(d, *policy, tenant, req, ex, start);
  co_return ex.keep_alive;
}

// `problem` must outlive the call: pass a named object (GCC 12 mishandles temporaries that live
// across a co_await).
Task<void> answer_and_close(Session& s, const Problem& problem, unsigned version) {
  Response res = http::problem_response(problem, version == 10 ? 10 : 11, false);
  beast::error_code ec;
  s.stream.expires_after(s.worker.shared.config.client_timeout);
  co_await write_message(s.stream, res, s.head, ec);
  if (ec) co_return;
  s.stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  // Lingering close: read and drop what the client is still sending (at most 1 s, 1 MiB), so
  // that closing with unread bytes does not reset the connection before it reads the answer.
  std::size_t drained = 0;
  s.stream.expires_after(std::chrono::seconds(1));
  while (!ec && drained < 1024 * 1024) {
    drained += co_await s.stream.async_read_some(s.buffer.prepare(16 * 1024), with(ec));
  }
}

// The head rules Beast's parser does not enforce (http::check_request_head): what no request
// may carry into the store or the upstream.
std::optional<Problem> head_defect(const Request& req) {
  std::array<std::string_view, 2> hosts;  // two are enough to know there is more than one
  std::size_t host_count = 0;
  for (auto [it, end] = req.equal_range(bhttp::field::host); it != end && host_count < hosts.size(); ++it) {
    hosts[host_count++] = it->value();
  }
  std::vector<std::string_view> transfer_encodings;  // nearly always none: no allocation
  for (auto [it, end] = req.equal_range(bhttp::field::transfer_encoding); it != end; ++it) {
    transfer_encodings.push_back(it->value());
  }
  const http::HeadFacts facts{req.version(), req.method_string(), transfer_encodings,
                              std::span<const std::string_view>(hosts.data(), host_count)};
  auto defect = http::check_request_head(facts);
  if (!defect) return std::nullopt;
  const bool unsupported = defect->status == 501;
  return make_problem(static_cast<int>(defect->status), std::string(defect->code),
                      unsupported ? "The request needs what the gateway does not support"
                                  : "The request could not be parsed",
                      std::move(defect->detail));
}

Problem too_large(const Config& cfg) {
  return request_too_large("the request body exceeds max_body (" + std::to_string(cfg.max_body) + " bytes)");
}

}  // namespace

Task<void> run_session(Worker& w, Socket socket) {
  Session s(w, std::move(socket));
  const Config& cfg = w.shared.config;
  beast::error_code ec;
  {
    const auto remote = s.stream.socket().remote_endpoint(ec);
    s.client_ip = ec ? std::string("unknown") : remote.address().to_string();
    s.stream.socket().set_option(tcp::no_delay(true), ec);
  }
  Handler handler(s);
  for (;;) {
    // Wait for the next request, at most idle_timeout.
    if (s.buffer.size() == 0) {
      if (w.draining) break;
      s.idle = true;
      s.stream.expires_after(cfg.idle_timeout);
      const std::size_t n = co_await s.stream.async_read_some(s.buffer.prepare(8192), with(ec));
      s.idle = false;
      if (ec) break;  // closed, idle too long, or draining
      s.buffer.commit(n);
    }

    // The whole request must arrive within client_timeout: a slow client cannot hold on.
    bhttp::request_parser<bhttp::string_body> parser;
    parser.header_limit(static_cast<std::uint32_t>(std::min<std::size_t>(cfg.max_header, 0xffffffffu)));
    parser.body_limit(cfg.max_body);
    s.stream.expires_after(cfg.client_timeout);
    co_await bhttp::async_read_header(s.stream, s.buffer, parser, with(ec));
    if (ec == bhttp::error::header_limit) {
      w.metrics.count(Outcome::bad_request);
      const Problem problem = make_problem(431, "request_header_too_large", "The request header is too large",
                                           "the request line and headers exceed max_header (" +
                                               std::to_string(cfg.max_header) + " bytes)");
      co_await answer_and_close(s, problem, 11);
      break;
    }
    if (ec == bhttp::error::body_limit) {
      w.metrics.count(Outcome::too_large);
      const Problem problem = too_large(cfg);
      co_await answer_and_close(s, problem, parser.get().version());
      break;
    }
    if (ec) {
      if (is_http_error(ec) && ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
        w.metrics.count(Outcome::bad_request);
        const Problem problem =
            make_problem(400, "bad_request", "The request could not be parsed", "malformed HTTP request: " + ec.message());
        co_await answer_and_close(s, problem, 11);
      }
      break;
    }
    Request& req = parser.get();
    if (const std::optional<Problem> defect = head_defect(req)) {
      w.metrics.count(Outcome::bad_request);
      co_await answer_and_close(s, *defect, req.version());
      break;
    }
    if (auto expect = req.find(bhttp::field::expect); expect != req.end()) {
      if (iequals(expect->value(), "100-continue") && !parser.is_done()) {
        co_await asio::async_write(s.stream, asio::buffer(kContinue.data(), kContinue.size()), with(ec));
        if (ec) break;
      }
    }
    if (!parser.is_done()) {
      co_await bhttp::async_read(s.stream, s.buffer, parser, with(ec));
      if (ec == bhttp::error::body_limit) {
        w.metrics.count(Outcome::too_large);
        const Problem problem = too_large(cfg);
        co_await answer_and_close(s, problem, req.version());
        break;
      }
      if (ec) break;  // timeout, reset, or the client gave up mid-body
    }

    w.metrics.in_flight.fetch_add(1, std::memory_order_relaxed);
    const bool keep = co_await handler.handle(req);
    w.metrics.in_flight.fetch_sub(1, std::memory_order_relaxed);
    if (!keep || w.draining) break;
  }
  s.stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  s.stream.close();
}

}  // namespace idem::gateway
