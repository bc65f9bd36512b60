#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "idem/clock.hpp"
#include "idem/fingerprint.hpp"
#include "idem/http_view.hpp"
#include "idem/key.hpp"
#include "idem/record.hpp"
#include "idem/store.hpp"

namespace idem {

using namespace std::chrono_literals;

/// What to do when an in-progress record's lease has run out (its holder probably crashed).
enum class LeaseExpiry : std::uint8_t {
  reexecute,  ///< take over and execute again
  unknown,    ///< answer 409 idempotency_outcome_unknown until an operator resolves the key
  /// Take over (fencing the old holder out) and ask the upstream's lookup (Policy::lookup)
  /// whether the operation happened before executing anything: Verdict::ask.
  ask,
};

/// Everything that decides how one route's requests are treated; defaults are SPEC's.
struct Policy {
  std::string key_header = "Idempotency-Key";
  bool key_required = false;  ///< true: a request without a key is refused (400)
  KeyRules key;
  Millis lease = 60s;
  Millis retention = 24h;
  std::chrono::seconds retry_after = 1s;  ///< advertised with 409 in_use and 503
  bool store_server_errors = false;       ///< true: 5xx are stored and replayed (Stripe-style)
  LeaseExpiry on_lease_expiry = LeaseExpiry::reexecute;
  /// With on_lease_expiry = ask: the upstream's lookup, e.g. `GET /v1/payments/by-key/{key}`
  /// (idem/http/lookup.hpp). Stored with the route's records, for `idemctl reconcile`.
  std::string lookup;
  FingerprintOptions fingerprint;
};

/// What the engine decided about a request.
enum class Verdict : std::uint8_t {
  pass_through,       ///< not an idempotent request (safe method, or no key on an optional route)
  execute,            ///< the caller holds the key: run the operation, then finish()
  replay,             ///< answer with the stored response
  in_use,             ///< 409 idempotency_key_in_use, with Retry-After
  mismatch,           ///< 422 idempotency_key_mismatch
  outcome_unknown,    ///< 409 idempotency_outcome_unknown
  key_missing,        ///< 400 idempotency_key_missing
  key_invalid,        ///< 400 idempotency_key_invalid
  store_unavailable,  ///< 503 idempotency_store_unavailable, with Retry-After; nothing executed
  /// 500 idempotency_record_unreadable: the key's stored response is encrypted and cannot be
  /// decrypted (key missing, bytes altered); neither replayed nor executed again.
  record_unreadable,
  /// on_lease_expiry = ask: the caller took over a key whose holder vanished (a new token and
  /// attempt fence that holder out) and must ask the upstream whether the operation happened
  /// before anything else: resolve() with the response it learns, execute with the ticket if it
  /// never happened, abandon() if the lookup could not tell (then 409 outcome_unknown).
  ask,
};

/// "pass_through", "execute", ... (metric labels, logs).
std::string_view to_string(Verdict verdict);

/// Proof that the caller holds a key; finish it exactly once.
struct Ticket {
  Fence fence;
  std::string request_hash;
  ClaimKind kind = ClaimKind::fresh;
  /// Which execution this is (Record::attempt): what the upstream is told, so it can refuse a
  /// write of a lower attempt for the key.
  std::uint32_t attempt = 1;
  TimePoint lease_expires{};
  Millis retention = 24h;
  bool store_server_errors = false;
};

/// The engine's answer to begin().
struct Decision {
  Verdict verdict = Verdict::pass_through;
  std::optional<Ticket> ticket;          ///< for execute and ask
  std::optional<StoredResponse> replay;  ///< for replay
  /// For replay: when the stored record expires (the gateway advertises it: Idempotency-Key-Expires).
  TimePoint replay_expires{};
  std::chrono::seconds retry_after{0};   ///< for in_use, store_unavailable and ask
  std::string detail;                    ///< a sentence for the client and the log
  std::optional<StoreError> store_error; ///< for store_unavailable and record_unreadable (why, for the log)
};

/// What finish() should do with a response (SPEC §4.3).
enum class Disposition : std::uint8_t {
  store,    ///< completed, replayed from now on
  release,  ///< deleted: the next retry executes (408, 409, 425, 429)
  fail,     ///< failed_retryable: the next retry executes again (5xx)
};

/// The storage rule of SPEC §4.3 for a response status.
Disposition classify_status(int status, bool store_server_errors);

/// What happened to the record when an execution finished.
enum class FinishStatus : std::uint8_t {
  stored,            ///< completed; replays will return this response
  released,          ///< deleted; the next request executes
  failed_retryable,  ///< marked; the next request executes again
  fenced_out,        ///< the lease was lost to another holder; nothing was written
  abandoned,         ///< left in progress with its lease ended; the next claim decides again
};

/// "stored", "released", ...
std::string_view to_string(FinishStatus status);

/// Safe methods are never handled (SPEC §3): GET, HEAD, OPTIONS, TRACE.
bool is_safe_method(std::string_view method);

/// Decides execute / replay / reject for requests and records their outcomes (SPEC §4).
/// Thread-safe; holds no per-request state. Callbacks run wherever the store calls back.
class Engine {
 public:
  explicit Engine(Store& store, const Clock& clock = SystemClock::instance());

  /// Validates the key, fingerprints the request and claims (tenant, key). `request` is read
  /// before begin returns, so its buffers need not outlive the call.
  void begin(const Policy& policy, const RequestView& request, std::string tenant,
             std::move_only_function<void(Decision)> done);

  /// Records the operation's response according to classify_status, fenced by the ticket.
  void finish(const Ticket& ticket, StoredResponse response, Callback<FinishStatus> done);

  /// Lets the next retry execute: for operations known not to have happened (the upstream
  /// could not be reached before the request was sent, or answered 408/409/425/429). A fresh
  /// claim's record is deleted (the key starts over, at attempt 1); a takeover's is marked
  /// failed_retryable instead (FinishStatus::failed_retryable), which keeps its attempt number:
  /// the upstream has seen this key's higher numbers (and a lookup may have fenced them), and
  /// would refuse a new attempt 1 as stale.
  void release(const Ticket& ticket, Callback<FinishStatus> done);

  /// Verdict::ask, the lookup found the operation done: `response` (what the upstream says it
  /// answered) becomes the record's outcome, fenced by the ticket, and retries replay it.
  void resolve(const Ticket& ticket, StoredResponse response, Callback<FinishStatus> done);

  /// Gives back a claim nothing was done with: its record returns to what the claim found (a
  /// fresh claim is deleted, a takeover after a failure is failed_retryable again, a takeover of
  /// an expired lease is left in progress with its lease ended, FinishStatus::abandoned), so
  /// the next retry meets the same decision again. For a lookup that could not tell, and for a
  /// claim that came back after its request was answered.
  void unclaim(const Ticket& ticket, Callback<FinishStatus> done);

  // Blocking forms, for threads that may wait. Never call them on an event-loop thread.
  Decision begin_and_wait(const Policy& policy, const RequestView& request, std::string tenant);
  StoreResult<FinishStatus> finish_and_wait(const Ticket& ticket, StoredResponse response);
  StoreResult<FinishStatus> release_and_wait(const Ticket& ticket);
  StoreResult<FinishStatus> resolve_and_wait(const Ticket& ticket, StoredResponse response);
  StoreResult<FinishStatus> unclaim_and_wait(const Ticket& ticket);

  /// The store this engine decides with.
  Store& store() { return store_; }
  /// The clock this engine reads.
  const Clock& clock() const { return clock_; }

 private:
  Store& store_;
  const Clock& clock_;
};

}  // namespace idem
