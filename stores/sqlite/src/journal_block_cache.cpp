#include "journal_block_cache.hpp"

#include <sqlite3.h>

#include <array>
#include <atomic>
#include <cstddef>

// Why: with the spill threshold raised (connection.cpp), every savepoint of the store's group
// commit keeps its statement journal in one allocation of about 127 KiB, freed when the savepoint
// is released, thousands of times a second. glibc's malloc serves a block that size from the top
// of the thread's arena, and freeing it there can leave more than M_TRIM_THRESHOLD (128 KiB) free
// at the top: free() then hands the pages back to the kernel (madvise(MADV_DONTNEED), a TLB
// shootdown across the process's threads) and the next savepoint faults them in again. Whether a
// process falls into that depends on where the first blocks landed, so about one start in five ran
// that way for good: 2-2.5k payments/s and ~450 us of CPU per payment against 7-9k/s and
// ~125 us (docs/benchmarks.md, "One start in five ran three times slower"; perf showed every
// madvise under sqlite3PagerSavepoint -> free -> heap_trim).
//
// The fix stays inside SQLite's allocations: a few freed journal-sized blocks are kept in slots
// and handed to the next journal, so the journal's memory is never returned and never refaulted.
// Nothing else in the process is touched (no mallopt). Journal requests fall in a narrow band
// above the threshold (SQLite asks for the threshold plus its chunk header); every request in the
// band is served with a block of the band's top size, so any cached block fits any of them.

namespace idem::sqlite_detail {
namespace {

constexpr int kBandWidth = 256;  // SQLite's chunk header is 8 bytes; room for other versions' own
constexpr std::size_t kSlots = 4;  // writers journaling at once (stores, the application's own)

sqlite3_mem_methods base{};  // SQLite's allocator, wrapped
int band_low = 0;            // requests in [band_low, band_high] are journal blocks
int band_high = 0;
int block_size = 0;  // base.xSize of a band_high block: identifies a journal block when freed
std::array<std::atomic<void*>, kSlots> slots{};
std::atomic<std::uint64_t> allocated{0};
std::atomic<std::uint64_t> reused{0};

void* cached_malloc(int n) {
  if (n < band_low || n > band_high) return base.xMalloc(n);
  for (auto& slot : slots) {
    if (void* block = slot.exchange(nullptr, std::memory_order_acquire)) {
      reused.fetch_add(1, std::memory_order_relaxed);
      return block;
    }
  }
  allocated.fetch_add(1, std::memory_order_relaxed);
  return base.xMalloc(band_high);
}

void cached_free(void* p) {
  // Only blocks of the band's size; anything else of that usable size would serve as well.
  if (p != nullptr && base.xSize(p) == block_size) {
    for (auto& slot : slots) {
      void* empty = nullptr;
      if (slot.compare_exchange_strong(empty, p, std::memory_order_release, std::memory_order_relaxed)) return;
    }
  }
  base.xFree(p);
}

void* cached_realloc(void* p, int n) { return base.xRealloc(p, n); }
int cached_size(void* p) { return base.xSize(p); }
int cached_roundup(int n) { return base.xRoundup(n); }
int cached_init(void*) { return base.xInit(base.pAppData); }

void cached_shutdown(void*) {
  for (auto& slot : slots) {
    if (void* block = slot.exchange(nullptr, std::memory_order_acquire)) base.xFree(block);
  }
  base.xShutdown(base.pAppData);
}

}  // namespace

bool install_journal_block_cache(int journal_bytes) {
  sqlite3_mem_methods current{};
  if (sqlite3_config(SQLITE_CONFIG_GETMALLOC, &current) != SQLITE_OK) return false;
  if (current.xMalloc == cached_malloc) return true;  // installed already (a call after a shutdown)
  base = current;
  band_low = journal_bytes;
  band_high = base.xRoundup(journal_bytes + kBandWidth);
  // The usable size of a band block, measured once with SQLite's allocator before it is wrapped.
  if (base.xInit(base.pAppData) != SQLITE_OK) return false;
  void* probe = base.xMalloc(band_high);
  if (probe == nullptr) return false;
  block_size = base.xSize(probe);
  base.xFree(probe);
  base.xShutdown(base.pAppData);
  static const sqlite3_mem_methods wrapped{cached_malloc, cached_free,    cached_realloc, cached_size,
                                           cached_roundup, cached_init, cached_shutdown, nullptr};
  return sqlite3_config(SQLITE_CONFIG_MALLOC, &wrapped) == SQLITE_OK;
}

JournalBlockCounts journal_block_counts() {
  return {allocated.load(std::memory_order_relaxed), reused.load(std::memory_order_relaxed)};
}

}  // namespace idem::sqlite_detail
