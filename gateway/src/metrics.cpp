#include "idem/gateway/metrics.hpp"

#include "idem/gateway/log.hpp"

#include <cstdio>

namespace idem::gateway {
namespace {

constexpr auto kRelaxed = std::memory_order_relaxed;

std::string_view to_string(StoreCall c) {
  switch (c) {
    case StoreCall::begin: return "begin";
    case StoreCall::finish: return "finish";
    case StoreCall::release: return "release";
    case StoreCall::ping: return "ping";
    case StoreCall::purge: return "purge";
    case StoreCall::count_: break;
  }
  return "?";
}

std::string_view to_string(FinishResult r) {
  switch (r) {
    case FinishResult::stored: return "stored";
    case FinishResult::released: return "released";
    case FinishResult::failed_retryable: return "failed_retryable";
    case FinishResult::fenced_out: return "fenced_out";
    case FinishResult::error: return "error";
    case FinishResult::left_in_progress: return "left_in_progress";
    case FinishResult::abandoned: return "abandoned";
    case FinishResult::count_: break;
  }
  return "?";
}

std::string_view to_string(UpstreamError e) {
  switch (e) {
    case UpstreamError::unreachable: return "unreachable";
    case UpstreamError::timeout: return "timeout";
    case UpstreamError::dropped: return "dropped";
    case UpstreamError::count_: break;
  }
  return "?";
}

}  // namespace

std::string_view to_string(LookupOutcome l) {
  switch (l) {
    case LookupOutcome::happened: return "happened";
    case LookupOutcome::not_found: return "not_found";
    case LookupOutcome::unknown: return "unknown";
    case LookupOutcome::malformed: return "malformed";
    case LookupOutcome::mismatch: return "mismatch";
    case LookupOutcome::failed: return "failed";
    case LookupOutcome::limited: return "limited";
    case LookupOutcome::count_: break;
  }
  return "?";
}

namespace {

std::string number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void header(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void sample(std::string& out, std::string_view name, std::string_view labels, std::string_view value) {
  out += name;
  if (!labels.empty()) {
    out += '{';
    out += labels;
    out += '}';
  }
  out += ' ';
  out += value;
  out += '\n';
}

struct HistogramSum {
  std::array<std::uint64_t, Histogram::kBounds.size() + 1> buckets{};
  std::uint64_t count = 0;
  std::uint64_t sum_ns = 0;
};

}  // namespace

std::string_view to_string(Outcome outcome) {
  switch (outcome) {
    case Outcome::executed: return "executed";
    case Outcome::replayed: return "replayed";
    case Outcome::in_use: return "in_use";
    case Outcome::mismatch: return "mismatch";
    case Outcome::missing: return "missing";
    case Outcome::invalid: return "invalid";
    case Outcome::store_unavailable: return "store_unavailable";
    case Outcome::outcome_unknown: return "outcome_unknown";
    case Outcome::passed_through: return "passed_through";
    case Outcome::too_large: return "too_large";
    case Outcome::bad_request: return "bad_request";
    case Outcome::unauthorized: return "unauthorized";
    case Outcome::record_unreadable: return "record_unreadable";
    case Outcome::webhook_refused: return "webhook_refused";
    case Outcome::count_: break;
  }
  return "?";
}

Outcome outcome_of(Verdict verdict) {
  switch (verdict) {
    case Verdict::pass_through: return Outcome::passed_through;
    case Verdict::execute: return Outcome::executed;
    case Verdict::replay: return Outcome::replayed;
    case Verdict::in_use: return Outcome::in_use;
    case Verdict::mismatch: return Outcome::mismatch;
    case Verdict::outcome_unknown: return Outcome::outcome_unknown;
    case Verdict::key_missing: return Outcome::missing;
    case Verdict::key_invalid: return Outcome::invalid;
    case Verdict::store_unavailable: return Outcome::store_unavailable;
    case Verdict::record_unreadable: return Outcome::record_unreadable;
    case Verdict::ask: return Outcome::executed;  // counted by what the lookup decided instead
  }
  return Outcome::passed_through;
}

void Histogram::observe(std::chrono::nanoseconds d) {
  const double seconds = std::chrono::duration<double>(d).count();
  std::size_t i = 0;
  while (i < kBounds.size() && seconds > kBounds[i]) ++i;
  buckets_[i].fetch_add(1, kRelaxed);
  count_.fetch_add(1, kRelaxed);
  sum_ns_.fetch_add(static_cast<std::uint64_t>(d.count() < 0 ? 0 : d.count()), kRelaxed);
}

Metrics::Metrics(std::size_t shards) {
  if (shards == 0) shards = 1;
  for (std::size_t i = 0; i < shards; ++i) shards_.push_back(std::make_unique<MetricsShard>());
}

std::string Metrics::render() const {
  std::string out;
  out.reserve(8192);
  auto sum = [&](auto field) {
    std::uint64_t total = 0;
    for (const auto& s : shards_) total += field(*s).load(kRelaxed);
    return total;
  };
  auto sum_signed = [&](auto field) {
    std::int64_t total = 0;
    for (const auto& s : shards_) total += field(*s).load(kRelaxed);
    return total;
  };
  auto histogram = [&](std::string_view name, std::string_view label, auto pick) {
    HistogramSum h;
    for (const auto& s : shards_) {
      const Histogram& one = pick(*s);
      for (std::size_t i = 0; i < h.buckets.size(); ++i) h.buckets[i] += one.buckets_[i].load(kRelaxed);
      h.count += one.count_.load(kRelaxed);
      h.sum_ns += one.sum_ns_.load(kRelaxed);
    }
    const std::string prefix = label.empty() ? std::string() : std::string(label) + ",";
    std::uint64_t cumulative = 0;
    for (std::size_t i = 0; i < h.buckets.size(); ++i) {
      cumulative += h.buckets[i];
      const std::string le = i < Histogram::kBounds.size() ? number(Histogram::kBounds[i]) : "+Inf";
      sample(out, std::string(name) + "_bucket", prefix + "le=\"" + le + "\"", std::to_string(cumulative));
    }
    sample(out, std::string(name) + "_sum", label, number(static_cast<double>(h.sum_ns) / 1e9));
    sample(out, std::string(name) + "_count", label, std::to_string(h.count));
  };

  header(out, "idem_requests_total", "counter", "Requests by what happened to them.");
  for (std::size_t i = 0; i < static_cast<std::size_t>(Outcome::count_); ++i) {
    sample(out, "idem_requests_total", "outcome=\"" + std::string(to_string(static_cast<Outcome>(i))) + "\"",
           std::to_string(sum([i](const MetricsShard& s) -> auto& { return s.requests[i]; })));
  }

  header(out, "idem_finish_total", "counter", "Claimed keys by what became of their record.");
  for (std::size_t i = 0; i < static_cast<std::size_t>(FinishResult::count_); ++i) {
    sample(out, "idem_finish_total", "result=\"" + std::string(to_string(static_cast<FinishResult>(i))) + "\"",
           std::to_string(sum([i](const MetricsShard& s) -> auto& { return s.finish[i]; })));
  }

  header(out, "idem_lease_takeovers_total", "counter",
         "Keys executed again because the previous holder's lease expired.");
  sample(out, "idem_lease_takeovers_total", "",
         std::to_string(sum([](const MetricsShard& s) -> auto& { return s.lease_takeovers; })));
  header(out, "idem_failure_retries_total", "counter", "Keys executed again after a failed_retryable outcome (5xx).");
  sample(out, "idem_failure_retries_total", "",
         std::to_string(sum([](const MetricsShard& s) -> auto& { return s.failure_retries; })));
  header(out, "idem_oversized_responses_total", "counter",
         "Executed requests whose response exceeded max_stored_response (stored as 410 idempotency_response_not_stored).");
  sample(out, "idem_oversized_responses_total", "",
         std::to_string(sum([](const MetricsShard& s) -> auto& { return s.oversized_responses; })));

  header(out, "idem_upstream_errors_total", "counter", "Upstream failures by kind.");
  for (std::size_t i = 0; i < static_cast<std::size_t>(UpstreamError::count_); ++i) {
    sample(out, "idem_upstream_errors_total", "kind=\"" + std::string(to_string(static_cast<UpstreamError>(i))) + "\"",
           std::to_string(sum([i](const MetricsShard& s) -> auto& { return s.upstream_errors[i]; })));
  }
  header(out, "idem_lookups_total", "counter",
         "Lookups of on_lease_expiry = \"ask\" routes by what the upstream answered.");
  for (std::size_t i = 0; i < static_cast<std::size_t>(LookupOutcome::count_); ++i) {
    sample(out, "idem_lookups_total", "answer=\"" + std::string(to_string(static_cast<LookupOutcome>(i))) + "\"",
           std::to_string(sum([i](const MetricsShard& s) -> auto& { return s.lookups[i]; })));
  }
  header(out, "idem_webhook_refusals_total", "counter",
         "Webhook requests refused before anything was claimed or forwarded, by reason.");
  for (std::size_t i = 0; i < static_cast<std::size_t>(WebhookRefusal::count_); ++i) {
    sample(out, "idem_webhook_refusals_total",
           "reason=\"" + std::string(to_string(static_cast<WebhookRefusal>(i))) + "\"",
           std::to_string(sum([i](const MetricsShard& s) -> auto& { return s.webhook_refusals[i]; })));
  }
  header(out, "idem_webhooks_verified_total", "counter", "Webhook requests whose signature and timestamp verified.");
  sample(out, "idem_webhooks_verified_total", "",
         std::to_string(sum([](const MetricsShard& s) -> auto& { return s.webhooks_verified; })));
  header(out, "idem_upstream_connections_total", "counter", "Upstream connections used, new or reused from the pool.");
  sample(out, "idem_upstream_connections_total", "kind=\"new\"",
         std::to_string(sum([](const MetricsShard& s) -> auto& { return s.upstream_connects; })));
  sample(out, "idem_upstream_connections_total", "kind=\"reused\"",
         std::to_string(sum([](const MetricsShard& s) -> auto& { return s.upstream_reuses; })));
  header(out, "idem_upstream_tls_handshakes_total", "counter",
         "TLS handshakes with an https:// upstream: resumed a session, or failed (the reason is in the log).");
  sample(out, "idem_upstream_tls_handshakes_total", "result=\"resumed\"",
         std::to_string(sum([](const MetricsShard& s) -> auto& { return s.upstream_tls_resumed; })));
  sample(out, "idem_upstream_tls_handshakes_total", "result=\"failed\"",
         std::to_string(sum([](const MetricsShard& s) -> auto& { return s.upstream_tls_failures; })));
  header(out, "idem_tls_handshakes_total", "counter",
         "TLS handshakes on the [tls] listener: full, resumed (a session ticket or id), failed.");
  sample(out, "idem_tls_handshakes_total", "result=\"full\"",
         std::to_string(sum([](const MetricsShard& s) -> auto& { return s.tls_handshakes; }) -
                        sum([](const MetricsShard& s) -> auto& { return s.tls_resumed; })));
  sample(out, "idem_tls_handshakes_total", "result=\"resumed\"",
         std::to_string(sum([](const MetricsShard& s) -> auto& { return s.tls_resumed; })));
  sample(out, "idem_tls_handshakes_total", "result=\"failed\"",
         std::to_string(sum([](const MetricsShard& s) -> auto& { return s.tls_handshake_failures; })));

  header(out, "idem_http2_connections_total", "counter", "Client connections that spoke HTTP/2 (h2 by ALPN, or h2c).");
  sample(out, "idem_http2_connections_total", "",
         std::to_string(sum([](const MetricsShard& s) -> auto& { return s.http2_connections; })));
  header(out, "idem_http2_streams_total", "counter",
         "Requests that came as HTTP/2 streams: all of them, and those reset for client_timeout (a request that "
         "did not arrive, or an answer the client took nothing of).");
  sample(out, "idem_http2_streams_total", "result=\"received\"",
         std::to_string(sum([](const MetricsShard& s) -> auto& { return s.http2_streams; })));
  sample(out, "idem_http2_streams_total", "result=\"timed_out\"",
         std::to_string(sum([](const MetricsShard& s) -> auto& { return s.http2_streams_reset; })));

  header(out, "idem_reaper_deleted_total", "counter", "Expired records deleted by the reaper.");
  sample(out, "idem_reaper_deleted_total", "",
         std::to_string(sum([](const MetricsShard& s) -> auto& { return s.reaper_deleted; })));
  header(out, "idem_store_timeouts_total", "counter",
         "Store calls given up after store_timeout (a claim answered 503, a completion left unrecorded).");
  sample(out, "idem_store_timeouts_total", "",
         std::to_string(sum([](const MetricsShard& s) -> auto& { return s.store_timeouts; })));
  header(out, "idem_store_late_claims_released_total", "counter",
         "Keys the store claimed after their request had timed out, released again.");
  sample(out, "idem_store_late_claims_released_total", "",
         std::to_string(sum([](const MetricsShard& s) -> auto& { return s.late_claims_released; })));
  header(out, "idem_connections_refused_total", "counter", "Client connections closed at once because of max_connections.");
  sample(out, "idem_connections_refused_total", "",
         std::to_string(sum([](const MetricsShard& s) -> auto& { return s.connections_refused; })));
  header(out, "idem_accept_errors_total", "counter",
         "Failed accepts on the client and admin listeners (out of file descriptors, mostly); retried every 50 ms.");
  sample(out, "idem_accept_errors_total", "",
         std::to_string(sum([](const MetricsShard& s) -> auto& { return s.accept_errors; })));

  header(out, "idem_log_lines_dropped_total", "counter",
         "Log lines dropped because stderr was not being read (more than 4 MiB waiting).");
  sample(out, "idem_log_lines_dropped_total", "", std::to_string(log::dropped_lines()));

  header(out, "idem_requests_in_flight", "gauge", "Requests being handled.");
  sample(out, "idem_requests_in_flight", "",
         std::to_string(sum_signed([](const MetricsShard& s) -> auto& { return s.in_flight; })));
  header(out, "idem_connections_open", "gauge", "Open client connections.");
  sample(out, "idem_connections_open", "",
         std::to_string(sum_signed([](const MetricsShard& s) -> auto& { return s.connections; })));

  header(out, "idem_store_call_duration_seconds", "histogram", "Latency of idempotency store calls.");
  for (std::size_t i = 0; i < static_cast<std::size_t>(StoreCall::count_); ++i) {
    histogram("idem_store_call_duration_seconds", "call=\"" + std::string(to_string(static_cast<StoreCall>(i))) + "\"",
              [i](const MetricsShard& s) -> const Histogram& { return s.store[i]; });
  }
  header(out, "idem_upstream_duration_seconds", "histogram",
         "Upstream latency: request sent until response headers received.");
  histogram("idem_upstream_duration_seconds", "", [](const MetricsShard& s) -> const Histogram& { return s.upstream; });
  header(out, "idem_lookup_duration_seconds", "histogram", "Lookup latency: sent until the whole answer was read.");
  histogram("idem_lookup_duration_seconds", "", [](const MetricsShard& s) -> const Histogram& { return s.lookup; });
  return out;
}

}  // namespace idem::gateway
