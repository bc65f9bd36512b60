#pragma once

// The transactional outbox on SQLite (SPEC §11, docs/outbox.md): the table idem_outbox lives in
// the file of the store's records (and of the application's own tables), so that an event is
// enqueued in the transaction that completes its key. SqliteOutbox::enqueue writes a row from
// inside that transaction; a SqliteOutbox opened with open_reader is how idem-relay and idemctl
// read, claim and settle the rows.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "idem/clock.hpp"
#include "idem/outbox.hpp"
#include "idem/result.hpp"

struct sqlite3;  // the connection complete_in_transaction's work gets

namespace idem {

/// How SqliteOutbox::open_reader opens an outbox; defaults are for a relay.
struct SqliteOutboxOptions {
  /// The database file holding idem_outbox: the service's (with an idem store in it or not). It
  /// is never created: a missing file is an error, not a new empty outbox.
  std::string path;
  /// A relay's reader (idem-relay): creates the table if the file has none and takes the file's
  /// relay lock, so that only one relay relays one file. False for an operator's (idemctl): it
  /// changes no schema and takes no lock, so it works while a relay runs, but cannot claim or
  /// settle rows.
  bool relay = true;
  /// How long a write (claim, settle, an operator's action) waits for the service's write lock
  /// before it fails with StoreErrc::unavailable.
  Millis busy_timeout{5000};
};

/// An outbox in an SQLite file. One relay per file: open_reader with `relay` takes an exclusive
/// lock on a file beside the database (lock_path), which the OS releases when the process ends
/// however it ends; a second relay is refused with a sentence saying so. The lock is not one of
/// SQLite's, so it never holds up the service's own writes to the database.
///
/// Without competing relays, claim ignores leases: rows a relay claimed and never settled (it
/// crashed) are claimed again by the next relay at once. Blocking; one thread at a time.
class SqliteOutbox final : public OutboxReader {
 public:
  /// Adds `message` to the outbox inside the caller's open transaction on `db` (the `sqlite3*`
  /// an SqliteWork gets from complete_in_transaction, or any transaction of the application's
  /// on the same file), with `now` as its creation time; it is due at once. On failure returns
  /// false with `error` set to a sentence: a message outbox_message_problem refuses, a
  /// message_id already in the outbox ("message id X is already in the outbox"), no open
  /// transaction, or the database's error. The work should then return false, so that
  /// everything of the transaction rolls back.
  static bool enqueue(sqlite3* db, const OutboxMessage& message, TimePoint now, std::string& error);
  /// The same for a message checked beforehand (CheckedOutboxMessage::check), on any thread:
  /// the transaction then only inserts it.
  static bool enqueue(sqlite3* db, const CheckedOutboxMessage& message, TimePoint now, std::string& error);

  /// Creates the outbox table (and its indexes) on the application's own connection if the file
  /// has none: for a service that enqueues in transactions of its own, on a database no
  /// SqliteStore opened. Idempotent; run it once at start-up, outside any transaction.
  static StoreResult<Done> create_table(sqlite3* db);

  /// Opens the outbox of an existing database file on a connection of its own (WAL mode, busy
  /// timeout). Errors: unavailable when the file is missing or cannot be opened, or (relay)
  /// when another relay holds the file's relay lock; corrupt for a file that is not a database
  /// or whose idem schema is newer than this build; internal when an operator's reader finds no
  /// outbox table.
  static StoreResult<std::unique_ptr<SqliteOutbox>> open_reader(SqliteOutboxOptions options);

  /// The lock file a relay holds for `database_path`: beside it, named PATH-relay.lock.
  static std::string lock_path(const std::string& database_path);

  /// Closes the connection and releases the relay lock.
  ~SqliteOutbox() override;

  SqliteOutbox(const SqliteOutbox&) = delete;
  SqliteOutbox& operator=(const SqliteOutbox&) = delete;

  /// Pending rows due by `claim.now`, in id order, leased to `claim.owner` for `claim.lease`
  /// (recorded for operators; with one relay per file nothing else reads it). A row whose
  /// columns cannot be read (tampered with past the table's checks) is made dead with the
  /// reason instead of being returned, so that it does not stop the relay.
  StoreResult<std::vector<OutboxRow>> claim(const OutboxClaim& claim) override;
  StoreResult<Done> settle(const std::vector<OutboxResult>& results, TimePoint now, const std::string& owner) override;
  StoreResult<std::size_t> purge_sent(TimePoint before, std::size_t limit) override;
  StoreResult<OutboxCounts> count() override;
  StoreResult<std::vector<OutboxRow>> list(const OutboxQuery& query) override;
  StoreResult<std::optional<OutboxRow>> get(std::int64_t id) override;
  StoreResult<bool> retry_dead(std::int64_t id, TimePoint now) override;
  StoreResult<bool> drop_dead(std::int64_t id) override;
  StoreResult<Done> ping() override;

 private:
  class Impl;  // the connection, its statements and the lock (sqlite_outbox.cpp)
  explicit SqliteOutbox(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
