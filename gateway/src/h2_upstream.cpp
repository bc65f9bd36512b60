// HTTP/2 to the upstream (upstream_protocol = "h2"): a few connections per event loop, each
// carrying many requests at once as streams, which is what gRPC servers expect. A connection is
// made through the upstream pool (TCP, and TLS with ALPN h2 for https://), then driven by nghttp2
// with a reader and a writer coroutine, like the client side (h2_session.cpp). A request waits for
// its whole response: status, head, body and trailers; the response is then handled like an
// HTTP/1.1 one (recorded, answered), trailers included.
#include "h2_upstream.hpp"

#include <nghttp2/nghttp2.h>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>

#include <openssl/ssl.h>

#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "h2_message.hpp"
#include "idem/gateway/log.hpp"

namespace idem::gateway {
namespace {

constexpr std::size_t kMaxConnections = 4;       // per event loop; beyond, streams queue in nghttp2
constexpr std::size_t kStreamsBeforeAnother = 64;  // open streams on a connection before another is made
constexpr std::size_t kWriteCoalesce = 64 * 1024;
constexpr std::size_t kReadSize = 16 * 1024;
constexpr std::uint32_t kWindow = 1u << 20;      // per stream: responses are read as they come


}  // namespace

/// One request stream on an upstream connection. The connection holds it until nghttp2 closes
/// the stream, so a call given up on (its deadline) is never read from after its caller left.
struct H2Call {
  explicit H2Call(const Executor& ex) : done(ex) {}
  const std::string* body = nullptr;  // the request's, sent from `sent` on; only while !abandoned
  std::size_t sent = 0;
  std::size_t max_body = 0;
  H2Reply reply;
  bool finished = false;
  bool abandoned = false;  // its caller gave up: the stream is being reset
  bool head_done = false;  // the final response head has arrived: HEADERS from now on are trailers
  asio::steady_timer done;  // expires at the deadline; cancelled when the call finishes
};

class H2ClientConnection : public std::enable_shared_from_this<H2ClientConnection> {
 public:
  H2ClientConnection(Worker& w, std::unique_ptr<UpstreamConn> conn, std::string scheme, Millis write_timeout)
      : w_(w), conn_(std::move(conn)), scheme_(std::move(scheme)), write_timeout_(write_timeout),
        wake_(w.io->get_executor()) {}
  ~H2ClientConnection() {
    if (ng_ != nullptr) nghttp2_session_del(ng_);
  }
  H2ClientConnection(const H2ClientConnection&) = delete;
  H2ClientConnection& operator=(const H2ClientConnection&) = delete;

  bool start();
  /// Whether a new request may go on it now.
  bool usable(std::uint64_t upstream_id) const {
    if (dead_ || goaway_ || conn_->upstream_id != upstream_id) return false;
    return calls_.size() < nghttp2_session_get_remote_settings(ng_, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS);
  }
  bool dead() const { return dead_ || goaway_; }
  /// Connected to the upstream of an earlier configuration (a reload named another).
  bool stale(std::uint64_t upstream_id) const { return conn_->upstream_id != upstream_id; }
  std::size_t load() const { return calls_.size(); }
  /// Submits the request; false (nothing sent) if the connection cannot take it.
  bool submit(const http::Request& req, const std::string& authority, const std::shared_ptr<H2Call>& call);
  void cancel(H2Call& call);
  void close() {
    dead_ = true;
    wake_.cancel();
    conn_->stream.cancel();
  }

 private:
  Task<void> reader(std::shared_ptr<H2ClientConnection> self);
  Task<void> writer(std::shared_ptr<H2ClientConnection> self);
  void fail_all(const std::string& why);
  void finish(H2Call& call);

