#pragma once

// Internal to idem-gateway: store calls that an event loop gives up on after store_timeout.
//
// Every store bounds its own calls (SQLite's busy_timeout, the Redis and PostgreSQL stores'
// command and statement timeouts). But a store thread stuck in the kernel (an fsync on a dying
// disk, a hung network filesystem) or a store bug would leave its requests waiting forever, each
// holding a client connection, and a drain waiting for them. Here the request instead completes
// with a stand-in answer (503 for a claim; "outcome not recorded" for a completion) once
// store_timeout has passed. Should the store answer later, its answer goes to `on_late`, on the
// event loop's thread: the gateway releases a key that was claimed too late to be used.
//
// Like TimedStream, the pending calls of one event loop sit in an intrusive list that the loop
// sweeps every tick (Gateway::Impl::watch_deadlines), so a call costs no timer of its own. The
// store's callback may run on any thread; it posts the answer to the loop, where the answer and
// the sweep meet, so the decision "answered or timed out" is taken on one thread only.

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/post.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstddef>
#include <memory>
#include <optional>

#include "idem/http/async.hpp"

namespace idem::gateway {

class StoreDeadlines;

/// One store call in flight on an event loop: linked into the loop's StoreDeadlines until it
/// is answered or expires. Touched only on that loop's thread.
class PendingStoreCall {
 public:
  using Clock = std::chrono::steady_clock;

  PendingStoreCall(const PendingStoreCall&) = delete;
  PendingStoreCall& operator=(const PendingStoreCall&) = delete;

 protected:
  explicit PendingStoreCall(Clock::time_point deadline) : deadline_(deadline) {}
  virtual ~PendingStoreCall() = default;

  // The list keeps the call alive while it is linked (`self`): a store that drops its callback
  // unanswered still leaves the call to expire.
  void link(StoreDeadlines& list, std::shared_ptr<PendingStoreCall> self);
  // Returns the list's reference, so that the caller decides when the call may be destroyed.
  std::shared_ptr<PendingStoreCall> unlink();
  // Past the deadline: complete the request with the stand-in answer.
  virtual void expire() = 0;
  // The event loop is going away: destroy the waiting request uncompleted.
  virtual void abandon() = 0;

 private:
  friend class StoreDeadlines;
  StoreDeadlines* list_ = nullptr;
  PendingStoreCall* prev_ = nullptr;
  PendingStoreCall* next_ = nullptr;
  std::shared_ptr<PendingStoreCall> self_;
  Clock::time_point deadline_;
};

/// The pending store calls of one event loop. Touched only on that loop's thread.
class StoreDeadlines {
 public:
  using Clock = PendingStoreCall::Clock;

  /// `expired` counts the calls given up (a metric).
  explicit StoreDeadlines(std::atomic<std::uint64_t>& expired) : expired_(expired) {}
  StoreDeadlines(const StoreDeadlines&) = delete;
  StoreDeadlines& operator=(const StoreDeadlines&) = delete;
  ~StoreDeadlines() { abandon_all(); }

  /// Destroys every waiting request (its coroutine) uncompleted; a later answer goes to
  /// on_late. For a worker's destruction: call it while the io_context still exists.
  void abandon_all() {
    while (head_ != nullptr) {
      PendingStoreCall* call = head_;
      const auto keep = call->unlink();
      call->abandon();
    }
  }

  /// Completes every call past its deadline with its stand-in answer (posted, not run here).
  void sweep(Clock::time_point now) {
    for (PendingStoreCall* call = head_; call != nullptr;) {
      PendingStoreCall* next = call->next_;  // expire() unlinks `call`
      if (call->deadline_ <= now) {
        expired_.fetch_add(1, std::memory_order_relaxed);
        call->expire();
      }
      call = next;
    }
  }

  /// Calls waiting for their store's answer.
  std::size_t size() const { return size_; }

