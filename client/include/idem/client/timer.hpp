#pragma once

#include <chrono>

#include "idem/clock.hpp"

namespace idem::client {

/// Monotonic instants: deadlines and the retry budget are measured on these.
using SteadyTime = std::chrono::steady_clock::time_point;

/// Time as the retry loop sees it. Injectable, so tests move time instead of sleeping.
class Timer {
 public:
  virtual ~Timer() = default;
  /// Monotonic now, for deadlines and budget refill (immune to wall-clock jumps).
  virtual SteadyTime now() const = 0;
  /// Wall-clock now, for HTTP-date `Retry-After` values and journal timestamps.
  virtual TimePoint wall_now() const = 0;
  /// Waits `d` (a backoff or a `Retry-After`).
  virtual void sleep_for(Millis d) = 0;
};

/// The real clocks and std::this_thread::sleep_for.
class SystemTimer final : public Timer {
 public:
  SteadyTime now() const override;
  TimePoint wall_now() const override;
  void sleep_for(Millis d) override;
};

}  // namespace idem::client
