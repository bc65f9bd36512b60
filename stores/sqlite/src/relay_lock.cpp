#include "relay_lock.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

namespace idem::sqlite_detail {
namespace {

// The process id the holder wrote into the lock file, for the error message; empty if unreadable.
std::string holder_of(int fd) {
  char buf[32] = {};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return {};
  std::string pid(buf, static_cast<std::size_t>(n));
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  for (const char c : pid) {
    if (c < '0' || c > '9') return {};
  }
  return pid;
}

}  // namespace

StoreResult<RelayLock> RelayLock::acquire(const std::string& lock_path, const std::string& database_path) {
  // O_CLOEXEC: a program the relay starts must not keep the lock alive after the relay is gone.
  const int fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    return std::unexpected(StoreError{StoreErrc::unavailable, "sqlite: cannot create the relay lock " + lock_path +
                                                                  " beside the outbox: " + std::strerror(errno)});
  }
  int rc;
  do {
    rc = ::flock(fd, LOCK_EX | LOCK_NB);
  } while (rc != 0 && errno == EINTR);
  if (rc != 0) {
    const int err = errno;
    std::string message;
    if (err == EWOULDBLOCK) {
      const std::string pid = holder_of(fd);
      message = "sqlite: another idem-relay is relaying this outbox (" + database_path +
                "): one relay per SQLite file (" + lock_path + " is held" +
                (pid.empty() ? std::string() : " by process " + pid) + ")";
    } else {
      message = "sqlite: cannot lock " + lock_path + ": " + std::strerror(err);
    }
    ::close(fd);
    return std::unexpected(StoreError{StoreErrc::unavailable, std::move(message)});
  }
  // Who holds it, for the next relay's error message. Best effort: the lock is what counts.
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, pid.data(), pid.size(), 0);
  return RelayLock(fd);
}

RelayLock::RelayLock(RelayLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}

RelayLock& RelayLock::operator=(RelayLock&& other) noexcept {
  std::swap(fd_, other.fd_);
  return *this;
}

RelayLock::~RelayLock() {
  // Closing the last descriptor of the open file releases the flock. The file stays: deleting
  // it would let a relay that opened it just before lock a file nobody else can find.
  if (fd_ >= 0) ::close(fd_);
}

}  // namespace idem::sqlite_detail
