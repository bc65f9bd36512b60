#pragma once

// What a Kafka source may commit, per partition: the offsets it handed out and which are done.
// Kafka commits one offset per partition, "everything before this is done", while the consume
// loop finishes messages in any order; so the offset committed is the first one not done (the
// contiguous done prefix), never past a message still running, waiting for a retry, or not yet
// dead-lettered. Pure bookkeeping, no librdkafka: unit-tested on its own.

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace idem::kafka_detail {

class CommitLedger {
 public:
  /// What became of a call for one delivery.
  enum class Mark : std::uint8_t {
    ok,
    stale,    ///< its partition's assignment is gone (revoked, or assigned again since)
    settled,  ///< not open: already done, or never handed out
  };

  /// An offset to commit for a partition.
  struct Commit {
    std::int32_t partition = 0;
    std::int64_t offset = 0;  ///< the first offset not done: the next one the group reads
    friend bool operator==(const Commit&, const Commit&) = default;
  };

  /// The partition is now ours: its deliveries carry the returned assignment id (unique in the
  /// process, so that a delivery of an earlier assignment of the same partition is stale).
  std::uint64_t assign(std::int32_t partition);
  /// A rebalance takes the partition away: nothing more is handed out from it, but its held
  /// deliveries may still be settled until revoke().
  void start_revoke(std::int32_t partition);
  /// The partition is gone: its deliveries are stale from now on.
  void revoke(std::int32_t partition);

  /// Whether messages of the partition may be handed out (assigned, not being revoked).
  bool active(std::int32_t partition) const;
  /// Whether the partition is being revoked.
  bool revoking(std::int32_t partition) const;
  /// The assignment id of the partition's current assignment.
  std::optional<std::uint64_t> assignment(std::int32_t partition) const;
  /// The partition of an assignment still held (not revoked).
  std::optional<std::int32_t> partition_of(std::uint64_t assignment) const;
  /// The partitions held, revoking or not.
  std::vector<std::int32_t> partitions() const;

  /// A message of an active partition is handed out: it is held from now on. nullopt (and
  /// nothing recorded) when the partition is not active or the offset was handed out before
  /// (a fetch that came back twice); else the assignment id for the Delivery.
  std::optional<std::uint64_t> hand_out(std::int32_t partition, std::int64_t offset);
  /// The delivery is done (acked, or its dead letter confirmed).
  Mark done(std::uint64_t assignment, std::int64_t offset);
  /// The delivery is handed back to wait for a retry: still open (it holds the commit back), no
  /// longer held.
  Mark park(std::uint64_t assignment, std::int64_t offset);
  /// A parked delivery is handed out again: its delivery count, this time included (2, 3, ...).
  /// nullopt when it is not parked or its partition not active.
  std::optional<std::uint32_t> redeliver(std::uint64_t assignment, std::int64_t offset);
  /// How many times the delivery was handed out (0 when not open).
  std::uint32_t delivery_count(std::uint64_t assignment, std::int64_t offset) const;

  /// Deliveries of the partition handed out and not settled (parked ones excluded).
  std::size_t held(std::int32_t partition) const;
  /// Deliveries handed out and not settled, in every partition.
  std::size_t held() const;

  /// The offset that may be committed for the partition: the first open offset, or one past
  /// the last handed out when none is open; nullopt before anything was handed out.
  std::optional<std::int64_t> committable(std::int32_t partition) const;
  /// Commits to send now: partitions whose committable offset is past what was last sent
  /// (`unconfirmed`: past what was last confirmed, for the synchronous commits of a revocation
  /// or close, which must not trust an asynchronous one still in flight).
  std::vector<Commit> to_commit(bool unconfirmed = false) const;
  /// These commits were sent.
  void sent(const std::vector<Commit>& commits);
  /// The cluster confirmed a commit (for a partition no longer held: ignored).
  void committed(std::int32_t partition, std::int64_t offset);
  /// A commit failed: it is sent again by the next to_commit.
  void commit_failed(std::int32_t partition, std::int64_t offset);
  /// The last offset the cluster confirmed for the partition (-1: none known).
  std::int64_t confirmed(std::int32_t partition) const;

 private:
  struct Open {
    std::uint32_t count = 1;  // times handed out
    bool held = true;         // false: parked, waiting for a retry
  };
  struct Partition {
    std::uint64_t assignment = 0;
    bool revoking = false;
    std::int64_t next = -1;  // one past the highest offset handed out; -1: none yet
    std::map<std::int64_t, Open> open;
    std::size_t held = 0;
    std::int64_t sent = -1;       // the last offset sent in a commit
    std::int64_t confirmed = -1;  // the last offset the cluster confirmed
  };

  Partition* find(std::uint64_t assignment);
  const Partition* find(std::uint64_t assignment) const;

  std::map<std::int32_t, Partition> partitions_;
};

}  // namespace idem::kafka_detail
