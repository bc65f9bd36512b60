#pragma once

// Keys held behind a dead letter (SPEC §10, docs/consumers.md "Held behind a dead letter").
//
// With ordering = key, a message that is finally dead-lettered must not be overtaken by its
// key's later messages: they are parked in the dead-letter queue behind it, in order, and the
// key stays held until every parked message has run again in that order (the operator replays
// the dead letters once the cause is fixed) or was dropped. A hold is shared by every consumer of
// the name, so it lives in the store: one record per held key, under the tenant
// "consumer NAME held" (no HTTP tenant and no other consumer can name it), listing the parked
// message ids oldest first.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/clock.hpp"
#include "idem/result.hpp"
#include "idem/store.hpp"

namespace idem {

/// Where a consume loop keeps the keys it holds (ConsumeLoopOptions::holds).
class KeyHolds {
 public:
  virtual ~KeyHolds() = default;
  /// The key's parked message ids, oldest (the one dead-lettered first) first; empty when the
  /// key is not held.
  virtual StoreResult<std::vector<std::string>> parked(std::string_view key) = 0;
  /// Holds the key (if it is not held yet) and parks `message_id` at the end; no change when it
  /// is parked already.
  virtual StoreResult<Done> park(std::string_view key, std::string_view message_id) = 0;
  /// Removes `message_id` when it is the first parked id (it ran, or an operator dropped it);
  /// the key is no longer held once none remain. No change otherwise.
  virtual StoreResult<Done> unpark_first(std::string_view key, std::string_view message_id) = 0;
};

/// KeyHolds in a Store (any backend), for consumer `consumer_name`.
///
/// A hold is an in_progress record whose lease never runs out (ten years) and whose lookup field
/// carries the parked ids, one a line. Its writers take turns under a lock (a claim on a record
/// of the tenant "consumer NAME held lock", released after the change; its 5-second lease is how
/// long a writer that died holding it delays the next). Under it a change reads the hold, ends
/// its lease (`abandon`) and claims it back with the new list: rewritten in place, so a reader
/// (who takes no lock) always sees the old list or the new one. The last unpark deletes it
/// (`release`). Blocking: call it from a consumer's worker threads or a tool, never from an
/// event loop.
class StoreKeyHolds final : public KeyHolds {
 public:
  /// `clock` (nullable: the system clock) must outlive this.
  StoreKeyHolds(Store& store, std::string_view consumer_name, const Clock* clock = nullptr);

  StoreResult<std::vector<std::string>> parked(std::string_view key) override;
  StoreResult<Done> park(std::string_view key, std::string_view message_id) override;
  StoreResult<Done> unpark_first(std::string_view key, std::string_view message_id) override;
  /// Forgets the key's hold altogether (an operator lets its parked messages go: replayed later,
  /// they run as new ones). Whether there was one.
  StoreResult<bool> forget(std::string_view key);

  /// The tenant the holds of `consumer_name` are stored under: "consumer NAME held".
  static std::string tenant_of(std::string_view consumer_name);
  /// A hold record's parked ids (its lookup field), oldest first.
  static std::vector<std::string> parked_ids(const Record& hold);

 private:
  // Takes the hold's lock, reads the hold, applies `change` to its list, writes it back.
  // `change` returns false for "nothing to write".
  template <class Change>
  StoreResult<Done> update(std::string_view key, Change change);
  template <class Change>
  StoreResult<Done> write_locked(BlockingStore& store, std::string_view key, Change& change);
  TimePoint now() const;

  Store& store_;
  std::string tenant_;
  std::string lock_tenant_;
  const Clock* clock_;
};

}  // namespace idem
