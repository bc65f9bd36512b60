// An HTTP/2 client connection (RFC 9113), driven by nghttp2 over the session's stream. Each
// request stream becomes an HTTP/1.1-shaped request handled by its own Handler (proxy.cpp), the
// same code and policies as a request on an HTTP/1.1 connection, and is answered on its stream.
// The upstream side stays HTTP/1.1.
//
// Three kinds of coroutine share the connection, all on its event loop's thread: the reader
// (run_h2: bytes in, nghttp2_session_mem_recv), the writer (nghttp2_session_mem_send, bytes
// out, woken whenever there is something to send), and one per request stream (the Handler).
// The connection outlives them all: run_h2 returns once the writer and every stream's handler
// have finished, so a handler still waiting for the upstream when the client went away records
// its outcome as it would on HTTP/1.1.
//
// What nghttp2 enforces for us: the frame layer, HPACK (a header field above 64 KiB or a
// CONTINUATION chain longer than 8 frames ends the connection), flow control, the messaging rules
// (pseudo-headers, no connection-specific fields, Content-Length against the DATA received: a
// stream that breaks them is reset), SETTINGS_MAX_CONCURRENT_STREAMS (REFUSED_STREAM), and floods
// of SETTINGS, PING and RST_STREAM (GOAWAY). What this file adds: max_header over the decoded
// header list (431), the route's max_body (413), and a watchdog that keeps the time limits per
// stream, as they are per request over HTTP/1.1: a request that has not fully arrived within
// client_timeout, or an answer the client has taken nothing of (no flow-control credit) for
// client_timeout, has its stream reset, and the connection's other streams go on; a connection
// with nothing open for idle_timeout gets GOAWAY and is closed. GOAWAY on drain too.
#include <nghttp2/nghttp2.h>

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/steady_timer.hpp>

#include <openssl/ssl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "h2_message.hpp"
#include "idem/gateway/grpc.hpp"
#include "idem/gateway/log.hpp"
#include "idem/problem.hpp"
#include "proxy.hpp"

namespace idem::gateway {
namespace {

using http::Request;
using http::Response;

constexpr std::size_t kPieceBacklog = 256 * 1024;   // a streamed response waits while more is queued
constexpr std::size_t kWriteCoalesce = 64 * 1024;   // frames gathered into one write
constexpr std::size_t kReadSize = 16 * 1024;
constexpr std::uint32_t kResetBurst = 1000;          // RST_STREAMs a client may cause at once,
constexpr std::uint32_t kResetRate = 33;             // then per second (rapid reset, CVE-2023-44487)

}  // namespace

/// One request stream: the request as it arrives, then its answer.
struct H2Stream final : ClientSide {
  H2Stream(H2Connection& c, std::int32_t stream_id, const Session& s) : ClientSide(s.worker), connection(c), id(stream_id) {
    client_ip = s.client_ip;
    tls = s.tls;
    h2 = true;
    client_certificate = s.client_certificate;
  }

  Task<bool> write(Response& res, Millis timeout) override;
  Task<bool> write_piece(bhttp::response<bhttp::buffer_body>& out, Millis timeout) override;

  /// nghttp2's data source for the answer's body: what `pending` holds from `sent` on.
  static ssize_t read_body(nghttp2_session* session, std::int32_t stream_id, std::uint8_t* buf, std::size_t length,
                           std::uint32_t* flags, nghttp2_data_source* source, void* user_data);
  bool submit(const bhttp::fields& fields, unsigned status, bool with_body);

  H2Connection& connection;
  const std::int32_t id;
  H2Request request;        // as it arrives
  bool dispatched = false;  // handed to its handler
  // The answer.
  std::string pending;  // body bytes nghttp2 has not taken yet, from `sent` on
  std::vector<std::pair<std::string, std::string>> trailers;  // sent after the body
  std::size_t sent = 0;
  bool eof = false;        // `pending` ends the body
  bool submitted = false;  // the head is with nghttp2
  bool deferred = false;   // nghttp2 waits for more of the body (resume_data)
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();  // its HEADERS arrived
  std::chrono::steady_clock::time_point progressed{};  // the answer's head or bytes last went out
  bool closed = false;     // the stream ended (answered, reset, or the connection is gone)
  std::optional<asio::steady_timer> drained;  // write_piece waits on it while the backlog is large
};

class H2Connection {
 public:
  explicit H2Connection(Session& s) : s_(s), w_(s.worker), wake_(s.worker.io->get_executor()), done_(s.worker.io->get_executor()) {}
  H2Connection(const H2Connection&) = delete;
  H2Connection& operator=(const H2Connection&) = delete;
  ~H2Connection() {
    if (ng_ != nullptr) nghttp2_session_del(ng_);
  }

