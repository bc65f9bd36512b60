#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "idem/client/http.hpp"
#include "idem/client/journal.hpp"
#include "idem/client/retry.hpp"
#include "idem/client/timer.hpp"
#include "idem/client/transport.hpp"
#include "idem/key.hpp"

namespace idem::client {

/// Why Client::send stopped. The first two are final answers (the journal forgets the
/// operation); the next six leave it in the dead letters for a person; the last two mean
/// nothing was sent.
enum class StopReason : std::uint8_t {
  success,             ///< a 2xx answer
  non_retryable,       ///< an answer a retry cannot change (400, 422, other 4xx, 3xx, 501, ...)
  outcome_unknown,     ///< 409 idempotency_outcome_unknown: an operator must resolve the key
  attempts_exhausted,  ///< every allowed attempt got a retryable answer or none
  deadline,            ///< the next wait would have crossed the operation's deadline
  budget_exhausted,    ///< the Client's retry budget is empty: the service is likely down
  transport_failed,    ///< an error a retry cannot fix (bad URL, TLS certificate, size limit)
  expired,             ///< resume(): journaled longer ago than resume_max_age; not re-sent
  invalid_request,     ///< refused before sending: bad key, key given twice, key already in flight
  journal_failed,      ///< the journal could not record the operation, so it was not sent
};

/// "success", "non_retryable", ... (the names the journal stores as dead-letter reasons).
std::string_view to_string(StopReason reason);

/// What happened to one operation.
struct SendResult {
  std::string key;  ///< the idempotency key, the same on every attempt
  StopReason stop = StopReason::invalid_request;
  int attempts = 0;  ///< attempts made by this call
  std::optional<HttpResponse> response;  ///< the last answer, if any came
  std::optional<TransportError> error;   ///< set when the last attempt got no answer
  bool replayed = false;  ///< the last answer was a stored replay (Idempotent-Replayed: true)
  std::string detail;     ///< why, for invalid_request and journal_failed
  /// Set when the journal could not record the end (the operation may stay pending; resuming
  /// it later is harmless while the server still remembers the key).
  std::string journal_error;

  /// A 2xx answer arrived.
  bool ok() const { return stop == StopReason::success; }
};

/// Settings of a Client; every default is explained in docs/client.md.
struct ClientOptions {
  RetryOptions retry;
  BudgetOptions budget;
  /// Header carrying the key (SPEC §2 allows servers to rename it).
  std::string key_header = "Idempotency-Key";
  /// Send the key as a Structured Field string (`"..."`, the IETF draft) instead of bare
  /// (Stripe's form). idem servers accept both.
  bool quote_key = false;
  /// Bounds a caller's own key must respect; the server refuses others with 400.
  KeyRules key_rules;
  /// resume() does not re-send operations older than this: the server may have forgotten the key
  /// (24 h retention by default), and a forgotten key would execute again.
  Millis resume_max_age = std::chrono::hours(12);
  /// Called on a copy of the request before every attempt, e.g. to add a fresh Authorization
  /// header. What it adds is sent but never journaled. May run on several threads at once.
  std::function<void(HttpRequest&)> before_attempt;
  /// Seed of the jitter generator; unset means a random seed (tests set it).
  std::optional<std::uint64_t> jitter_seed;
};

/// Sends unsafe requests with an idempotency key and retries them safely (SPEC §8): the same key
/// on every attempt, backoff with full jitter, `Retry-After` respected, a deadline, a retry budget,
/// and an optional journal that survives crashes. Thread-safe: share one per process.
class Client {
 public:
  /// `transport` defaults to a CurlTransport, `timer` to the system clocks; without `journal`
  /// nothing is durable.
  explicit Client(ClientOptions options = {}, std::shared_ptr<Transport> transport = nullptr,
                  std::shared_ptr<Journal> journal = nullptr, std::shared_ptr<Timer> timer = nullptr);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  /// Sends `request` until a final answer or a stop. The key is `key`, else an Idempotency-Key
  /// header already in the request, else a new UUIDv4. With a journal, the operation is durable
  /// before the first byte leaves.
  SendResult send(HttpRequest request, std::optional<std::string> key = std::nullopt);

  /// After a restart: sends every pending journal operation again with its original key, one
  /// after another, and returns their results (operations in flight in this Client are skipped).
  JournalResult<std::vector<SendResult>> resume();

  /// Moves a dead letter back to pending and sends it with its original key.
  JournalResult<SendResult> retry_dead_letter(std::string_view key);
  /// Deletes a dead letter.
  JournalResult<void> drop_dead_letter(std::string_view key);
  /// Pending journal operations (empty without a journal).
  JournalResult<std::vector<Operation>> pending();
  /// Dead letters (empty without a journal).
  JournalResult<std::vector<DeadLetter>> dead_letters();

  /// Retry tokens left in the budget now (observability and tests).
  double retry_tokens() const;
  /// The journal, or null.
  Journal* journal() const { return journal_.get(); }

 private:
  class InFlight;
  SendResult run(const std::string& key, const HttpRequest& request, bool first_attempt_counted);
  Millis backoff(int retry);

  ClientOptions options_;
  std::shared_ptr<Transport> transport_;
  std::shared_ptr<Journal> journal_;
  std::shared_ptr<Timer> timer_;
  mutable RetryBudget budget_;
  std::mutex mutex_;  // guards rng_ and in_flight_
  std::mt19937_64 rng_;
  std::set<std::string, std::less<>> in_flight_;
};

}  // namespace idem::client
