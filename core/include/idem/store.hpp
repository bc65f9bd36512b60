#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "idem/clock.hpp"
#include "idem/record.hpp"
#include "idem/result.hpp"

namespace idem {

/// The identity of a record.
struct RecordId {
  std::string tenant;
  std::string key;
};

/// A claim: "make (tenant, key) mine, unless someone already owns or finished it".
/// All times come from the caller's clock, so every store decides expiry the same way.
struct ClaimRequest {
  RecordId id;
  std::string request_hash;
  std::uint64_t token = 0;  ///< the fencing token installed if this claim wins
  TimePoint now{};
  TimePoint lease_expires{};  ///< now + lease
  TimePoint expires{};        ///< now + retention: the record is forgotten after this
  /// What to do with an in-progress record whose lease ran out: take it over (true) or report
  /// the outcome as unknown (false, `on_lease_expiry = "unknown"`). A takeover to ask the
  /// upstream first (`"ask"`) is a takeover too: the store does not tell them apart.
  bool take_over_expired_lease = true;
  /// Stored as Record::lookup by a winning claim (the route's lookup, or empty).
  std::string lookup;
};

/// What a claim found. Exactly one of these, decided atomically in the store.
enum class ClaimStatus : std::uint8_t {
  claimed,          ///< the caller now holds the record (fresh, or taken over); execute
  mismatch,         ///< a record exists with another request hash; untouched
  completed,        ///< a completed record with the same hash; replay it
  in_progress,      ///< someone holds a valid lease
  outcome_unknown,  ///< the lease expired and the policy forbids takeover
};

/// How a successful claim came about; anything but `fresh` is a takeover.
enum class ClaimKind : std::uint8_t { fresh, after_lease_expiry, after_failure };

/// The answer to a claim. `record` is the record after the claim: the caller's own for
/// `claimed` (its `attempt` says which execution this is), the stored one otherwise (with its
/// response for `completed`).
struct ClaimResult {
  ClaimStatus status = ClaimStatus::claimed;
  ClaimKind kind = ClaimKind::fresh;
  Record record;
};

/// A holder's proof of ownership: a write succeeds only while the record still carries `token`.
struct Fence {
  RecordId id;
  std::uint64_t token = 0;
};

/// Store the response; the record becomes `completed` until `expires`.
struct CompleteRequest {
  Fence fence;
  StoredResponse response;
  TimePoint now{};
  TimePoint expires{};
};

/// The record becomes `failed_retryable`: the next claim with the same hash executes again.
struct FailRequest {
  Fence fence;
  TimePoint now{};
  TimePoint expires{};
};

/// Gives a held record back without an outcome: it stays in_progress, with the caller's token,
/// and its lease ends at `now`, so the next claim meets an expired lease and on_lease_expiry
/// decides again (a takeover, a lookup, or outcome_unknown). For a holder that learnt nothing
/// about the operation (a lookup that failed, a claim that came too late to be used).
struct AbandonRequest {
  Fence fence;
  TimePoint now{};
};

/// Whether a fenced write found the caller still holding the record.
enum class FenceStatus : std::uint8_t {
  ok,    ///< applied
  lost,  ///< the record is gone or carries another token; nothing was changed
};

/// How one item of a transactional batch completion ended (SqliteStore and PostgresStore's
/// complete_many_in_transaction: many completions, each with the application's work, in one
/// transaction with a savepoint per item).
enum class WorkStatus : std::uint8_t {
  committed,  ///< the item's work and its completion committed together
  declined,   ///< its work returned false or threw (PostgreSQL: or one of its statements failed): its
              ///< writes and its completion were rolled back to its savepoint, the others' were not
  lost,       ///< the caller no longer held the record: its work did not run, or was rolled back
};

/// The answer for one item of complete_many_in_transaction.
struct WorkResult {
  WorkStatus status = WorkStatus::committed;
  /// declined: why (the work's message, or the error of its statement that failed).
  std::string error{};
};

/// One result per item of a batch call, in the order of the items.
template <class T>
using BatchResults = std::vector<StoreResult<T>>;

/// How batch calls report: always one result per item (an item's store error is that item's
/// result), never an error for the batch as a whole. Runs like a Callback (any thread, possibly
/// before the call returns, must not block).
template <class T>
using BatchCallback = std::move_only_function<void(BatchResults<T>)>;

/// Durable storage of idempotency records (SPEC §6).
///
/// Every operation is asynchronous: it returns at once and reports through its callback, which
/// may run on a thread of the store's own and may run before the call returns. Callers that can
/// block use BlockingStore. A store decides each operation atomically, also against other
/// processes sharing it.
class Store {
 public:
  virtual ~Store() = default;