  Task<void> run();
  void drain();
  /// Something may be ready to send: wakes the writer if it waits.
  void wake() { wake_.cancel(); }
  nghttp2_session* session() const { return ng_; }
  bool gone() const { return gone_; }

 private:
  bool start();
  Task<void> writer();
  Task<void> serve(std::shared_ptr<H2Stream> stream);
  void spawn(Task<void> task);
  void finished();
  void arm_read();
  Task<void> watchdog();
  void enforce_time_limits();
  Task<bool> answer_problem(H2Stream& st, const Problem& problem, const RouteOptions& options, const Config& cfg);

  static int on_begin_headers(nghttp2_session*, const nghttp2_frame* frame, void* self);
  static int on_header(nghttp2_session*, const nghttp2_frame* frame, const std::uint8_t* name, std::size_t namelen,
                       const std::uint8_t* value, std::size_t valuelen, std::uint8_t flags, void* self);
  static int on_data_chunk(nghttp2_session*, std::uint8_t flags, std::int32_t stream_id, const std::uint8_t* data,
                           std::size_t len, void* self);
  static int on_frame_recv(nghttp2_session*, const nghttp2_frame* frame, void* self);
  static int on_stream_close(nghttp2_session*, std::int32_t stream_id, std::uint32_t error_code, void* self);

  H2Stream* stream_of(std::int32_t id) const {
    return static_cast<H2Stream*>(nghttp2_session_get_stream_user_data(ng_, id));
  }
  void headers_done(H2Stream& st);
  void dispatch(H2Stream& st);