  static ssize_t read_request_body(nghttp2_session*, std::int32_t, std::uint8_t* buf, std::size_t length,
                                   std::uint32_t* flags, nghttp2_data_source* source, void*);
  static int on_header(nghttp2_session*, const nghttp2_frame* frame, const std::uint8_t* name, std::size_t namelen,
                       const std::uint8_t* value, std::size_t valuelen, std::uint8_t flags, void* self);
  static int on_data_chunk(nghttp2_session*, std::uint8_t flags, std::int32_t stream_id, const std::uint8_t* data,
                           std::size_t len, void* self);
  static int on_frame_recv(nghttp2_session*, const nghttp2_frame* frame, void* self);
  static int on_stream_close(nghttp2_session*, std::int32_t stream_id, std::uint32_t error_code, void* self);

  H2Call* call_of(std::int32_t id) const {
    auto it = calls_.find(id);
    return it == calls_.end() || it->second->abandoned ? nullptr : it->second.get();
  }

  Worker& w_;
  std::unique_ptr<UpstreamConn> conn_;
  std::string scheme_;
  Millis write_timeout_;  // upstream_timeout: an upstream that stops reading ends the connection
  nghttp2_session* ng_ = nullptr;
  std::unordered_map<std::int32_t, std::shared_ptr<H2Call>> calls_;
  asio::steady_timer wake_;
  std::string out_;
  bool dead_ = false;
  bool goaway_ = false;
};

// ---- one connection ------------------------------------------------------------------------------

bool H2ClientConnection::start() {
  nghttp2_session_callbacks* callbacks = nullptr;
  if (nghttp2_session_callbacks_new(&callbacks) != 0) return false;
  nghttp2_session_callbacks_set_on_header_callback(callbacks, &H2ClientConnection::on_header);
  nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, &H2ClientConnection::on_data_chunk);
  nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, &H2ClientConnection::on_frame_recv);
  nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, &H2ClientConnection::on_stream_close);
  const int rv = nghttp2_session_client_new(&ng_, callbacks, this);
  nghttp2_session_callbacks_del(callbacks);
  if (rv != 0) return false;
  const nghttp2_settings_entry settings[] = {
      {NGHTTP2_SETTINGS_ENABLE_PUSH, 0},
      {NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE, kWindow},
  };
  if (nghttp2_submit_settings(ng_, NGHTTP2_FLAG_NONE, settings, std::size(settings)) != 0) return false;
  nghttp2_session_set_local_window_size(ng_, NGHTTP2_FLAG_NONE, 0, static_cast<std::int32_t>(kWindow * 16));
  conn_->stream.expires_never();
  asio::co_spawn(*w_.io, reader(shared_from_this()), asio::detached);
  asio::co_spawn(*w_.io, writer(shared_from_this()), asio::detached);
  return true;
}

bool H2ClientConnection::submit(const http::Request& req, const std::string& authority,
                                const std::shared_ptr<H2Call>& call) {
  if (dead()) return false;
  std::vector<std::string> names;
  std::size_t count = 0;
  for (auto it = req.begin(); it != req.end(); ++it) ++count;
  names.reserve(count);
  std::vector<nghttp2_nv> nv;
  nv.reserve(count + 4);
  const std::string_view method = req.method_string();
  const std::string_view target = req.target();
  nv.push_back(make_nv(":method", method));
  nv.push_back(make_nv(":scheme", scheme_));
  auto host = req.find(bhttp::field::host);
  nv.push_back(make_nv(":authority", host != req.end() ? host->value() : std::string_view(authority)));
  nv.push_back(make_nv(":path", target.empty() ? std::string_view("/") : target));
  for (const auto& field : req) {
    const std::string_view name = field.name_string();
    if (is_connection_specific(name) || iequals(name, "host")) continue;  // Host went as :authority
    // TE is allowed in HTTP/2 only as "trailers" (gRPC sends it).
    if (iequals(name, "te") && !iequals(field.value(), "trailers")) continue;
    nv.push_back(make_nv(lowercase_name(name, names), field.value()));
  }
  call->body = &req.body();
  call->sent = 0;
  nghttp2_data_provider provider{};
  provider.source.ptr = call.get();
  provider.read_callback = &H2ClientConnection::read_request_body;
  const std::int32_t id =
      nghttp2_submit_request(ng_, nullptr, nv.data(), nv.size(), req.body().empty() ? nullptr : &provider, nullptr);
  if (id < 0) return false;
  calls_.emplace(id, call);
  wake_.cancel();
  return true;
}

