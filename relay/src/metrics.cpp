#include "metrics.hpp"

#include "idem/admin_server.hpp"

namespace idem::relay {

std::string render_metrics(const RelayStats& s, std::uint64_t log_lines_dropped, TimePoint now) {
  using admin::append_family;
  using admin::append_sample;
  std::string out;
  auto one = [&](const char* name, const char* type, const char* help, double value) {
    append_family(out, name, type, help);
    append_sample(out, name, "", value);
  };
  one("idem_relay_published_total", "counter", "Outbox rows the sink confirmed.", static_cast<double>(s.published));
  one("idem_relay_retried_total", "counter", "Outbox rows that will be published again.", static_cast<double>(s.retried));
  one("idem_relay_dead_total", "counter", "Outbox rows given up on (refused by the sink, or failed max_attempts times).",
      static_cast<double>(s.dead));
  one("idem_relay_outbox_errors_total", "counter", "Outbox reads and writes that failed.",
      static_cast<double>(s.outbox_errors));
  one("idem_relay_pending", "gauge", "Pending outbox rows (counted every few seconds).", static_cast<double>(s.pending));
  one("idem_relay_dead_rows", "gauge", "Dead outbox rows waiting for an operator (idemctl outbox).",
      static_cast<double>(s.dead_rows));
  const std::int64_t oldest = s.oldest_pending_ms.load();
  one("idem_relay_oldest_pending_age_seconds", "gauge", "Age of the oldest pending outbox row; 0 when none.",
      oldest < 0 ? 0.0 : std::max(0.0, static_cast<double>(to_epoch_ms(now) - oldest) / 1000.0));
  one("idem_relay_held_keys", "gauge",
      "Ordering keys whose next row is dead: their later rows wait for an operator (idemctl outbox retry or drop).",
      static_cast<double>(s.held_keys));
  const std::int64_t held = s.oldest_held_ms.load();
  one("idem_relay_oldest_held_age_seconds", "gauge", "Age of the oldest row held back behind a dead row; 0 when none.",
      held < 0 ? 0.0 : std::max(0.0, static_cast<double>(to_epoch_ms(now) - held) / 1000.0));
  one("idem_relay_ready", "gauge", "1 while the outbox and the sink answer.", s.ready ? 1 : 0);

  const auto latency = s.publish_latency.snapshot();
  admin::append_histogram(out, "idem_relay_publish_seconds", "Time of one publish call (a batch, confirms included).",
                          LatencyHistogram::kBounds, latency.buckets, latency.sum_seconds, latency.count);
  one("idem_log_lines_dropped_total", "counter", "Log lines dropped because stderr was not being read.",
      static_cast<double>(log_lines_dropped));
  return out;
}

}  // namespace idem::relay
