#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "idem/engine.hpp"
#include "idem/gateway/webhook.hpp"

namespace idem::gateway {

/// What happened to a request: the `outcome` label of idem_requests_total (SPEC §9).
enum class Outcome : std::uint8_t {
  executed,           ///< the key was claimed and the request forwarded
  replayed,           ///< answered from the store
  in_use,             ///< 409 idempotency_key_in_use
  mismatch,           ///< 422 idempotency_key_mismatch
  missing,            ///< 400 idempotency_key_missing
  invalid,            ///< 400 idempotency_key_invalid
  store_unavailable,  ///< 503 idempotency_store_unavailable
  outcome_unknown,    ///< 409 idempotency_outcome_unknown
  passed_through,     ///< not idempotent (safe method, unlisted PUT/DELETE, no key on an optional route)
  too_large,          ///< 413 request_too_large
  bad_request,        ///< 400/431/501 for requests that could not be parsed or are refused as framed, 400 tenant_ambiguous
  unauthorized,       ///< 401 token_missing, token_invalid, token_expired ([tenant] from = "jwt")
  /// 500 idempotency_record_unreadable: an encrypted record the keys cannot open (key missing,
  /// bytes altered); neither replayed nor executed. Alert on it: nothing but an operator fixes it.
  record_unreadable,
  /// 400 on a webhook route: the signature or timestamp did not verify, or the event had no id
  /// (idem_webhook_refusals_total says which); nothing was claimed or forwarded.
  webhook_refused,
  count_
};

/// The label value of an outcome.
std::string_view to_string(Outcome outcome);

/// The outcome a verdict counts as.
Outcome outcome_of(Verdict verdict);

/// Store calls timed by idem_store_call_duration_seconds.
enum class StoreCall : std::uint8_t { begin, finish, release, ping, purge, count_ };

/// What became of a claimed record: the `result` label of idem_finish_total.
enum class FinishResult : std::uint8_t {
  stored,
  released,
  failed_retryable,
  fenced_out,
  error,             ///< the store failed; the record stays in progress until its lease expires
  left_in_progress,  ///< the outcome is unknown (upstream timeout or dropped connection)
  /// given back unused (a lookup that could not tell): in progress with its lease ended, so the
  /// next retry asks again
  abandoned,
  count_
};

/// Upstream failures: the `kind` label of idem_upstream_errors_total.
enum class UpstreamError : std::uint8_t {
  unreachable,  ///< nothing was sent: 502, key released
  timeout,      ///< sent, no complete answer in time: 504
  dropped,      ///< sent, the connection broke before a complete answer: 504
  count_
};

/// What a lookup of on_lease_expiry = "ask" answered: the `answer` label of idem_lookups_total.
enum class LookupOutcome : std::uint8_t {
  happened,   ///< the operation took place: its response became the key's outcome
  not_found,  ///< it never happened: the retry executed as a takeover
  unknown,    ///< the upstream could not say (5xx, a 404 without the marker, another status)
  malformed,  ///< an answer breaking the lookup contract
  mismatch,   ///< an answer about another key
  failed,     ///< no answer: connection refused or dropped, lookup_timeout
  limited,    ///< not sent: more lookups than lookup_rate allows
  count_
};

/// The label value of a lookup's answer.
std::string_view to_string(LookupOutcome outcome);

/// A latency histogram with fixed buckets (seconds), updated with relaxed atomics.
class Histogram {
 public:
  static constexpr std::array<double, 16> kBounds = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
                                                     0.05,   0.1,     0.25,   0.5,   1,      2.5,    5,     10};
  /// Adds one observation.
  void observe(std::chrono::nanoseconds d);

 private:
  friend class Metrics;
  std::array<std::atomic<std::uint64_t>, kBounds.size() + 1> buckets_{};  // last: +Inf
  std::atomic<std::uint64_t> count_{0};
  std::atomic<std::uint64_t> sum_ns_{0};
};

