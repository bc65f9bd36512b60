#pragma once

#include <atomic>

#include "idem/clock.hpp"

namespace idem::testing {

/// A clock that moves only when told, so tests exercise expiry without sleeping.
class ManualClock final : public Clock {
 public:
  /// Starts at a fixed, realistic instant (2026-01-01T00:00:00Z) unless told otherwise.
  explicit ManualClock(TimePoint start = from_epoch_ms(1'767'225'600'000)) : ms_(to_epoch_ms(start)) {}
  TimePoint now() const override { return from_epoch_ms(ms_.load()); }
  /// Moves time forward by `d`.
  void advance(Millis d) { ms_ += d.count(); }

 private:
  std::atomic<std::int64_t> ms_;
};

}  // namespace idem::testing
