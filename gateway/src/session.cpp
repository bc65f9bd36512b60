// A client connection: reads each request within max_header, its route's max_body and
// client_timeout, refuses what cannot be framed safely (answering in the route's error envelope,
// then closing), and hands the rest to the Handler (proxy.cpp).
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>

#include <algorithm>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "idem/gateway/log.hpp"
#include "idem/problem.hpp"
#include "h2_upstream.hpp"
#include "proxy.hpp"

namespace idem::gateway {
namespace {

using http::Request;
using http::Response;

constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

// `problem` must outlive the call: pass a named object (GCC 12 mishandles temporaries that live
// across a co_await).
Task<void> answer_and_close(Session& s, const Problem& problem, const RouteOptions& options, const Config& cfg,
                            unsigned version) {
  Response res = problem_response(problem, options, version == 10 ? 10 : 11, false);
  beast::error_code ec;
  s.stream.expires_after(cfg.client_timeout);
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

Problem too_large(std::size_t limit) {
  return request_too_large("the request body exceeds max_body (" + std::to_string(limit) + " bytes)");
}

// The route a request head names, for its limits and its error envelope.
Router::Match route_of(const Runtime& runtime, const Request& req) {
  return runtime.router().match(req.method_string(), http::split_target(req.target()).path);
}

constexpr std::string_view kPlainOnTlsPort =
    "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: 64\r\n\r\n"
    "This port speaks HTTPS: send the request with https:// instead.\n";
static_assert(kPlainOnTlsPort.size() - kPlainOnTlsPort.find("\r\n\r\n") - 4 == 64);

// The TLS handshake of a connection to the [tls] listener, within client_timeout. A client that
// sent plain HTTP gets a plain 400 saying so; any other failure closes the connection (the
// reason at debug level: scanners and health checks fail handshakes all day).
Task<bool> handshake(Session& s) {
  Worker& w = s.worker;
  beast::error_code ec;
  s.stream.expires_after(w.config()->config().client_timeout);
  co_await s.stream.tls()->async_handshake(asio::ssl::stream_base::server, with(ec));
  SSL* ssl = s.stream.tls()->native_handle();
  if (ec) {
    w.metrics.tls_handshake_failures.fetch_add(1, std::memory_order_relaxed);
    if (ec.category() == asio::error::get_ssl_category() && ERR_GET_REASON(ec.value()) == SSL_R_HTTP_REQUEST) {
      beast::error_code ignored;
      s.stream.expires_after(std::chrono::seconds(1));
      co_await asio::async_write(s.stream.socket(), asio::buffer(kPlainOnTlsPort.data(), kPlainOnTlsPort.size()),
                                 with(ignored));
      s.stream.socket().shutdown(tcp::socket::shutdown_send, ignored);
    }
    if (log::enabled(LogLevel::debug)) log::write(LogLevel::debug, "TLS handshake with " + s.client_ip + " failed: " + ec.message());
    co_return false;
  }
  w.metrics.tls_handshakes.fetch_add(1, std::memory_order_relaxed);
  if (SSL_session_reused(ssl) == 1) w.metrics.tls_resumed.fetch_add(1, std::memory_order_relaxed);
  s.client_certificate = verified_client_certificate(ssl);
  co_return true;
}

bool is_h2(Session& s) {
  const unsigned char* alpn = nullptr;
  unsigned int size = 0;
  SSL_get0_alpn_selected(s.stream.tls()->native_handle(), &alpn, &size);
  return size == 2 && alpn[0] == 'h' && alpn[1] == '2';
}

// The h2c connection preface (RFC 9113, 3.4), which no HTTP/1.1 request line can begin with.
constexpr std::string_view kH2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

// Whether a plain connection's first bytes are (so far) the h2c preface.
bool starts_like_h2(const beast::flat_buffer& buffer) {
  const std::string_view got(static_cast<const char*>(buffer.data().data()), buffer.size());
  const std::size_t n = std::min(got.size(), kH2Preface.size());
  return n > 0 && got.substr(0, n) == kH2Preface.substr(0, n);
}

}  // namespace

Task<bool> Session::write(Response& res, Millis timeout) {
  beast::error_code ec;
  stream.expires_after(timeout);
  co_await write_message(stream, res, head, ec);
  co_return !ec;
}

Task<bool> Session::write_piece(bhttp::response<bhttp::buffer_body>& out, Millis timeout) {
  if (!piece_serializer_ || &piece_serializer_->get() != &out) piece_serializer_.emplace(out);
  beast::error_code ec;
  stream.expires_after(timeout);
  co_await bhttp::async_write(stream, *piece_serializer_, with(ec));
  if (!out.body().more) piece_serializer_.reset();
  co_return !ec || ec == bhttp::error::need_buffer;
}

Worker::Worker(std::size_t index, const Shared& shared, MetricsShard& metrics)
    : store_deadlines(metrics.store_timeouts),
      index(index),
      shared(shared),
      metrics(metrics),
      pool(*io, deadlines, metrics),
      config_(std::make_shared<LoopConfig>(shared.current())) {}

Worker::~Worker() {
  // Pooled sockets belong to the io_context: close them first. Sessions waiting for a store are
  // held by their store call, not by the io_context: destroy them while it still exists. Then
  // destroy the io_context, and with it every other suspended session, while the members those
  // sessions unlink from still live.
  pool.clear();
  h2_upstream.reset();
  store_deadlines.abandon_all();
  io.reset();
}

void Worker::drain() {
  draining = true;
  for (Session* s = sessions; s != nullptr; s = s->next) {
    if (s->h2 != nullptr) {
      gateway::drain(*s->h2);
    } else if (s->idle) {
      s->stream.cancel();
    }
  }
}

Task<void> run_session(Worker& w, Socket socket, std::shared_ptr<asio::ssl::context> tls) {
  Session s(w, std::move(socket), std::move(tls));
  beast::error_code ec;
  {
    const auto remote = s.stream.socket().remote_endpoint(ec);
    s.client_ip = ec ? std::string("unknown") : remote.address().to_string();
    s.stream.socket().set_option(tcp::no_delay(true), ec);
  }
  if (s.stream.tls() != nullptr && !co_await handshake(s)) {
    s.stream.close();
    co_return;
  }
  if (s.stream.tls() != nullptr ? is_h2(s) : w.config()->config().http2.cleartext) {
    if (s.stream.tls() == nullptr) {
      // h2c with prior knowledge, beside HTTP/1.1: the first bytes say which (within idle_timeout).
      s.idle = true;
      s.stream.expires_after(w.config()->config().idle_timeout);
      while (s.buffer.size() == 0 || (s.buffer.size() < kH2Preface.size() && starts_like_h2(s.buffer))) {
        const std::size_t n = co_await s.stream.async_read_some(s.buffer.prepare(8192), with(ec));
        s.buffer.commit(n);
        if (ec) break;  // closed, idle too long, or draining (drain() cancels an idle session)
      }
      s.idle = false;
      if (ec || s.buffer.size() == 0) {
        s.stream.close();
        co_return;
      }
    }
    if (s.stream.tls() != nullptr || starts_like_h2(s.buffer)) {
      co_await run_h2(s);
      co_return;
    }
  }
  Handler handler(s);
  for (;;) {
    // Each request is read and handled with the configuration in force when it starts (a reload
    // in between applies to the next one).
    std::shared_ptr<LoopConfig> config = w.config();
    const Config& cfg = config->config();
    const Runtime& runtime = config->runtime();
    const RouteOptions& unrouted = runtime.options(Router::kNoRoute);

    // Wait for the next request, at most idle_timeout.
    if (s.buffer.size() == 0) {
      if (w.draining) break;
      s.idle = true;
      s.stream.expires_after(cfg.idle_timeout);
      const std::size_t n = co_await s.stream.async_read_some(s.buffer.prepare(8192), with(ec));
      s.idle = false;
      if (ec) break;  // closed, idle too long, or draining
      s.buffer.commit(n);
      if (w.config() != config) continue;  // reloaded while waiting: read it with the new one
    }

    // The whole request must arrive within client_timeout: a slow client cannot hold on. The
    // head is read with the largest body limit of any route; the route's own applies once the
    // head says which route it is.
    bhttp::request_parser<bhttp::string_body> parser;
    parser.header_limit(static_cast<std::uint32_t>(std::min<std::size_t>(cfg.max_header, 0xffffffffu)));
    parser.body_limit(runtime.largest_max_body());
    s.stream.expires_after(cfg.client_timeout);
    co_await bhttp::async_read_header(s.stream, s.buffer, parser, with(ec));
    if (ec == bhttp::error::header_limit) {
      w.metrics.count(Outcome::bad_request);
      const Problem problem = make_problem(431, "request_header_too_large", "The request header is too large",
                                           "the request line and headers exceed max_header (" +
                                               std::to_string(cfg.max_header) + " bytes)");
      co_await answer_and_close(s, problem, unrouted, cfg, 11);
      break;
    }
    if (ec == bhttp::error::body_limit) {
      // A Content-Length above every route's limit; the head was parsed.
      w.metrics.count(Outcome::too_large);
      const RouteOptions& options = runtime.options(route_of(runtime, parser.get()).route);
      const Problem problem = too_large(options.max_body);
      co_await answer_and_close(s, problem, options, cfg, parser.get().version());
      break;
    }
    if (ec) {
      if (is_http_error(ec) && ec != bhttp::error::end_of_stream && ec != bhttp::error::partial_message) {
        w.metrics.count(Outcome::bad_request);
        const Problem problem =
            make_problem(400, "bad_request", "The request could not be parsed", "malformed HTTP request: " + ec.message());
        co_await answer_and_close(s, problem, unrouted, cfg, 11);
      }
      break;
    }
    Request& req = parser.get();
    const Router::Match route = route_of(runtime, req);
    const RouteOptions& options = runtime.options(route.route);
    if (const std::optional<Problem> defect = head_defect(req)) {
      w.metrics.count(Outcome::bad_request);
      co_await answer_and_close(s, *defect, options, cfg, req.version());
      break;
    }
    if (options.max_body < runtime.largest_max_body()) {
      if (const auto length = parser.content_length(); length && *length > options.max_body) {
        w.metrics.count(Outcome::too_large);
        const Problem problem = too_large(options.max_body);
        co_await answer_and_close(s, problem, options, cfg, req.version());
        break;
      }
      parser.body_limit(options.max_body);  // a chunked body is counted against it as it arrives
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
        const Problem problem = too_large(options.max_body);
        co_await answer_and_close(s, problem, options, cfg, req.version());
        break;
      }
      if (ec) break;  // timeout, reset, or the client gave up mid-body
    }

    w.metrics.in_flight.fetch_add(1, std::memory_order_relaxed);
    const bool keep = co_await handler.handle(req, config, route);
    w.metrics.in_flight.fetch_sub(1, std::memory_order_relaxed);
    if (!keep || w.draining) break;
  }
  if (auto* tls = s.stream.tls(); tls != nullptr && ec.category() != asio::error::get_ssl_category()) {
    // OpenSSL drops a session from the server's cache when its connection is freed without a TLS
    // shutdown, and the gateway closes without one (as most HTTP servers and clients do): mark it
    // shut down, unless a TLS error ended it, so that the client can resume it by session id.
    SSL_set_shutdown(tls->native_handle(), SSL_SENT_SHUTDOWN | SSL_RECEIVED_SHUTDOWN);
  }
  s.stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  s.stream.close();
}

}  // namespace idem::gateway
