#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <random>
#include <string_view>

#include "idem/client/http.hpp"
#include "idem/client/timer.hpp"
#include "idem/clock.hpp"

namespace idem::client {

/// When and how often one operation is retried (SPEC §8). docs/client.md says why each default.
struct RetryOptions {
  /// Attempts per run of an operation, the first one included.
  int max_attempts = 5;
  /// Backoff before the first retry; each later one doubles, up to `max_delay`.
  Millis base_delay = std::chrono::seconds(1);
  /// Growth of the backoff ceiling per retry.
  double multiplier = 2.0;
  /// Ceiling of the backoff (before jitter), whatever the attempt number.
  Millis max_delay = std::chrono::seconds(30);
  /// Bound on each attempt, connect to last byte; cut shorter when the deadline is nearer.
  Millis attempt_timeout = std::chrono::seconds(30);
  /// Bound on the whole operation. Well below the server's retention (24 h by default), so the
  /// key is still remembered by the server on the last retry.
  Millis deadline = std::chrono::minutes(5);
  /// A 409 Conflict whose body has no idem code is retried only when it carries `Retry-After`
  /// (a server saying "later" means the conflict is temporary); a bare 409 is a business conflict.
  bool retry_conflict_with_retry_after = true;
  /// Wait what the server's `Retry-After` says instead of the backoff.
  bool honor_retry_after = true;
};

/// The retry budget: a token bucket shared by every operation of one Client, so retries stay a
/// small fraction of traffic during an outage instead of multiplying it.
struct BudgetOptions {
  /// Off means every retry the RetryOptions allow is made.
  bool enabled = true;
  /// Tokens earned by each operation started: retries may be at most this share of operations.
  double retry_ratio = 0.1;
  /// Tokens earned per second regardless of traffic: the floor that lets a quiet client retry.
  double min_retries_per_second = 1.0;
  /// Bucket size, and its content at start: the burst of retries allowed after a quiet period.
  double max_tokens = 10.0;
};

/// How the retry loop treats an answer.
enum class AnswerClass : std::uint8_t {
  success,          ///< 2xx: final
  retry,            ///< 408, 409 in use, 429, 500, 502, 503, 504: try again with the same key
  final,            ///< any other status: the request must change first (400, 422, other 4xx, 3xx, 501, ...)
  outcome_unknown,  ///< 409 idempotency_outcome_unknown: only an operator can decide
};

/// Classifies a response per SPEC §8 (see RetryOptions::retry_conflict_with_retry_after for 409).
AnswerClass classify(const HttpResponse& response, const RetryOptions& options = {});

/// Parses an HTTP-date: IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT"), and the obsolete RFC 850
/// ("Sunday, 06-Nov-94 08:49:37 GMT") and asctime ("Sun Nov  6 08:49:37 1994") forms.
std::optional<TimePoint> parse_http_date(std::string_view text);

/// The wait a `Retry-After` value asks for: delta-seconds or an HTTP-date relative to `now`
/// (a date in the past is zero). nullopt when the value is neither.
std::optional<Millis> parse_retry_after(std::string_view value, TimePoint now);

/// The backoff ceiling before retry number `retry` (1 for the first retry):
/// min(max_delay, base_delay * multiplier^(retry-1)).
Millis backoff_ceiling(int retry, const RetryOptions& options);

/// Full jitter: a uniformly random wait in [0, ceiling].
Millis full_jitter(Millis ceiling, std::mt19937_64& rng);

/// The token bucket behind BudgetOptions. Thread-safe.
class RetryBudget {
 public:
  RetryBudget(BudgetOptions options, SteadyTime now);
  /// An operation started: earns `retry_ratio` tokens.
  void on_operation(SteadyTime now);
  /// Takes one token for a retry; false (and nothing taken) when fewer than one is left.
  bool try_retry(SteadyTime now);
  /// Tokens available now.
  double tokens(SteadyTime now);

 private:
  void refill(SteadyTime now);  // caller holds mutex_

  BudgetOptions options_;
  std::mutex mutex_;
  double tokens_;
  SteadyTime last_refill_;
};

}  // namespace idem::client
