#pragma once

#include <cstdint>
#include <string>

#include "idem/consume_loop.hpp"

namespace idem::consume {

/// What /metrics shows besides the loop's counters.
struct MetricsExtras {
  bool ready = false;
  std::uint64_t reconnects = 0;
  std::uint64_t log_lines_dropped = 0;
};

/// The Prometheus text of a consumer's counters (docs/idem-consume.md lists every metric).
std::string render_metrics(const ConsumeStats& stats, const MetricsExtras& extras);

}  // namespace idem::consume
