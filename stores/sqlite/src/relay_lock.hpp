#pragma once

// One relay per SQLite outbox: an exclusive flock(2) on a file beside the database. The OS drops
// it when the holder's process ends, however it ends (SIGKILL, a crash, a power cut), so no stale
// lock is ever left to clear by hand. It is not one of SQLite's locks (those are fcntl locks on
// the database and its -shm), so holding it never delays the service's writes.

#include <string>

#include "idem/result.hpp"

namespace idem::sqlite_detail {

/// The held lock; released when this goes away.
class RelayLock {
 public:
  /// Takes the lock on `lock_path` for the outbox in `database_path` (named in the error), or
  /// fails at once: StoreErrc::unavailable saying that another relay holds it (and its process
  /// id), or that the lock file cannot be created.
  static StoreResult<RelayLock> acquire(const std::string& lock_path, const std::string& database_path);

  RelayLock(RelayLock&& other) noexcept;
  RelayLock& operator=(RelayLock&& other) noexcept;
  RelayLock(const RelayLock&) = delete;
  RelayLock& operator=(const RelayLock&) = delete;
  ~RelayLock();

 private:
  explicit RelayLock(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace idem::sqlite_detail