void H2ClientConnection::cancel(H2Call& call) {
  call.abandoned = true;
  call.body = nullptr;
  for (auto& [id, held] : calls_) {
    if (held.get() != &call) continue;
    nghttp2_submit_rst_stream(ng_, NGHTTP2_FLAG_NONE, id, NGHTTP2_CANCEL);
    wake_.cancel();
    return;
  }
}

void H2ClientConnection::finish(H2Call& call) {
  call.finished = true;
  call.done.cancel();
}

void H2ClientConnection::fail_all(const std::string& why) {
  dead_ = true;
  for (auto& [id, call] : calls_) {
    if (call->finished || call->abandoned) continue;
    call->reply.ok = false;
    call->reply.error = UpstreamError::dropped;
    call->reply.detail = why;
    finish(*call);
  }
  calls_.clear();
}

Task<void> H2ClientConnection::reader(std::shared_ptr<H2ClientConnection> /*keeps it alive*/) {
  beast::error_code ec;
  while (!dead_) {
    const std::size_t n = co_await conn_->stream.async_read_some(conn_->buffer.prepare(kReadSize), with(ec));
    if (ec) break;
    conn_->buffer.commit(n);
    const auto data = conn_->buffer.data();
    const ssize_t rv = nghttp2_session_mem_recv(ng_, static_cast<const std::uint8_t*>(data.data()), data.size());
    conn_->buffer.consume(n);
    wake_.cancel();
    if (rv < 0) {
      ec = asio::error::invalid_argument;
      break;
    }
    if (nghttp2_session_want_read(ng_) == 0 && nghttp2_session_want_write(ng_) == 0) break;
  }
  fail_all(ec ? "the upstream connection broke in the middle of the response: " + ec.message()
              : std::string("the upstream closed the HTTP/2 connection before answering"));
  wake_.cancel();
  conn_->stream.close();
}

Task<void> H2ClientConnection::writer(std::shared_ptr<H2ClientConnection> /*keeps it alive*/) {
  beast::error_code ec;
  while (!dead_) {
    if (!take_frames(ng_, out_, kWriteCoalesce)) {
      ec = asio::error::invalid_argument;
      break;
    }
    if (!out_.empty()) {
      // The read pending meanwhile shares this deadline (one per socket), and none after it.
      conn_->stream.expires_after(write_timeout_);
      co_await asio::async_write(conn_->stream, asio::buffer(out_), with(ec));
      conn_->stream.expires_never();
      out_.clear();
      if (ec) break;
      continue;
    }
    wake_.expires_at(asio::steady_timer::time_point::max());
    co_await wake_.async_wait(with(ec));
    ec = {};
  }
  if (!dead_) {
    fail_all("sending to the upstream failed: " + ec.message());
    conn_->stream.cancel();
  }
}

ssize_t H2ClientConnection::read_request_body(nghttp2_session*, std::int32_t, std::uint8_t* buf, std::size_t length,
                                               std::uint32_t* flags, nghttp2_data_source* source, void*) {
  auto* call = static_cast<H2Call*>(source->ptr);
  if (call->abandoned) return NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE;  // resets the stream
  const std::size_t n = std::min(length, call->body->size() - call->sent);
  if (n > 0) std::memcpy(buf, call->body->data() + call->sent, n);
  call->sent += n;
  if (call->sent == call->body->size()) *flags |= NGHTTP2_DATA_FLAG_EOF;
  return static_cast<ssize_t>(n);
}