  Session& s_;
  Worker& w_;
  nghttp2_session* ng_ = nullptr;
  std::shared_ptr<LoopConfig> config_;  // the one in force when the connection began: its limits
  std::unordered_map<std::int32_t, std::shared_ptr<H2Stream>> streams_;  // open ones
  std::chrono::steady_clock::time_point active_ = std::chrono::steady_clock::now();  // last read, or stream end
  std::optional<asio::steady_timer> watch_;  // the watchdog's
  asio::steady_timer wake_;    // the writer waits on it; cancel() wakes it
  asio::steady_timer done_;    // run() waits on it for the writer and the handlers
  std::size_t tasks_ = 0;      // the writer and the handlers still running
  std::string out_;
  bool writing_ = false;
  bool closing_ = false;  // the reader is done: the writer sends what is left and stops
  bool gone_ = false;     // the connection cannot carry anything more
  bool goaway_sent_ = false;  // by drain(): once is enough
};

// ---- a stream's answer --------------------------------------------------------------------------

bool H2Stream::submit(const bhttp::fields& fields, unsigned status, bool with_body) {
  std::string status_text;
  std::vector<std::string> names;
  const std::vector<nghttp2_nv> nv = response_fields(fields, status, status_text, names, trailers);
  if (!trailers.empty()) with_body = true;  // trailers follow DATA, even an empty one
  nghttp2_data_provider provider{};
  provider.source.ptr = this;
  provider.read_callback = &H2Stream::read_body;
  submitted = true;
  progressed = std::chrono::steady_clock::now();
  return nghttp2_submit_response(connection.session(), id, nv.data(), nv.size(), with_body ? &provider : nullptr) == 0;
}

Task<bool> H2Stream::write(Response& res, Millis) {
  if (closed || connection.gone()) co_return false;
  pending = std::move(res.body());
  sent = 0;
  eof = true;
  const bool ok = submit(res.base(), res.result_int(), !pending.empty());
  connection.wake();
  co_return ok;
}

Task<bool> H2Stream::write_piece(bhttp::response<bhttp::buffer_body>& out, Millis) {
  if (closed || connection.gone()) co_return false;
  if (sent > 0 && sent == pending.size()) {
    pending.clear();
    sent = 0;
  }
  if (out.body().size > 0) pending.append(static_cast<const char*>(out.body().data), out.body().size);
  if (!out.body().more) eof = true;
  if (!submitted) {
    if (!submit(out.base(), out.result_int(), true)) co_return false;
  } else if (deferred) {
    deferred = false;
    nghttp2_session_resume_data(connection.session(), id);
  }
  connection.wake();
  // Backpressure: the upstream is read no faster than the client takes the answer.
  while (!closed && !connection.gone() && pending.size() - sent > kPieceBacklog) {
    if (!drained) drained.emplace(worker.io->get_executor());
    drained->expires_at(asio::steady_timer::time_point::max());
    beast::error_code ec;
    co_await drained->async_wait(with(ec));
  }
  co_return !closed && !connection.gone();
}

ssize_t H2Stream::read_body(nghttp2_session* session, std::int32_t stream_id, std::uint8_t* buf, std::size_t length,
                            std::uint32_t* flags, nghttp2_data_source* source, void*) {
  auto* st = static_cast<H2Stream*>(source->ptr);
  const std::size_t n = std::min(length, st->pending.size() - st->sent);
  if (n > 0) {
    std::memcpy(buf, st->pending.data() + st->sent, n);
    st->progressed = std::chrono::steady_clock::now();
  }
  st->sent += n;
  if (st->sent == st->pending.size()) {
    if (st->eof) {
      *flags |= NGHTTP2_DATA_FLAG_EOF;
      if (!st->trailers.empty()) {
        std::vector<nghttp2_nv> nv;
        nv.reserve(st->trailers.size());
        for (const auto& [name, value] : st->trailers) nv.push_back(make_nv(name, value));
        if (nghttp2_submit_trailer(session, stream_id, nv.data(), nv.size()) == 0) *flags |= NGHTTP2_DATA_FLAG_NO_END_STREAM;
      }
    } else if (n == 0) {
      st->deferred = true;
      return NGHTTP2_ERR_DEFERRED;
    }
  }
  if (st->drained && st->pending.size() - st->sent <= kPieceBacklog) st->drained->cancel();
  return static_cast<ssize_t>(n);
}

// ---- the connection -----------------------------------------------------------------------------

bool H2Connection::start() {
  config_ = w_.config();
  const Config& cfg = config_->config();
  nghttp2_session_callbacks* callbacks = nullptr;
  if (nghttp2_session_callbacks_new(&callbacks) != 0) return false;
  nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, &H2Connection::on_begin_headers);
  nghttp2_session_callbacks_set_on_header_callback(callbacks, &H2Connection::on_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, &H2Connection::on_data_chunk);
  nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, &H2Connection::on_frame_recv);
  nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, &H2Connection::on_stream_close);
  nghttp2_option* option = nullptr;
  if (nghttp2_option_new(&option) != 0) {
    nghttp2_session_callbacks_del(callbacks);
    return false;
  }
  nghttp2_option_set_stream_reset_rate_limit(option, kResetBurst, kResetRate);
  const int rv = nghttp2_session_server_new2(&ng_, callbacks, this, option);
  nghttp2_option_del(option);
  nghttp2_session_callbacks_del(callbacks);
  if (rv != 0) return false;

  const Http2Settings& h2 = cfg.http2;
  const nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS, h2.max_concurrent_streams},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, h2.initial_window},
      {NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE, static_cast<std::uint32_t>(std::min<std::size_t>(cfg.max_header, 0x7fffffff))},
  };
  if (nghttp2_submit_settings(ng_, NGHTTP2_FLAG_NONE, settings, std::size(settings)) != 0) return false;
  // The connection's window: every stream's at once, up to 1 GiB.
  const std::uint64_t window = std::min<std::uint64_t>(std::uint64_t{h2.max_concurrent_streams} * h2.initial_window, 1u << 30);
  nghttp2_session_set_local_window_size(ng_, NGHTTP2_FLAG_NONE, 0, static_cast<std::int32_t>(std::max<std::uint64_t>(window, 65535)));
  return true;
}

// Reads wait without a deadline: the watchdog keeps the time limits per stream and closes an
// idle connection. A write in progress has its own deadline (client_timeout), and calls this once
// done so that a pending read does not inherit it (one deadline per socket: timed_stream.hpp).
void H2Connection::arm_read() {
  if (!writing_) s_.stream.expires_never();
}

// Every tick (a quarter of the shorter limit, 50 ms to 1 s) until the connection closes.
Task<void> H2Connection::watchdog() {
  const Config& cfg = config_->config();
  const auto tick = std::clamp<Millis>(std::min(cfg.client_timeout, cfg.idle_timeout) / 4, Millis(50), Millis(1000));
  watch_.emplace(w_.io->get_executor());
  beast::error_code ec;
  while (!closing_ && !gone_) {
    watch_->expires_after(tick);
    co_await watch_->async_wait(with(ec));
    if (closing_ || gone_) break;
    enforce_time_limits();
  }
}

