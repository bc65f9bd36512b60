#pragma once

// The memory store's hash table (one per shard): open addressing with linear probing over an
// array of (hash, record pointer) slots. Against std::unordered_map it saves what a large table
// pays for in cache misses: a lookup reads one slot and then its record, not a bucket, the node
// before the bucket's first and then the node; growing moves 16-byte slots by their stored hash
// and never touches a record. A record's own tenant and key are its key in the table; the caller
// supplies their hash, so the expiry index can keep hashes alone and find its records again
// (erase_hash_if).
//
// Not thread-safe: the memory store's shard mutex guards it.

#include <cstddef>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/record.hpp"

namespace idem::memory_detail {

class RecordTable {
 public:
  RecordTable() = default;
  RecordTable(const RecordTable&) = delete;
  RecordTable& operator=(const RecordTable&) = delete;

  std::size_t size() const { return size_; }

  /// The record with this (tenant, key), or null.
  Record* find(std::size_t hash, std::string_view tenant, std::string_view key) {
    const std::size_t i = index_of(hash, tenant, key);
    return i == npos ? nullptr : slots_[i].record.get();
  }

  /// Adds a record whose (tenant, key) is not in the table yet; `hash` is their hash.
  void insert(std::size_t hash, Record record) {
    if ((size_ + 1) * 2 > slots_.size()) grow();  // at most half full: probes stay short
    auto owned = std::make_unique<Record>(std::move(record));
    std::size_t i = hash & mask();
    while (slots_[i].record) i = (i + 1) & mask();
    slots_[i] = Slot{hash, std::move(owned)};
    ++size_;
  }

  /// Removes the record with this (tenant, key); false when there is none.
  bool erase(std::size_t hash, std::string_view tenant, std::string_view key) {
    const std::size_t i = index_of(hash, tenant, key);
    if (i == npos) return false;
    erase_at(i);
    return true;
  }

  /// Removes every record with this hash for which `doomed(record)` holds; returns how many.
  template <class Pred>
  std::size_t erase_hash_if(std::size_t hash, Pred doomed) {
    std::size_t erased = 0;
    if (slots_.empty()) return 0;
    // A removal shifts later slots back, possibly into the one just emptied: look there again.
    for (std::size_t i = hash & mask(); slots_[i].record;) {
      if (slots_[i].hash == hash && doomed(std::as_const(*slots_[i].record))) {
        erase_at(i);
        ++erased;
      } else {
        i = (i + 1) & mask();
      }
    }
    return erased;
  }

  /// Calls `f(record)` for every record, in no particular order.
  template <class F>
  void for_each(F f) const {
    for (const Slot& slot : slots_) {
      if (slot.record) f(std::as_const(*slot.record));
    }
  }

 private:
  struct Slot {
    std::size_t hash = 0;
    std::unique_ptr<Record> record;  // null: empty
  };
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  std::size_t mask() const { return slots_.size() - 1; }

  std::size_t index_of(std::size_t hash, std::string_view tenant, std::string_view key) const {
    if (slots_.empty()) return npos;
    for (std::size_t i = hash & mask(); slots_[i].record; i = (i + 1) & mask()) {
      const Slot& slot = slots_[i];
      if (slot.hash == hash && slot.record->key == key && slot.record->tenant == tenant) return i;
    }
    return npos;
  }

  // Deletes slot i's record and closes the gap (backward shift): every later slot of the same
  // run that may live at i (its home is not cyclically within (i, j]) moves back, so no probe
  // ever stops early at a hole.
  void erase_at(std::size_t i) {
    slots_[i] = Slot{};
    --size_;
    for (std::size_t j = (i + 1) & mask(); slots_[j].record; j = (j + 1) & mask()) {
      const std::size_t home = slots_[j].hash & mask();
      const bool stays = i < j ? (i < home && home <= j) : (i < home || home <= j);
      if (stays) continue;
      slots_[i] = std::move(slots_[j]);  // leaves slots_[j] empty
      i = j;
    }
  }

  void grow() {
    const std::size_t capacity = slots_.empty() ? 16 : slots_.size() * 2;
    std::vector<Slot> old = std::exchange(slots_, std::vector<Slot>(capacity));
    for (Slot& slot : old) {
      if (!slot.record) continue;
      std::size_t i = slot.hash & mask();
      while (slots_[i].record) i = (i + 1) & mask();
      slots_[i] = std::move(slot);
    }
  }

  std::vector<Slot> slots_;  // empty, or a power of two long
  std::size_t size_ = 0;
};

}  // namespace idem::memory_detail
