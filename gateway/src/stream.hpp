#pragma once

// Internal to idem-gateway: a connection, to a client or to the upstream, that speaks plain TCP or
// TLS over the same timed socket (timed_stream.hpp). Beast and Asio read and write it as any
// stream; which of the two carries the bytes is one branch per operation, so the request path is
// the same code for both (and the plain one pays nothing else).

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/beast/ssl/ssl_stream.hpp>

#include <memory>
#include <optional>

#include "idem/gateway/tls.hpp"
#include "timed_stream.hpp"

namespace idem::gateway {

/// An Asio SSL context sharing a TlsContext's SSL_CTX (another reference to it): what Asio's
/// streams are made with. Null for a null `context`.
inline std::shared_ptr<boost::asio::ssl::context> asio_context(const std::shared_ptr<const TlsContext>& context) {
  if (!context) return nullptr;
  return std::make_shared<boost::asio::ssl::context>(context->new_reference());
}

/// A TimedStream, with TLS on top once use_tls() was called (before the first read or write).
/// Timeouts work as for the TimedStream: expires_after covers the TLS operations too.
class Stream {
 public:
  using executor_type = Executor;
  /// Beast's SSL stream coalesces a gather write (a response's head and body) into one TLS
  /// record instead of one per buffer.
  using Tls = boost::beast::ssl_stream<TimedStream&>;

  Stream(Deadlines& deadlines, Socket socket) : plain_(deadlines, std::move(socket)) {}
  Stream(Deadlines& deadlines, const Executor& ex) : plain_(deadlines, ex) {}
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  executor_type get_executor() noexcept { return plain_.get_executor(); }
  Socket& socket() noexcept { return plain_.socket(); }

  void expires_after(TimedStream::Clock::duration timeout) { plain_.expires_after(timeout); }
  void expires_never() { plain_.expires_never(); }
  void cancel() { plain_.cancel(); }
  void close() { plain_.close(); }

  /// From now on the bytes are TLS, with `context`, which the caller keeps alive as long as this
  /// stream; the handshake is the caller's (tls()->async_handshake).
  void use_tls(boost::asio::ssl::context& context) { tls_.emplace(plain_, context); }
  /// The TLS layer; null for a plain connection.
  Tls* tls() noexcept { return tls_ ? &*tls_ : nullptr; }

  // Both layers complete with void(error_code, size_t), so for any token both calls have the same
  // result type: the token goes straight to the layer that carries the bytes, with no
  // initiation of this stream's own in between.
  template <class MutableBuffers, class Token>
  auto async_read_some(const MutableBuffers& buffers, Token&& token) {
    if (tls_) return tls_->async_read_some(buffers, std::forward<Token>(token));
    return plain_.async_read_some(buffers, std::forward<Token>(token));
  }

  template <class ConstBuffers, class Token>
  auto async_write_some(const ConstBuffers& buffers, Token&& token) {
    if (tls_) return tls_->async_write_some(buffers, std::forward<Token>(token));
    return plain_.async_write_some(buffers, std::forward<Token>(token));
  }

  /// TCP: before use_tls.
  template <class Endpoints, class Token>
  auto async_connect(const Endpoints& endpoints, Token&& token) {
    return plain_.async_connect(endpoints, std::forward<Token>(token));
  }

 private:
  TimedStream plain_;
  std::optional<Tls> tls_;
};

}  // namespace idem::gateway
