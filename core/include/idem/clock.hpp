#pragma once

#include <chrono>
#include <cstdint>

namespace idem {

/// Durations as records store them.
using Millis = std::chrono::milliseconds;

/// Wall-clock instants, millisecond precision; records store them as Unix epoch milliseconds.
using TimePoint = std::chrono::time_point<std::chrono::system_clock, Millis>;

/// Milliseconds since the Unix epoch, the form every store persists.
constexpr std::int64_t to_epoch_ms(TimePoint t) { return t.time_since_epoch().count(); }

/// Inverse of to_epoch_ms.
constexpr TimePoint from_epoch_ms(std::int64_t ms) { return TimePoint{Millis{ms}}; }

/// Where the engine and stores get "now"; injectable so tests move time without sleeping.
class Clock {
 public:
  virtual ~Clock() = default;
  /// The current wall-clock time.
  virtual TimePoint now() const = 0;
};

/// The real clock (std::chrono::system_clock).
class SystemClock final : public Clock {
 public:
  TimePoint now() const override;
  /// A process-wide instance, for callers with no clock of their own.
  static SystemClock& instance();
};

}  // namespace idem
