// The keep-alive connections to the upstream, one pool per event loop (worker.hpp).
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

#include "idem/gateway/log.hpp"
#include "proxy.hpp"

namespace idem::gateway {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kCheckAfterIdle = std::chrono::milliseconds(20);

// Whether a pooled socket is still open: nothing to read yet (EAGAIN) means alive; EOF, an
// error, or unsolicited bytes (the upstream should send nothing between responses) mean not.
bool still_open(Socket& socket) {
  char byte;
  const ssize_t n = ::recv(socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

}  // namespace

Task<UpstreamPool::Acquired> UpstreamPool::acquire(bool fresh, UpstreamAddresses& upstream, const Config& config,
                                                   const std::shared_ptr<asio::ssl::context>& tls, bool h2) {
  Acquired out;
  if (!fresh) {
    const auto now = Clock::now();
    while (!idle_.empty()) {
      auto conn = std::move(idle_.back());
      idle_.pop_back();
      // A connection to the upstream of an earlier configuration is closed, never reused.
      if (conn->upstream_id != upstream.id()) continue;
      const auto idle = now - conn->idle_since;
      if (idle >= config.upstream_idle_timeout) continue;
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
  const auto endpoints = upstream.get();
  if (endpoints->empty()) {
    out.ec = asio::error::host_not_found;
    upstream.request_refresh();
    co_return out;
  }
  auto conn = std::make_unique<UpstreamConn>(deadlines_, io_.get_executor());
  conn->upstream_id = upstream.id();
  conn->stream.expires_after(config.upstream_connect_timeout);
  co_await conn->stream.async_connect(*endpoints, with(out.ec));
  if (out.ec) {
    upstream.request_refresh();  // the upstream may have moved
    co_return out;
  }
  beast::error_code ignored;
  conn->stream.socket().set_option(tcp::no_delay(true), ignored);
  metrics_.upstream_connects.fetch_add(1, std::memory_order_relaxed);
  if (tls) {
    conn->tls_context = tls;
    conn->stream.use_tls(*tls);
    if (!co_await handshake(*conn, upstream, config, out, h2)) co_return out;
  }
  out.conn = std::move(conn);
  co_return out;
}

Task<bool> UpstreamPool::handshake(UpstreamConn& conn, UpstreamAddresses& upstream, const Config& config, Acquired& out,
                                   bool h2) {
  SSL* ssl = conn.stream.tls()->native_handle();
  if (!prepare_upstream_connection(ssl, *config.upstream_tls_context, &conn.tls_failure)) {
    out.ec = asio::error::invalid_argument;
    out.failure = "TLS to the upstream " + config.upstream.text() + ": " + conn.tls_failure;
    co_return false;
  }
  static constexpr unsigned char kAlpnH2[] = {2, 'h', '2'};
  if (h2) SSL_set_alpn_protos(ssl, kAlpnH2, sizeof kAlpnH2);
  SSL_CTX* context = conn.tls_context->native_handle();
  if (session_ && session_upstream_ == upstream.id() && session_context_ == context) SSL_set_session(ssl, session_.get());
  co_await conn.stream.tls()->async_handshake(asio::ssl::stream_base::client, with(out.ec));
  if (!out.ec) {
    if (SSL_session_reused(ssl) == 1) metrics_.upstream_tls_resumed.fetch_add(1, std::memory_order_relaxed);
    co_return true;
  }
  metrics_.upstream_tls_failures.fetch_add(1, std::memory_order_relaxed);
  // The certificate's refusal when the callback saw one; else the handshake's own error.
  out.failure = "TLS handshake with the upstream " + config.upstream.text() + " failed: " +
                (conn.tls_failure.empty() ? out.ec.message() : "its " + conn.tls_failure);
  // Every request would log the same line: a new reason at once, the same one again after 10 s,
  // with how many were not logged.
  const auto now = Clock::now();
  if (out.failure != last_tls_warning_text_ || now - last_tls_warning_ >= std::chrono::seconds(10)) {
    std::string line = out.failure;
    if (tls_warnings_skipped_ > 0) line += " (and " + std::to_string(tls_warnings_skipped_) + " more since the last line)";
    log::write(LogLevel::warn, line);
    last_tls_warning_ = now;
    last_tls_warning_text_ = out.failure;
    tls_warnings_skipped_ = 0;
  } else {
    ++tls_warnings_skipped_;
  }
  co_return false;
}

bool UpstreamPool::keep_session(UpstreamConn& conn) {
  SSL_SESSION* session = SSL_get1_session(conn.stream.tls()->native_handle());
  if (session == nullptr) return false;
  // A TLS 1.3 session resumes only with a ticket (they arrive after the handshake, before the
  // response at the latest); TLS 1.3 clients also send a session id, which resumes nothing.
  const bool resumable = SSL_SESSION_is_resumable(session) == 1 &&
                         (SSL_SESSION_get_protocol_version(session) < TLS1_3_VERSION || SSL_SESSION_has_ticket(session) == 1);
  if (!resumable) {
    SSL_SESSION_free(session);
    return false;
  }
  // A copy: OpenSSL marks a connection's own session not resumable when the connection is freed
  // without a TLS shutdown (every pooled connection that is closed, or dropped by the upstream).
  session_.reset(SSL_SESSION_dup(session));
  SSL_SESSION_free(session);
  session_upstream_ = conn.upstream_id;
  session_context_ = conn.tls_context->native_handle();
  return true;
}

void UpstreamPool::release(std::unique_ptr<UpstreamConn> conn, const Config& config) {
  // A connection's session (its TLS 1.3 ticket arrived with the response at the latest) is the
  // one the next new connection resumes: kept once per connection, not copied on every response.
  if (conn->stream.tls() != nullptr && !conn->session_kept) conn->session_kept = keep_session(*conn);
  if (idle_.size() >= config.upstream_max_idle || config.upstream_idle_timeout.count() == 0) return;
  if (conn->buffer.size() != 0) return;  // bytes after the response: the connection is confused
  conn->stream.expires_never();
  conn->idle_since = Clock::now();
  idle_.push_back(std::move(conn));
}

void UpstreamPool::sweep(const Config& config) {
  const auto now = Clock::now();
  // Oldest first: they sit at the front.
  auto keep = std::find_if(idle_.begin(), idle_.end(), [&](const auto& c) {
    return now - c->idle_since < config.upstream_idle_timeout;
  });
  idle_.erase(idle_.begin(), keep);
}

}  // namespace idem::gateway
