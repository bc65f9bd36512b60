// The keep-alive connections to the upstream, one pool per event loop (worker.hpp).
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>

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

Task<UpstreamPool::Acquired> UpstreamPool::acquire(bool fresh, UpstreamAddresses& upstream, const Config& config) {
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
  out.conn = std::move(conn);
  co_return out;
}

void UpstreamPool::release(std::unique_ptr<UpstreamConn> conn, const Config& config) {
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
