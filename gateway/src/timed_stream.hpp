#pragma once

// Internal to idem-gateway: a TCP stream whose reads, writes and connects time out, with one
// timer per event loop instead of one per operation.
//
// beast::tcp_stream arms a timer for every operation and cancels it when the operation
// completes: a timer-queue insertion, a cancellation and an extra handler per read or write,
// several times per proxied request. Here an operation only notes that it is pending; the event
// loop's Deadlines::sweep, run every few milliseconds to a quarter second (deadline_tick), closes
// the streams whose pending operation is past its deadline. The operation then completes with
// beast::error::timeout, as with beast::tcp_stream, at most one tick late.

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <boost/asio/associated_allocator.hpp>
#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/error.hpp>

#include <chrono>

namespace idem::gateway {

using Executor = boost::asio::io_context::executor_type;
using Socket = boost::asio::basic_stream_socket<boost::asio::ip::tcp, Executor>;

class TimedStream;

/// The timed streams of one event loop. Touched only on that loop's thread.
class Deadlines {
 public:
  using Clock = std::chrono::steady_clock;

  Deadlines() = default;
  Deadlines(const Deadlines&) = delete;
  Deadlines& operator=(const Deadlines&) = delete;

  /// Closes every stream whose pending operation is past its deadline.
  void sweep(Clock::time_point now);

 private:
  friend class TimedStream;
  TimedStream* head_ = nullptr;  // intrusive list of live streams
};

/// A TCP socket for Beast's and Asio's composed operations (AsyncReadStream, AsyncWriteStream),
/// with beast::tcp_stream's deadline calls: expires_after covers every operation started until
/// the next expires_after or expires_never. After a timeout the socket is closed.
///
/// A completion refers back to its stream, so a stream must outlive its pending operations
/// (true of a coroutine that awaits them; a destroyed io_context destroys them uninvoked).
class TimedStream {
 public:
  using Clock = Deadlines::Clock;
  using executor_type = Executor;

  TimedStream(Deadlines& deadlines, Socket socket) : deadlines_(deadlines), socket_(std::move(socket)) { link(); }
  TimedStream(Deadlines& deadlines, const Executor& ex) : deadlines_(deadlines), socket_(ex) { link(); }
  ~TimedStream() { unlink(); }
  TimedStream(const TimedStream&) = delete;
  TimedStream& operator=(const TimedStream&) = delete;

  executor_type get_executor() noexcept { return socket_.get_executor(); }
  Socket& socket() noexcept { return socket_; }
  // For a TLS stream on top (Asio's ssl::stream asks its next layer for these).
  using lowest_layer_type = Socket;
  lowest_layer_type& lowest_layer() noexcept { return socket_; }

  void expires_after(Clock::duration timeout) { deadline_ = Clock::now() + timeout; }
  void expires_never() { deadline_ = Clock::time_point::max(); }

  /// Cancels pending operations (they complete with operation_aborted); the socket stays open.
  void cancel() {
    boost::beast::error_code ignored;
    socket_.cancel(ignored);
  }
  void close() {
    boost::beast::error_code ignored;
    socket_.close(ignored);
  }

  template <class MutableBuffers, class Token>
  auto async_read_some(const MutableBuffers& buffers, Token&& token) {
    return boost::asio::async_initiate<Token, void(boost::beast::error_code, std::size_t)>(
        [this](auto handler, const MutableBuffers& b) {
          socket_.async_read_some(b, begin(std::move(handler)));
        },
        token, buffers);
  }

  template <class ConstBuffers, class Token>
  auto async_write_some(const ConstBuffers& buffers, Token&& token) {
    return boost::asio::async_initiate<Token, void(boost::beast::error_code, std::size_t)>(
        [this](auto handler, const ConstBuffers& b) {
          socket_.async_write_some(b, begin(std::move(handler)));
        },
        token, buffers);
  }

  /// Connects to the first endpoint that accepts, in order, all within the current deadline.
  template <class Endpoints, class Token>
  auto async_connect(const Endpoints& endpoints, Token&& token) {
    using Endpoint = typename Endpoints::value_type;
    return boost::asio::async_initiate<Token, void(boost::beast::error_code, Endpoint)>(
        [this](auto handler, const Endpoints& e) {
          boost::asio::async_connect(socket_, e, begin(std::move(handler)));
        },
        token, endpoints);
  }

 private:
  friend class Deadlines;

  // Wraps a handler: on completion, the operation is no longer pending, and an error after the
  // deadline closed the socket reads as beast::error::timeout. Keeps the handler's executor and
  // allocator.
  template <class Handler>
  struct Completion {
    TimedStream* stream;
    Handler handler;

    using executor_type = boost::asio::associated_executor_t<Handler, Executor>;
    executor_type get_executor() const noexcept {
      return boost::asio::get_associated_executor(handler, stream->socket_.get_executor());
    }
    using allocator_type = boost::asio::associated_allocator_t<Handler>;
    allocator_type get_allocator() const noexcept { return boost::asio::get_associated_allocator(handler); }

    template <class... Args>
    void operator()(boost::beast::error_code ec, Args&&... args) {
      --stream->pending_;
      if (ec && stream->timed_out_) ec = boost::beast::error::timeout;
      std::move(handler)(ec, std::forward<Args>(args)...);
    }
  };

  template <class Handler>
  Completion<Handler> begin(Handler&& handler) {
    ++pending_;
    return Completion<Handler>{this, std::forward<Handler>(handler)};
  }

  void link() {
    next_ = deadlines_.head_;
    if (next_) next_->prev_ = this;
    deadlines_.head_ = this;
  }
  void unlink() {
    if (prev_) prev_->next_ = next_;
    if (next_) next_->prev_ = prev_;
    if (deadlines_.head_ == this) deadlines_.head_ = next_;
  }

  Deadlines& deadlines_;
  Socket socket_;
  Clock::time_point deadline_ = Clock::time_point::max();
  unsigned pending_ = 0;    // operations started and not completed
  bool timed_out_ = false;  // the deadline closed the socket
  TimedStream* prev_ = nullptr;
  TimedStream* next_ = nullptr;
};

inline void Deadlines::sweep(Clock::time_point now) {
  for (TimedStream* s = head_; s != nullptr; s = s->next_) {
    if (s->pending_ > 0 && s->deadline_ <= now && !s->timed_out_) {
      s->timed_out_ = true;
      s->close();
    }
  }
}

}  // namespace idem::gateway