void H2Connection::enforce_time_limits() {
  const Config& cfg = config_->config();
  const auto now = std::chrono::steady_clock::now();
  bool reset = false;
  for (auto& [id, st] : streams_) {
    if (st->closed) continue;
    // A request still arriving (its body stalled), or an answer nothing of which the client has
    // taken (it gives no flow-control credit): the stream goes, the connection stays.
    const bool request_late = !st->dispatched && now - st->started > cfg.client_timeout;
    const bool answer_stuck = st->submitted && now - st->progressed > cfg.client_timeout &&
                              (st->sent < st->pending.size() || !st->eof);
    if ((request_late || (answer_stuck && !st->deferred)) &&
        nghttp2_submit_rst_stream(ng_, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL) == 0) {
      reset = true;
      w_.metrics.http2_streams_reset.fetch_add(1, std::memory_order_relaxed);
      if (log::enabled(LogLevel::debug)) {
        log::write(LogLevel::debug, "http2: stream " + std::to_string(id) + " of " + s_.client_ip + " reset: " +
                                        (request_late ? "its request did not arrive" : "its answer was not taken") +
                                        " within client_timeout");
      }
    }
  }
  if (streams_.empty() && tasks_ <= 2 && now - active_ > cfg.idle_timeout) {
    // Nothing open, nothing running but the writer and this watchdog: GOAWAY (naming the last
    // stream processed, so the client knows what it may retry), then the writer closes.
    drain();
    return;
  }
  if (reset) wake();
}

void H2Connection::drain() {
  if (gone_ || ng_ == nullptr || goaway_sent_) return;
  goaway_sent_ = true;
  nghttp2_submit_goaway(ng_, NGHTTP2_FLAG_NONE, nghttp2_session_get_last_proc_stream_id(ng_), NGHTTP2_NO_ERROR,
                        nullptr, 0);
  wake();
}

void H2Connection::spawn(Task<void> task) {
  ++tasks_;
  asio::co_spawn(*w_.io, std::move(task), [this](std::exception_ptr e) {
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        log::write(LogLevel::error, std::string("http2 stream: ") + ex.what());
      } catch (...) {
        log::write(LogLevel::error, "http2 stream: unknown exception");
      }
    }
    finished();
  });
}

void H2Connection::finished() {
  --tasks_;
  if (tasks_ == 0) done_.cancel();
  if (!closing_) arm_read();
}

Task<void> H2Connection::run() {
  if (!start()) {
    log::write(LogLevel::error, "http2: could not set up a session (out of memory?)");
    co_return;
  }
  s_.h2 = this;
  w_.metrics.http2_connections.fetch_add(1, std::memory_order_relaxed);
  beast::error_code ec;
  // What was read before the protocol was known (the h2c preface, and perhaps more).
  bool ok = true;
  if (s_.buffer.size() > 0) {
    const auto data = s_.buffer.data();
    ok = nghttp2_session_mem_recv(ng_, static_cast<const std::uint8_t*>(data.data()), data.size()) >= 0;
    s_.buffer.consume(s_.buffer.size());
  }
  if (w_.draining) drain();
  spawn(writer());
  spawn(watchdog());
  while (ok && !gone_) {
    if (nghttp2_session_want_read(ng_) == 0 && nghttp2_session_want_write(ng_) == 0) break;
    arm_read();
    const std::size_t n = co_await s_.stream.async_read_some(s_.buffer.prepare(kReadSize), with(ec));
    if (ec) break;  // closed, timed out, or the writer ended the connection
    active_ = std::chrono::steady_clock::now();
    s_.buffer.commit(n);
    const auto data = s_.buffer.data();
    // A protocol error queues a GOAWAY and fails here: the writer still sends it.
    ok = nghttp2_session_mem_recv(ng_, static_cast<const std::uint8_t*>(data.data()), data.size()) >= 0;
    s_.buffer.consume(n);
    wake();
  }
  closing_ = true;
  if (ec) gone_ = true;  // nothing more can be sent on a connection that failed
  wake();
  if (watch_) watch_->cancel();
  while (tasks_ > 0) {
    done_.expires_at(asio::steady_timer::time_point::max());
    beast::error_code ignored;
    co_await done_.async_wait(with(ignored));
  }
  gone_ = true;
  s_.h2 = nullptr;
  for (auto& [id, st] : streams_) st->closed = true;
  streams_.clear();
  if (auto* tls = s_.stream.tls(); tls != nullptr && ec.category() != asio::error::get_ssl_category()) {
    SSL_set_shutdown(tls->native_handle(), SSL_SENT_SHUTDOWN | SSL_RECEIVED_SHUTDOWN);  // as in run_session
  }
  s_.stream.socket().shutdown(tcp::socket::shutdown_send, ec);
  s_.stream.close();
}

