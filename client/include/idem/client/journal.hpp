#pragma once

#include <cstdint>
#include <expected>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/client/http.hpp"
#include "idem/clock.hpp"

namespace idem::client {

/// Why a journal call failed.
enum class JournalErrc : std::uint8_t {
  storage,    ///< the file could not be opened, read or written (disk full, permissions, corrupt)
  not_found,  ///< no operation with that key where it was looked for
};

/// A failed journal call.
struct JournalError {
  JournalErrc code = JournalErrc::storage;
  std::string message;
};

/// A journal call's value or its error.
template <class T>
using JournalResult = std::expected<T, JournalError>;

/// An operation the client owes an answer for: its key and the exact request.
struct Operation {
  std::string key;
  HttpRequest request;
  int attempts = 0;   ///< attempts made so far, across runs and restarts
  TimePoint created{};  ///< when it was first journaled
};

/// An operation the client gave up on, kept for a person to retry or drop.
struct DeadLetter {
  Operation operation;
  TimePoint failed{};
  std::string reason;  ///< the StopReason's name: "attempts_exhausted", "deadline", ...
  std::optional<HttpResponse> last_response;  ///< the last answer, if any came
  std::string last_error;  ///< the last transport error, when the last attempt got no answer
};

/// The client's durable to-do list (SPEC §8: "the client keeps the key until it has a final
/// answer, across its own restarts"): an SQLite file in WAL mode with synchronous=FULL, so an
/// operation written here survives a crash or power loss. Thread-safe. One process at a time
/// should resume a journal; several may list it.
///
/// The request is stored as given, headers included: keep credentials out of it
/// (ClientOptions::before_attempt adds them at send time). The file is created mode 0600.
class Journal {
 public:
  /// Opens (creating if needed) the journal at `path`.
  static JournalResult<std::unique_ptr<Journal>> open(const std::string& path);
  ~Journal();
  Journal(const Journal&) = delete;
  Journal& operator=(const Journal&) = delete;

  // What the Client calls around an operation.

  /// Records an operation about to make its first attempt (counted), durably. A key already
  /// pending keeps its `created` and adds the attempt; one in the dead letters leaves them.
  JournalResult<void> begin(const Operation& operation);
  /// Counts one more attempt of a pending operation.
  JournalResult<void> count_attempt(std::string_view key);
  /// Forgets a pending operation: it has its final answer. Absent keys are fine.
  JournalResult<void> complete(std::string_view key);
  /// Moves a pending operation to the dead letters with its last answer (`operation` fills in
  /// the row if the key is not pending, e.g. written by another process meanwhile).
  JournalResult<void> bury(const DeadLetter& letter);

  // What people and tools call.

  /// Pending operations, oldest first.
  JournalResult<std::vector<Operation>> pending();
  /// Dead letters, oldest failure first.
  JournalResult<std::vector<DeadLetter>> dead_letters();
  /// Moves a dead letter back to pending and returns it; not_found if there is none.
  JournalResult<Operation> revive(std::string_view key);
  /// Deletes a dead letter; not_found if there is none.
  JournalResult<void> drop_dead_letter(std::string_view key);
  /// Deletes a pending operation without sending it (an operator abandoning it); not_found if
  /// there is none.
  JournalResult<void> drop_pending(std::string_view key);

 private:
  struct Impl;
  explicit Journal(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::client
