#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace idem {

/// A lock-free histogram of durations with fixed bounds (1 ms to 10 s), for /metrics.
class LatencyHistogram {
 public:
  /// Upper bounds of the buckets, in seconds; one more bucket holds what is above the last.
  static constexpr std::array<double, 12> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                     0.1,   0.25,   0.5,   1.0,  2.5,   10.0};

  void observe(std::chrono::nanoseconds took) {
    const double seconds = std::chrono::duration<double>(took).count();
    std::size_t i = 0;
    while (i < kBounds.size() && seconds > kBounds[i]) ++i;
    buckets_[i].fetch_add(1, std::memory_order_relaxed);
    sum_ns_.fetch_add(took.count() > 0 ? static_cast<std::uint64_t>(took.count()) : 0, std::memory_order_relaxed);
    count_.fetch_add(1, std::memory_order_relaxed);
  }

  /// A copy of the counts: bucket i holds what took at most kBounds[i] (not cumulative); the
  /// last bucket holds the rest.
  struct Snapshot {
    std::array<std::uint64_t, kBounds.size() + 1> buckets{};
    double sum_seconds = 0;
    std::uint64_t count = 0;
  };
  Snapshot snapshot() const {
    Snapshot s;
    for (std::size_t i = 0; i < buckets_.size(); ++i) s.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
    s.sum_seconds = static_cast<double>(sum_ns_.load(std::memory_order_relaxed)) / 1e9;
    s.count = count_.load(std::memory_order_relaxed);
    return s;
  }

 private:
  std::array<std::atomic<std::uint64_t>, kBounds.size() + 1> buckets_{};
  std::atomic<std::uint64_t> sum_ns_{0};
  std::atomic<std::uint64_t> count_{0};
};

}  // namespace idem