Task<void> H2Connection::writer() {
  const Config& cfg = config_->config();
  beast::error_code ec;
  for (;;) {
    if (gone_ || !take_frames(ng_, out_, kWriteCoalesce)) {
      gone_ = true;
      break;
    }
    if (!out_.empty()) {
      writing_ = true;
      s_.stream.expires_after(cfg.client_timeout);
      co_await asio::async_write(s_.stream, asio::buffer(out_), with(ec));
      writing_ = false;
      out_.clear();
      if (ec) {
        gone_ = true;
        break;
      }
      arm_read();
      continue;
    }
    // Nothing to send. Both sides done (GOAWAY exchanged or sent, no stream left): end the
    // connection; the reader is told by the cancelled read.
    if (closing_ || (nghttp2_session_want_read(ng_) == 0 && nghttp2_session_want_write(ng_) == 0)) break;
    wake_.expires_at(asio::steady_timer::time_point::max());
    co_await wake_.async_wait(with(ec));
  }
  if (!closing_) {
    closing_ = true;
    s_.stream.cancel();
  }
  if (watch_) watch_->cancel();
  // Streams waiting to send more: their client is gone or the connection is done.
  for (auto& [id, st] : streams_) {
    if (st->drained) st->drained->cancel();
  }
}

int H2Connection::on_begin_headers(nghttp2_session*, const nghttp2_frame* frame, void* self) {
  auto& c = *static_cast<H2Connection*>(self);
  if (frame->hd.type != NGHTTP2_HEADERS || frame->headers.cat != NGHTTP2_HCAT_REQUEST) return 0;
  auto st = std::make_shared<H2Stream>(c, frame->hd.stream_id, c.s_);
  c.w_.metrics.http2_streams.fetch_add(1, std::memory_order_relaxed);
  st->request.body_limit = c.config_->runtime().largest_max_body();
  nghttp2_session_set_stream_user_data(c.ng_, frame->hd.stream_id, st.get());
  c.streams_.emplace(frame->hd.stream_id, std::move(st));
  return 0;
}

int H2Connection::on_header(nghttp2_session*, const nghttp2_frame* frame, const std::uint8_t* name_bytes,
                            std::size_t namelen, const std::uint8_t* value_bytes, std::size_t valuelen, std::uint8_t,
                            void* self) {
  auto& c = *static_cast<H2Connection*>(self);
  H2Stream* st = c.stream_of(frame->hd.stream_id);
  if (st == nullptr || st->dispatched) return 0;
  st->request.add_field(std::string_view(reinterpret_cast<const char*>(name_bytes), namelen),
                        std::string_view(reinterpret_cast<const char*>(value_bytes), valuelen),
                        frame->headers.cat != NGHTTP2_HCAT_REQUEST, c.config_->config().max_header);
  return 0;
}

int H2Connection::on_data_chunk(nghttp2_session*, std::uint8_t, std::int32_t stream_id, const std::uint8_t* data,
                                std::size_t len, void* self) {
  auto& c = *static_cast<H2Connection*>(self);
  H2Stream* st = c.stream_of(stream_id);
  if (st == nullptr || st->dispatched) return 0;
  if (!st->request.add_data(std::string_view(reinterpret_cast<const char*>(data), len))) {
    // Answer 413 now: reading the rest would only fill memory.
    c.dispatch(*st);
  }
  return 0;
}

void H2Connection::headers_done(H2Stream& st) {
  // The route's own max_body applies from here on; a declared length above it is refused now.
  const Runtime& runtime = config_->runtime();
  H2Request& request = st.request;
  const Router::Match route = runtime.router().match(request.req.method_string(), http::split_target(request.req.target()).path);
  request.body_limit = runtime.options(route.route).max_body;
  if (const auto declared = request.declared_length(); declared && *declared > request.body_limit) {
    request.body_too_large = true;
    dispatch(st);
  } else if (request.header_too_large || request.req.method() == bhttp::verb::connect) {
    dispatch(st);  // refused whatever follows (431, 501): at once, not when the client ends the stream
  }
}

