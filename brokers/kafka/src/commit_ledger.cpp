#include "commit_ledger.hpp"

#include <algorithm>
#include <atomic>

namespace idem::kafka_detail {
namespace {

// Unique in the process: a Delivery kept from one source (or one assignment) never matches
// another.
std::atomic<std::uint64_t> assignment_ids{0};

}  // namespace

std::uint64_t CommitLedger::assign(std::int32_t partition) {
  Partition fresh;
  fresh.assignment = ++assignment_ids;
  partitions_[partition] = std::move(fresh);
  return partitions_[partition].assignment;
}

void CommitLedger::start_revoke(std::int32_t partition) {
  if (auto it = partitions_.find(partition); it != partitions_.end()) it->second.revoking = true;
}

void CommitLedger::revoke(std::int32_t partition) { partitions_.erase(partition); }

bool CommitLedger::active(std::int32_t partition) const {
  const auto it = partitions_.find(partition);
  return it != partitions_.end() && !it->second.revoking;
}

bool CommitLedger::revoking(std::int32_t partition) const {
  const auto it = partitions_.find(partition);
  return it != partitions_.end() && it->second.revoking;
}

std::optional<std::uint64_t> CommitLedger::assignment(std::int32_t partition) const {
  const auto it = partitions_.find(partition);
  if (it == partitions_.end()) return std::nullopt;
  return it->second.assignment;
}

std::optional<std::int32_t> CommitLedger::partition_of(std::uint64_t assignment) const {
  for (const auto& [partition, p] : partitions_) {
    if (p.assignment == assignment) return partition;
  }
  return std::nullopt;
}

std::vector<std::int32_t> CommitLedger::partitions() const {
  std::vector<std::int32_t> out;
  for (const auto& [partition, p] : partitions_) out.push_back(partition);
  return out;
}

CommitLedger::Partition* CommitLedger::find(std::uint64_t assignment) {
  for (auto& [partition, p] : partitions_) {
    if (p.assignment == assignment) return &p;
  }
  return nullptr;
}

const CommitLedger::Partition* CommitLedger::find(std::uint64_t assignment) const {
  for (const auto& [partition, p] : partitions_) {
    if (p.assignment == assignment) return &p;
  }
  return nullptr;
}

std::optional<std::uint64_t> CommitLedger::hand_out(std::int32_t partition, std::int64_t offset) {
  const auto it = partitions_.find(partition);
  if (it == partitions_.end() || it->second.revoking || offset < 0) return std::nullopt;
  Partition& p = it->second;
  // Offsets come in order within an assignment; one at or below `next` was handed out before
  // (librdkafka fetched it again after a pause, say) and is open or done already.
  if (p.next >= 0 && offset < p.next) return std::nullopt;
  p.open.emplace(offset, Open{});
  ++p.held;
  p.next = offset + 1;
  return p.assignment;
}

CommitLedger::Mark CommitLedger::done(std::uint64_t assignment, std::int64_t offset) {
  Partition* p = find(assignment);
  if (p == nullptr) return Mark::stale;
  const auto it = p->open.find(offset);
  if (it == p->open.end()) return Mark::settled;
  if (it->second.held) --p->held;
  p->open.erase(it);
  return Mark::ok;
}

CommitLedger::Mark CommitLedger::park(std::uint64_t assignment, std::int64_t offset) {
  Partition* p = find(assignment);
  if (p == nullptr) return Mark::stale;
  const auto it = p->open.find(offset);
  if (it == p->open.end() || !it->second.held) return Mark::settled;
  it->second.held = false;
  --p->held;
  return Mark::ok;
}

std::optional<std::uint32_t> CommitLedger::redeliver(std::uint64_t assignment, std::int64_t offset) {
  Partition* p = find(assignment);
  if (p == nullptr || p->revoking) return std::nullopt;
  const auto it = p->open.find(offset);
  if (it == p->open.end() || it->second.held) return std::nullopt;
  it->second.held = true;
  ++p->held;
  return ++it->second.count;
}

std::uint32_t CommitLedger::delivery_count(std::uint64_t assignment, std::int64_t offset) const {
  const Partition* p = find(assignment);
  if (p == nullptr) return 0;
  const auto it = p->open.find(offset);
  return it == p->open.end() ? 0 : it->second.count;
}

std::size_t CommitLedger::held(std::int32_t partition) const {
  const auto it = partitions_.find(partition);
  return it == partitions_.end() ? 0 : it->second.held;
}

std::size_t CommitLedger::held() const {
  std::size_t n = 0;
  for (const auto& [partition, p] : partitions_) n += p.held;
  return n;
}

std::optional<std::int64_t> CommitLedger::committable(std::int32_t partition) const {
  const auto it = partitions_.find(partition);
  if (it == partitions_.end() || it->second.next < 0) return std::nullopt;
  const Partition& p = it->second;
  return p.open.empty() ? p.next : p.open.begin()->first;
}

std::vector<CommitLedger::Commit> CommitLedger::to_commit(bool unconfirmed) const {
  std::vector<Commit> out;
  for (const auto& [partition, p] : partitions_) {
    const auto offset = committable(partition);
    if (!offset) continue;
    if (*offset > (unconfirmed ? p.confirmed : p.sent)) out.push_back({partition, *offset});
  }
  return out;
}

void CommitLedger::sent(const std::vector<Commit>& commits) {
  for (const Commit& c : commits) {
    if (auto it = partitions_.find(c.partition); it != partitions_.end()) it->second.sent = std::max(it->second.sent, c.offset);
  }
}

void CommitLedger::committed(std::int32_t partition, std::int64_t offset) {
  const auto it = partitions_.find(partition);
  if (it == partitions_.end()) return;
  it->second.confirmed = std::max(it->second.confirmed, offset);
  it->second.sent = std::max(it->second.sent, offset);
}

void CommitLedger::commit_failed(std::int32_t partition, std::int64_t offset) {
  const auto it = partitions_.find(partition);
  if (it == partitions_.end()) return;
  // Sent again unless a later commit already covers it.
  if (it->second.sent <= offset) it->second.sent = it->second.confirmed;
}

std::int64_t CommitLedger::confirmed(std::int32_t partition) const {
  const auto it = partitions_.find(partition);
  return it == partitions_.end() ? -1 : it->second.confirmed;
}

}  // namespace idem::kafka_detail