/// One thread's counters, on cache lines of their own: every event loop writes only its shard,
/// so the hot path never contends. /metrics sums the shards.
struct alignas(64) MetricsShard {
  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(Outcome::count_)> requests{};
  std::array<Histogram, static_cast<std::size_t>(StoreCall::count_)> store{};
  Histogram upstream;
  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(FinishResult::count_)> finish{};
  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(UpstreamError::count_)> upstream_errors{};
  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(LookupOutcome::count_)> lookups{};
  Histogram lookup;  ///< lookups sent: from sending to the whole answer
  /// Webhook requests refused, by reason (idem_webhook_refusals_total).
  std::array<std::atomic<std::uint64_t>, static_cast<std::size_t>(WebhookRefusal::count_)> webhook_refusals{};
  std::atomic<std::uint64_t> webhooks_verified{0};  ///< webhook requests that verified
  std::atomic<std::uint64_t> lease_takeovers{0};
  std::atomic<std::uint64_t> failure_retries{0};
  std::atomic<std::uint64_t> reaper_deleted{0};
  std::atomic<std::uint64_t> upstream_connects{0};
  std::atomic<std::uint64_t> upstream_reuses{0};
  std::atomic<std::uint64_t> upstream_tls_resumed{0};   ///< TLS handshakes with the upstream that resumed a session
  std::atomic<std::uint64_t> upstream_tls_failures{0};  ///< TLS handshakes with the upstream that failed
  std::atomic<std::uint64_t> tls_handshakes{0};          ///< client TLS handshakes that succeeded
  std::atomic<std::uint64_t> tls_resumed{0};             ///< ... of them resumed a session
  std::atomic<std::uint64_t> tls_handshake_failures{0};  ///< client TLS handshakes that failed
  std::atomic<std::uint64_t> http2_connections{0};       ///< client connections that spoke HTTP/2
  std::atomic<std::uint64_t> http2_streams{0};           ///< requests that came as HTTP/2 streams
  std::atomic<std::uint64_t> http2_streams_reset{0};     ///< ... reset for client_timeout (the watchdog)
  std::atomic<std::uint64_t> oversized_responses{0};
  std::atomic<std::uint64_t> connections_refused{0};
  std::atomic<std::uint64_t> accept_errors{0};  ///< accept() failed (out of file descriptors, mostly)
  std::atomic<std::uint64_t> store_timeouts{0};       ///< store calls given up after store_timeout
  std::atomic<std::uint64_t> late_claims_released{0};  ///< keys claimed after their request had timed out
  std::atomic<std::int64_t> in_flight{0};
  std::atomic<std::int64_t> connections{0};

  void count(Outcome o) { requests[static_cast<std::size_t>(o)].fetch_add(1, std::memory_order_relaxed); }
  void count(FinishResult r) { finish[static_cast<std::size_t>(r)].fetch_add(1, std::memory_order_relaxed); }
  void count(UpstreamError e) { upstream_errors[static_cast<std::size_t>(e)].fetch_add(1, std::memory_order_relaxed); }
  void count(LookupOutcome l) { lookups[static_cast<std::size_t>(l)].fetch_add(1, std::memory_order_relaxed); }
  void count(WebhookRefusal r) {
    webhook_refusals[static_cast<std::size_t>(r)].fetch_add(1, std::memory_order_relaxed);
  }
  Histogram& store_call(StoreCall c) { return store[static_cast<std::size_t>(c)]; }
};

/// The gateway's Prometheus metrics.
class Metrics {
 public:
  /// One shard per event loop.
  explicit Metrics(std::size_t shards);
  /// Shard `i` (the event loop's index).
  MetricsShard& shard(std::size_t i) { return *shards_[i]; }
  /// The Prometheus text exposition (version 0.0.4) of every metric, summed over shards.
  std::string render() const;

 private:
  std::vector<std::unique_ptr<MetricsShard>> shards_;
};

}  // namespace idem::gateway
