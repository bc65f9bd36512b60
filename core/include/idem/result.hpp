#pragma once

#include <condition_variable>
#include <cstdint>
#include <expected>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

namespace idem {

/// Why a store call failed. Expected outcomes (mismatch, in progress, ...) are not errors.
enum class StoreErrc : std::uint8_t {
  unavailable,  ///< cannot reach the store (down, connection refused, lock held by another process too long)
  timeout,      ///< the store did not answer in time; a write may or may not have happened
  corrupt,      ///< the store answered with data this version cannot read
  internal,     ///< a bug or an unexpected answer
  /// A stored response is encrypted and the configured keys cannot open it (its key is missing,
  /// its bytes were altered, or it was copied from another record): EncryptedStore. Not
  /// retryable, and nothing was changed; the record must be neither replayed nor executed again.
  undecryptable,
};

/// "unavailable", "timeout", ...
std::string_view to_string(StoreErrc code);

/// A failed store call: what happened, and what the caller may do about it.
struct StoreError {
  StoreErrc code = StoreErrc::internal;
  std::string message;
  /// True when a write may have been applied even though the call failed (e.g. COMMIT lost).
  bool in_doubt = false;

  /// Whether the same call may succeed if tried again later.
  bool retryable() const { return code == StoreErrc::unavailable || code == StoreErrc::timeout; }
};

/// A store call's value or its error.
template <class T>
using StoreResult = std::expected<T, StoreError>;

/// std::expected has no void-like "ok" we can name in callbacks; this is it.
struct Done {};

/// How asynchronous calls report completion. May run on any thread, possibly before the call
/// that scheduled it returns; it must not block.
template <class T>
using Callback = std::move_only_function<void(StoreResult<T>)>;

/// Starts an asynchronous call that reports through a Callback<T> — `start(callback)` — and waits
/// for its result. Blocks the calling thread: never use it on an event-loop thread, nor inside a
/// store callback (a store answering on its own thread would wait for itself).
///
/// A mutex and a condition variable on the stack rather than a std::promise: no shared state on
/// the heap and no std::call_once per call (5 % of an in-process consumer's CPU samples were in
/// the latter alone), and nothing to wait for when the store answers inline (the memory store).
template <class T, class Start>
StoreResult<T> wait_for(Start&& start) {
  struct Slot {
    std::mutex mutex;
    std::condition_variable answered;
    std::optional<StoreResult<T>> result;
  } slot;
  std::forward<Start>(start)([&slot](StoreResult<T> result) {
    // Notified under the lock, so the waiter cannot return and end `slot` before this callback
    // lets go of the mutex; it touches nothing of `slot` after that.
    const std::lock_guard lock(slot.mutex);
    slot.result.emplace(std::move(result));
    slot.answered.notify_one();
  });
  std::unique_lock lock(slot.mutex);
  slot.answered.wait(lock, [&slot] { return slot.result.has_value(); });
  return std::move(*slot.result);
}

}  // namespace idem