int H2ClientConnection::on_header(nghttp2_session*, const nghttp2_frame* frame, const std::uint8_t* name_bytes,
                                  std::size_t namelen, const std::uint8_t* value_bytes, std::size_t valuelen,
                                  std::uint8_t, void* self) {
  auto& c = *static_cast<H2ClientConnection*>(self);
  H2Call* call = c.call_of(frame->hd.stream_id);
  if (call == nullptr || frame->hd.type != NGHTTP2_HEADERS) return 0;
  const std::string_view name(reinterpret_cast<const char*>(name_bytes), namelen);
  const std::string_view value(reinterpret_cast<const char*>(value_bytes), valuelen);
  if (call->head_done) {
    call->reply.trailers.emplace_back(name, value);  // a HEADERS frame after the final head
  } else if (name == ":status") {
    unsigned status = 0;
    for (char ch : value) status = status * 10 + static_cast<unsigned>(ch - '0');  // nghttp2 checked: 3 digits
    call->reply.status = status;
  } else if (call->reply.status >= 200) {
    call->reply.head.insert(name, value);
  }  // else a 1xx head's fields: informational, the final head follows
  return 0;
}

int H2ClientConnection::on_data_chunk(nghttp2_session* session, std::uint8_t, std::int32_t stream_id,
                                      const std::uint8_t* data, std::size_t len, void* self) {
  auto& c = *static_cast<H2ClientConnection*>(self);
  H2Call* call = c.call_of(stream_id);
  if (call == nullptr) return 0;
  if (call->reply.body.size() + len > call->max_body) {
    call->reply.ok = false;
    call->reply.too_large = true;
    call->reply.body.clear();
    call->reply.detail = "the upstream's response body exceeds " + std::to_string(call->max_body) +
                         " bytes, the most an HTTP/2 upstream's response may carry";
    nghttp2_submit_rst_stream(session, NGHTTP2_FLAG_NONE, stream_id, NGHTTP2_CANCEL);
    call->abandoned = true;
    call->body = nullptr;
    c.finish(*call);
    return 0;
  }
  call->reply.body.append(reinterpret_cast<const char*>(data), len);
  return 0;
}

int H2ClientConnection::on_frame_recv(nghttp2_session*, const nghttp2_frame* frame, void* self) {
  auto& c = *static_cast<H2ClientConnection*>(self);
  if (frame->hd.type == NGHTTP2_HEADERS) {
    if (H2Call* call = c.call_of(frame->hd.stream_id); call != nullptr) {
      if (call->reply.status >= 200) {
        call->head_done = true;
      } else {
        call->reply.status = 0;  // a 1xx head ended
      }
    }
  }
  if (frame->hd.type == NGHTTP2_GOAWAY) {
    // Streams above the last one it processed never ran: they fail as "sent nothing" when closed.
    c.goaway_ = true;
    for (auto& [id, call] : c.calls_) {
      if (id > frame->goaway.last_stream_id) call->reply.sent_nothing = true;
    }
  }
  return 0;
}

int H2ClientConnection::on_stream_close(nghttp2_session*, std::int32_t stream_id, std::uint32_t error_code, void* self) {
  auto& c = *static_cast<H2ClientConnection*>(self);
  auto it = c.calls_.find(stream_id);
  if (it == c.calls_.end()) return 0;
  const std::shared_ptr<H2Call> held = std::move(it->second);
  c.calls_.erase(it);
  H2Call& call = *held;
  if (call.finished || call.abandoned) return 0;
  if (error_code == NGHTTP2_NO_ERROR && call.head_done) {
    call.reply.ok = true;
  } else {
    call.reply.ok = false;
    call.reply.error = UpstreamError::dropped;
    if (error_code == NGHTTP2_REFUSED_STREAM) call.reply.sent_nothing = true;
    call.reply.detail = std::string("the upstream reset the HTTP/2 stream (") + nghttp2_http2_strerror(error_code) + ")";
  }
  c.finish(call);
  return 0;
}

// ---- the event loop's connections ---------------------------------------------------------------

H2Upstream::~H2Upstream() {
  for (auto& c : connections_) c->close();
}