  /// Atomically claims a key, or reports why not (SPEC §4.2).
  virtual void claim(ClaimRequest request, Callback<ClaimResult> done) = 0;

  /// Completes a record the caller holds, storing its response.
  virtual void complete(CompleteRequest request, Callback<FenceStatus> done) = 0;

  /// Marks a record the caller holds as failed_retryable.
  virtual void fail(FailRequest request, Callback<FenceStatus> done) = 0;

  /// Deletes a record the caller holds, so the next request executes as if it never came.
  virtual void release(Fence fence, Callback<FenceStatus> done) = 0;

  /// Ends the lease of a record the caller holds, leaving it in_progress (AbandonRequest).
  virtual void abandon(AbandonRequest request, Callback<FenceStatus> done) = 0;

  // Batch calls (docs/stores.md, "Batch calls"): each item is decided exactly as the single call
  // would decide it, items in the order given, so two items on one key resolve as if called one
  // after the other; an item that fails fails alone. A store that overrides none of them still
  // answers them: the defaults make the single calls one after the other (one round trip each).
  // The stores of this project override them to use one round trip or one transaction per batch.

  /// claim for each request.
  virtual void claim_many(std::vector<ClaimRequest> requests, BatchCallback<ClaimResult> done);
  /// complete for each request.
  virtual void complete_many(std::vector<CompleteRequest> requests, BatchCallback<FenceStatus> done);
  /// fail for each request.
  virtual void fail_many(std::vector<FailRequest> requests, BatchCallback<FenceStatus> done);
  /// release for each fence.
  virtual void release_many(std::vector<Fence> fences, BatchCallback<FenceStatus> done);

  /// Reads a record, expired or not; nullopt when absent.
  virtual void get(RecordId id, Callback<std::optional<Record>> done) = 0;

  /// Deletes up to `limit` records whose `expires` is at or before `now`; reports how many.
  virtual void purge_expired(TimePoint now, std::size_t limit, Callback<std::size_t> done) = 0;

  /// Checks that the store answers (for readiness probes).
  virtual void ping(Callback<Done> done) = 0;

  /// Whether the store deletes expired records by itself (Redis key TTLs), so that nobody needs
  /// to call purge_expired periodically: the gateway's reaper does not run on such a store.
  virtual bool expires_records_itself() const noexcept { return false; }
};

/// Blocking adapter over a Store, for threads that may wait (tests, tools, library users).
/// Never use it on an event-loop thread, nor inside a store callback: stores whose callbacks run
/// on their own thread (SQLite, PostgreSQL, Redis) would wait for themselves.
class BlockingStore {
 public:
  explicit BlockingStore(Store& store) : store_(store) {}

  StoreResult<ClaimResult> claim(ClaimRequest request);
  StoreResult<FenceStatus> complete(CompleteRequest request);
  StoreResult<FenceStatus> fail(FailRequest request);
  StoreResult<FenceStatus> release(Fence fence);
  StoreResult<FenceStatus> abandon(AbandonRequest request);
  BatchResults<ClaimResult> claim_many(std::vector<ClaimRequest> requests);
  BatchResults<FenceStatus> complete_many(std::vector<CompleteRequest> requests);
  BatchResults<FenceStatus> fail_many(std::vector<FailRequest> requests);
  BatchResults<FenceStatus> release_many(std::vector<Fence> fences);
  StoreResult<std::optional<Record>> get(RecordId id);
  StoreResult<std::size_t> purge_expired(TimePoint now, std::size_t limit);
  StoreResult<Done> ping();

 private:
  Store& store_;
};

/// The decision a claim must take given the record currently stored (nullopt: none, or one past
/// its `expires`). Every store applies exactly this rule inside its own atomic step; stores that
/// run it in-process (memory, SQLite) call it directly, the others mirror it in their language.
/// Returns the status and, for `claimed`, how it came about.
struct ClaimDecision {
  ClaimStatus status;
  ClaimKind kind = ClaimKind::fresh;
};
ClaimDecision decide_claim(const std::optional<Record>& current, const ClaimRequest& request);

/// A fresh, nonzero, unpredictable fencing token (OpenSSL's CSPRNG).
std::uint64_t new_fencing_token();

/// The record a winning claim writes. A takeover of `previous` (unexpired) continues its
/// operation: it keeps the creation time and counts one more attempt; anything else starts at
/// attempt 1. Stores that decide in another language (PL/pgSQL, Lua) mirror this.
Record claimed_record(const ClaimRequest& request, const std::optional<Record>& previous);
/// The same, taking the request's tenant, key and fingerprint instead of copying them.
Record claimed_record(ClaimRequest&& request, const std::optional<Record>& previous);

}  // namespace idem
