#pragma once

// idem-relay's loop: claim due outbox rows in enqueue order, publish them to the sink, and
// record how each went. At least once by design: a relay killed between a publish and its
// settle publishes the rows again; consumers dedupe by message id.
//
// Order: rows of one ordering key leave one at a time, in commit order, each after the previous
// one's publish was confirmed, on any number of relays: the outbox's claim gives a relay a row
// only when every earlier row of its key is sent (OutboxReader::claim). A dead row holds its
// key's later rows unless its destination lets them pass. Rows without a key: with one relay
// they leave in enqueue order. When a publish fails, that row and every later row of the batch
// wait together (the relay pauses before it claims again), so a later row never overtakes an
// earlier one that failed; only a row that is dead is skipped.

#include <atomic>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "idem/broker.hpp"
#include "idem/latency_histogram.hpp"
#include "idem/outbox.hpp"

namespace idem::relay {

/// How the loop runs (from Config).
struct RelayOptions {
  std::size_t batch = 100;
  Millis poll_interval{200};
  std::uint32_t max_attempts = 20;
  Millis retry_min{500};
  Millis retry_max{60'000};
  Millis lease{60'000};
  Millis retention = std::chrono::days(7);
  std::string owner;
  /// Destinations whose dead rows let the later rows of their ordering key go on; "*": every
  /// destination (OutboxClaim::dead_rows_pass). Elsewhere a dead row holds its key.
  std::vector<std::string> dead_rows_pass;
  /// The wait a webhook's Retry-After asked for, if the sink has one to give (else null).
  std::function<std::optional<Millis>()> retry_after;
  /// Told about each row that is dead, each failed publish and each outbox error. Optional.
  std::function<void(std::string_view line)> on_warning;
  /// Told about each batch published (rows, milliseconds). Optional.
  std::function<void(std::string_view line)> on_info;
};

/// The loop's counters, for /metrics.
struct RelayStats {
  std::atomic<std::uint64_t> published{0};  ///< rows the sink confirmed
  std::atomic<std::uint64_t> retried{0};    ///< rows that will be published again
  std::atomic<std::uint64_t> dead{0};       ///< rows given up on
  std::atomic<std::uint64_t> outbox_errors{0};
  std::atomic<bool> ready{false};           ///< the last claim reached the outbox, the last publish the sink
  std::atomic<std::uint64_t> pending{0};    ///< pending rows, as last counted (every few seconds)
  std::atomic<std::uint64_t> dead_rows{0};  ///< dead rows in the outbox, as last counted
  std::atomic<std::int64_t> oldest_pending_ms{-1};  ///< created of the oldest pending row (epoch ms); -1: none
  std::atomic<std::uint64_t> held_keys{0};  ///< ordering keys whose next row is dead, as last counted
  std::atomic<std::int64_t> oldest_held_ms{-1};  ///< created of the oldest row so held (epoch ms); -1: none
  LatencyHistogram publish_latency;          ///< one publish call (a batch, confirms included)
};

/// Relays one outbox to one sink until stopped.
class RelayLoop {
 public:
  RelayLoop(OutboxReader& outbox, MessageSink& sink, RelayOptions options);

  /// Claims, publishes and settles until stop(); returns after the batch in hand is settled.
  void run();
  /// Any thread.
  void stop();

  const RelayStats& stats() const { return stats_; }

 private:
  // Waits up to `d`, or until stop(); false when stopping.
  bool pause(Millis d);
  Millis backoff(std::uint32_t attempts);
  void purge_if_due(TimePoint now);
  void count_if_due();
  // One claim-publish-settle round; how long to wait before the next.
  Millis round();

  OutboxReader& outbox_;
  MessageSink& sink_;
  RelayOptions options_;
  RelayStats stats_;
  std::atomic<bool> stopping_{false};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::uint32_t outbox_failures_ = 0;
  std::chrono::steady_clock::time_point last_purge_{};
  std::chrono::steady_clock::time_point last_count_{};
  bool outbox_trouble_told_ = false;
};

}  // namespace idem::relay