Task<std::shared_ptr<H2ClientConnection>> H2Upstream::connection(LoopConfig& config, H2Reply& failure) {
  const std::uint64_t upstream_id = config.upstream().id();
  for (;;) {
    // Connections that are done, or to the upstream of an earlier configuration, go once idle.
    std::erase_if(connections_, [&](const auto& c) {
      if (c->load() != 0 || (!c->dead() && !c->stale(upstream_id))) return false;
      c->close();
      return true;
    });
    std::shared_ptr<H2ClientConnection> best;
    for (const auto& c : connections_) {
      if (c->usable(upstream_id) && (!best || c->load() < best->load())) best = c;
    }
    if (best && (best->load() < kStreamsBeforeAnother || connections_.size() >= kMaxConnections || connecting_)) {
      co_return best;
    }
    if (!connecting_) break;
    // Another request is connecting: wait for it rather than open a connection each.
    if (!connected_) connected_ = std::make_unique<asio::steady_timer>(w_.io->get_executor());
    connected_->expires_at(asio::steady_timer::time_point::max());
    beast::error_code ignored;
    co_await connected_->async_wait(with(ignored));
  }
  connecting_ = true;
  const Config& cfg = config.config();
  auto acquired = co_await w_.pool.acquire(true, config.upstream(), cfg, config.snapshot->upstream_tls, /*h2=*/true);
  connecting_ = false;
  if (connected_) connected_->cancel();
  if (!acquired.conn) {
    failure.error = UpstreamError::unreachable;
    failure.sent_nothing = true;
    failure.detail = !acquired.failure.empty() ? acquired.failure
                                               : "connecting to the upstream failed: " + acquired.ec.message();
    co_return nullptr;
  }
  if (auto* tls = acquired.conn->stream.tls(); tls != nullptr) {
    const unsigned char* alpn = nullptr;
    unsigned size = 0;
    SSL_get0_alpn_selected(tls->native_handle(), &alpn, &size);
    if (size != 2 || alpn[0] != 'h' || alpn[1] != '2') {
      failure.error = UpstreamError::unreachable;
      failure.sent_nothing = true;
      failure.detail = "the upstream " + cfg.upstream.text() + " did not agree to HTTP/2 (ALPN h2), which upstream_protocol = \"h2\" needs";
      co_return nullptr;
    }
  }
  auto c = std::make_shared<H2ClientConnection>(w_, std::move(acquired.conn), cfg.upstream.tls ? "https" : "http",
                                                cfg.upstream_timeout);
  if (!c->start()) {
    failure.error = UpstreamError::unreachable;
    failure.sent_nothing = true;
    failure.detail = "could not set up an HTTP/2 session (out of memory?)";
    co_return nullptr;
  }
  connections_.push_back(c);
  co_return c;
}

Task<H2Reply> H2Upstream::exchange(const http::Request& req, LoopConfig& config, Millis timeout, std::size_t max_body) {
  const auto deadline = asio::steady_timer::clock_type::now() + timeout;
  // A stream the upstream refused, or one beyond its GOAWAY, never ran: sent once more.
  for (int attempt = 0;; ++attempt) {
    H2Reply failure;
    std::shared_ptr<H2ClientConnection> c = co_await connection(config, failure);
    if (!c) co_return failure;
    auto held = std::make_shared<H2Call>(w_.io->get_executor());
    H2Call& call = *held;
    call.max_body = max_body;
    if (!c->submit(req, config.config().upstream.authority, held)) {
      if (attempt == 0) continue;
      failure.error = UpstreamError::unreachable;
      failure.sent_nothing = true;
      failure.detail = "the upstream's HTTP/2 connection took no new stream";
      co_return failure;
    }
    call.done.expires_at(deadline);
    while (!call.finished) {
      beast::error_code ec;
      co_await call.done.async_wait(with(ec));
      if (!ec && !call.finished) {  // the deadline
        c->cancel(call);
        call.finished = true;
        call.reply.ok = false;
        call.reply.error = UpstreamError::timeout;
        call.reply.detail = "the upstream did not answer within upstream_timeout";
        co_return std::move(call.reply);
      }
    }
    if (!call.reply.ok && call.reply.sent_nothing && attempt == 0) continue;
    co_return std::move(call.reply);
  }
}

}  // namespace idem::gateway
