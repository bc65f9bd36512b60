#pragma once

#include <cstdint>
#include <string>

#include "relay_loop.hpp"

namespace idem::relay {

/// The Prometheus text of a relay's counters (docs/outbox.md lists every metric).
std::string render_metrics(const RelayStats& stats, std::uint64_t log_lines_dropped, TimePoint now);

}  // namespace idem::relay
