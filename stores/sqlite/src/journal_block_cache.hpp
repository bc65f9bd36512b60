#pragma once
// Keeps statement-journal blocks out of the C library's trimming (journal_block_cache.cpp says
// why). Process-wide, like the spill threshold it goes with; internal to the SQLite module.

#include <cstdint>

namespace idem::sqlite_detail {

/// Wraps SQLite's own allocator so that a freed block of a statement journal's size (one block of
/// `journal_bytes`, the spill threshold) is kept for the next journal instead of being freed.
/// Process-wide and only before SQLite's first use: returns false, changing nothing, after it.
bool install_journal_block_cache(int journal_bytes);

struct JournalBlockCounts {
  std::uint64_t allocated = 0;  // journal-sized blocks taken from SQLite's allocator
  std::uint64_t reused = 0;     // journal-sized blocks served from the cache
};

/// Counts since install_journal_block_cache (zero without it).
JournalBlockCounts journal_block_counts();

}  // namespace idem::sqlite_detail