int H2Connection::on_frame_recv(nghttp2_session*, const nghttp2_frame* frame, void* self) {
  auto& c = *static_cast<H2Connection*>(self);
  if (frame->hd.type != NGHTTP2_HEADERS && frame->hd.type != NGHTTP2_DATA) return 0;
  H2Stream* st = c.stream_of(frame->hd.stream_id);
  if (st == nullptr || st->dispatched) return 0;
  if (frame->hd.type == NGHTTP2_HEADERS && frame->headers.cat == NGHTTP2_HCAT_REQUEST) c.headers_done(*st);
  if (!st->dispatched && (frame->hd.flags & NGHTTP2_FLAG_END_STREAM) != 0) c.dispatch(*st);
  return 0;
}

int H2Connection::on_stream_close(nghttp2_session*, std::int32_t stream_id, std::uint32_t, void* self) {
  auto& c = *static_cast<H2Connection*>(self);
  auto it = c.streams_.find(stream_id);
  if (it == c.streams_.end()) return 0;
  H2Stream& st = *it->second;
  st.closed = true;
  if (st.drained) st.drained->cancel();
  c.active_ = std::chrono::steady_clock::now();
  c.streams_.erase(it);  // its handler, if any, holds it until it returns
  return 0;
}

void H2Connection::dispatch(H2Stream& st) {
  st.dispatched = true;
  spawn(serve(streams_.at(st.id)));
}

Task<bool> H2Connection::answer_problem(H2Stream& st, const Problem& problem, const RouteOptions& options,
                                        const Config& cfg) {
  const bool grpc = grpc::is_grpc_content_type(st.request.req[bhttp::field::content_type]);
  Response res = grpc ? grpc_answer(problem) : problem_response(problem, options, 11, true);
  co_return co_await st.write(res, cfg.client_timeout);
}

Task<void> H2Connection::serve(std::shared_ptr<H2Stream> stream) {
  H2Stream& st = *stream;
  // Each request is handled with the configuration in force when it has arrived.
  std::shared_ptr<LoopConfig> config = w_.config();
  const Config& cfg = config->config();
  const Runtime& runtime = config->runtime();
  H2Request& request = st.request;
  if (request.header_too_large) {
    w_.metrics.count(Outcome::bad_request);
    const Problem problem = make_problem(431, "request_header_too_large", "The request header is too large",
                                         "the request headers exceed max_header (" + std::to_string(cfg.max_header) +
                                             " bytes)");
    co_await answer_problem(st, problem, runtime.options(Router::kNoRoute), cfg);
    co_return;
  }
  const Router::Match route =
      runtime.router().match(request.req.method_string(), http::split_target(request.req.target()).path);
  const RouteOptions& options = runtime.options(route.route);
  if (request.body_too_large || request.req.body().size() > options.max_body) {
    w_.metrics.count(Outcome::too_large);
    const Problem problem = request_too_large("the request body exceeds max_body (" +
                                              std::to_string(options.max_body) + " bytes)");
    co_await answer_problem(st, problem, options, cfg);
    co_return;
  }
  if (const std::optional<Problem> defect = request.finish()) {
    w_.metrics.count(Outcome::bad_request);
    co_await answer_problem(st, *defect, options, cfg);
    co_return;
  }

  w_.metrics.in_flight.fetch_add(1, std::memory_order_relaxed);
  Handler handler(st);
  co_await handler.handle(request.req, std::move(config), route);
  w_.metrics.in_flight.fetch_sub(1, std::memory_order_relaxed);
  if (!st.closed && !gone_ && (!st.submitted || !st.eof)) {
    // The answer was cut off (the upstream broke in the middle of a streamed body), or never
    // begun: the stream is reset, as an HTTP/1.1 connection is closed, so the client does not
    // wait for the rest.
    nghttp2_submit_rst_stream(ng_, NGHTTP2_FLAG_NONE, st.id, NGHTTP2_INTERNAL_ERROR);
    wake();
  }
}

// ---- entry points -------------------------------------------------------------------------------

Task<void> run_h2(Session& s) {
  H2Connection connection(s);
  co_await connection.run();
}

void drain(H2Connection& connection) { connection.drain(); }

}  // namespace idem::gateway
