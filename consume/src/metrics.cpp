#include "metrics.hpp"

#include "idem/admin_server.hpp"

namespace idem::consume {

std::string render_metrics(const ConsumeStats& s, const MetricsExtras& extras) {
  using admin::append_family;
  using admin::append_sample;
  std::string out;
  auto counter = [&](const char* name, const char* help, std::uint64_t value) {
    append_family(out, name, "counter", help);
    append_sample(out, name, "", static_cast<double>(value));
  };
  counter("idem_consume_received_total", "Deliveries received from the broker.", s.received);
  counter("idem_consume_processed_total", "Messages the handler processed (acked).", s.processed);
  counter("idem_consume_duplicates_total", "Deliveries of messages processed before (acked, handler not called).",
          s.duplicates);
  counter("idem_consume_retried_total", "Tries scheduled again (handler failed, store down, message held elsewhere).",
          s.retried);
  append_family(out, "idem_consume_dead_lettered_total", "counter", "Messages moved to the dead-letter queue, by reason.");
  const auto reasons = s.dead_letters_by_reason();
  for (const char* reason : {"missing_id", "invalid_id", "too_large", "poison", "rejected", "conflict", "outcome_unknown"}) {
    const auto it = reasons.find(reason);
    append_sample(out, "idem_consume_dead_lettered_total", std::string("reason=") + admin::label_value(reason),
                  static_cast<double>(it == reasons.end() ? 0 : it->second));
  }
  counter("idem_consume_stale_total", "Deliveries of a lost broker connection, left for the broker to redeliver.",
          s.stale);
  counter("idem_consume_broker_errors_total", "Broker calls that failed (receive, ack, dead-letter).", s.broker_errors);
  counter("idem_consume_reconnects_total", "Broker connections replaced.", extras.reconnects);
  append_family(out, "idem_consume_in_flight", "gauge", "Deliveries held: received, not yet acked or dead-lettered.");
  append_sample(out, "idem_consume_in_flight", "", static_cast<double>(s.in_flight.load()));
  append_family(out, "idem_consume_waiting_for_key", "gauge",
                "Deliveries held that wait for an earlier delivery of their ordering key (ordering = key).");
  append_sample(out, "idem_consume_waiting_for_key", "", static_cast<double>(s.waiting_for_key.load()));
  append_family(out, "idem_consume_ready", "gauge", "1 while the broker answers.");
  append_sample(out, "idem_consume_ready", "", extras.ready ? 1 : 0);

  const auto latency = s.latency.snapshot();
  admin::append_histogram(out, "idem_consume_handler_seconds", "Time of one try: claim, POST to the handler, record.",
                          LatencyHistogram::kBounds, latency.buckets, latency.sum_seconds, latency.count);

  counter("idem_log_lines_dropped_total", "Log lines dropped because stderr was not being read.",
          extras.log_lines_dropped);
  return out;
}

}  // namespace idem::consume