 private:
  friend class PendingStoreCall;
  std::atomic<std::uint64_t>& expired_;
  PendingStoreCall* head_ = nullptr;
  std::size_t size_ = 0;
};

inline void PendingStoreCall::link(StoreDeadlines& list, std::shared_ptr<PendingStoreCall> self) {
  list_ = &list;
  self_ = std::move(self);
  next_ = list.head_;
  if (next_ != nullptr) next_->prev_ = this;
  list.head_ = this;
  ++list.size_;
}

inline std::shared_ptr<PendingStoreCall> PendingStoreCall::unlink() {
  if (list_ == nullptr) return nullptr;
  if (prev_ != nullptr) prev_->next_ = next_;
  if (next_ != nullptr) next_->prev_ = prev_;
  if (list_->head_ == this) list_->head_ = next_;
  --list_->size_;
  list_ = nullptr;
  prev_ = next_ = nullptr;
  return std::move(self_);
}

namespace detail {

template <class T, class Handler, class TimedOut, class OnLate>
class DeadlinedStoreCall final : public PendingStoreCall {
 public:
  DeadlinedStoreCall(Clock::time_point deadline, Handler handler, TimedOut timed_out, OnLate on_late)
      : PendingStoreCall(deadline),
        handler_(std::move(handler)),
        timed_out_(std::move(timed_out)),
        on_late_(std::move(on_late)) {}

  static void start_linked(StoreDeadlines& list, const std::shared_ptr<DeadlinedStoreCall>& call) {
    call->link(list, call);
  }

  // The store's answer, on the loop's thread.
  void answer(T value) {
    if (!handler_) {  // timed out already
      on_late_(std::move(value));
      return;
    }
    const auto keep = unlink();
    complete(std::move(value));
  }

 private:
  void expire() override {
    const auto keep = unlink();
    // Posted rather than run: the sweep is still walking the list.
    auto ex = boost::asio::get_associated_executor(*handler_);
    boost::asio::post(ex, [handler = std::move(*handler_), value = T(timed_out_())]() mutable {
      std::move(handler)(std::move(value));
    });
    handler_.reset();
  }

  void abandon() override { handler_.reset(); }

  void complete(T value) {
    auto handler = std::move(*handler_);
    handler_.reset();
    std::move(handler)(std::move(value));
  }

  std::optional<Handler> handler_;  // empty once completed either way
  TimedOut timed_out_;              // makes the stand-in answer, only when it is needed
  OnLate on_late_;
};

}  // namespace detail

/// Starts `start(callback)` and completes `token` with the value the callback receives, on the
/// handler's associated executor, or with `timed_out()` if no value has come after `timeout`
/// (at most one sweep tick late). A value that comes after that is passed to `on_late(T)` on
/// the same executor. `list` must be the StoreDeadlines of the loop whose executor the handler
/// has, and the call must be started on that loop's thread. A `timeout` of zero sets no deadline
/// (for a store that answers within the call): no allocation, no list entry.
template <class T, class Token, class TimedOut, class OnLate, class Start>
auto async_store_call(StoreDeadlines& list, PendingStoreCall::Clock::duration timeout, TimedOut timed_out,
                      OnLate on_late, Start start, Token&& token) {
  namespace asio = boost::asio;
  return asio::async_initiate<Token, void(T)>(
      [&list, timeout](auto handler, TimedOut timed_out, OnLate on_late, Start start) {
        using Call = detail::DeadlinedStoreCall<T, decltype(handler), TimedOut, OnLate>;
        const auto ex = asio::get_associated_executor(handler);
        if (timeout <= PendingStoreCall::Clock::duration::zero()) {
          std::move(start)(http::detail::posting_callback<T>(ex, std::move(handler)));
          return;
        }
        auto call = std::make_shared<Call>(PendingStoreCall::Clock::now() + timeout, std::move(handler),
                                           std::move(timed_out), std::move(on_late));
        Call::start_linked(list, call);
        // The answer meets the sweep on the loop's thread.
        std::move(start)(http::detail::posting_callback<T>(
            ex, [call = std::move(call)](T value) mutable { call->answer(std::move(value)); }));
      },
      token, std::move(timed_out), std::move(on_late), std::move(start));
}

}  // namespace idem::gateway
