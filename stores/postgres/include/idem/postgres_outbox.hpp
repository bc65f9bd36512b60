#pragma once

// The transactional outbox on PostgreSQL (SPEC §11, docs/outbox.md): the table idem_outbox lives
// in the store's schema, so that an event is enqueued in the transaction that completes its key.
// PostgresOutbox::enqueue writes a row from inside that transaction; a PostgresOutbox opened with
// open_reader is how idem-relay and idemctl read, claim and settle the rows. Several relays may
// share one outbox: a claim skips the rows another relay holds.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "idem/clock.hpp"
#include "idem/outbox.hpp"
#include "idem/postgres_store.hpp"
#include "idem/result.hpp"

namespace idem {

/// How PostgresOutbox::open_reader connects; defaults are for a relay.
struct PostgresOutboxOptions {
  /// Where the server is: a libpq URL or key=value string, as PostgresOptions::conninfo.
  std::string conninfo;
  /// The schema holding idem_outbox: the store's PostgresOptions::schema.
  std::string schema = "public";
  /// A relay's reader (idem-relay): creates the table (and the schema) if missing. False for an
  /// operator's (idemctl): it changes no schema and cannot claim or settle rows.
  bool relay = true;
  /// How long connecting may take; while the server is unreachable each call fails with
  /// StoreErrc::unavailable within about this time.
  Millis connect_timeout{5000};
  /// The server cancels a statement running longer (StoreErrc::timeout); the client gives up on
  /// a connection silent for this plus one second.
  Millis statement_timeout{5000};
  /// Shown in pg_stat_activity; a conninfo that sets application_name wins.
  std::string application_name = "idem-relay";
};

/// An outbox in a PostgreSQL schema, on one connection of its own (reopened when lost).
///
/// A claim is one statement: it locks due pending rows with FOR UPDATE SKIP LOCKED and writes a
/// lease (owner and expiry) on them, so concurrent relays never take the same row while its
/// lease holds, and a relay that died holding rows loses them to the next claim after the
/// lease. settle touches only rows still leased to the settling owner. Blocking; one thread at
/// a time.
class PostgresOutbox final : public OutboxReader {
 public:
  /// Adds `message` to the outbox of the store's schema (tx.schema()) inside the transaction of
  /// `tx` (complete_in_transaction's work, or a consumer's process_once_in_transaction), with
  /// `now` as its creation time; it is due at once. On failure returns false with `error` set
  /// to a sentence: a message outbox_message_problem refuses, a message_id already in the
  /// outbox ("message id X is already in the outbox"), or the statement's error (which leaves
  /// the transaction aborted). The work should then return false, so that everything rolls back.
  static bool enqueue(PostgresTransaction& tx, const OutboxMessage& message, TimePoint now, std::string& error);
  /// The same for a message checked beforehand (CheckedOutboxMessage::check).
  static bool enqueue(PostgresTransaction& tx, const CheckedOutboxMessage& message, TimePoint now,
                      std::string& error);

  /// Connects and checks the table (a relay creates it when missing, under the store's
  /// migration lock). Errors: unavailable when the server cannot be reached or refuses the role;
  /// corrupt when the schema's idem version is newer than this build; internal for bad options
  /// or, for an operator's reader, a schema without the table. No password in any message.
  static StoreResult<std::unique_ptr<PostgresOutbox>> open_reader(PostgresOutboxOptions options);

  /// Closes the connection.
  ~PostgresOutbox() override;

  PostgresOutbox(const PostgresOutbox&) = delete;
  PostgresOutbox& operator=(const PostgresOutbox&) = delete;

  /// Pending rows due by `claim.now` whose lease (if any) ran out by then, in id order, skipping
  /// rows another transaction has locked; leased to `claim.owner` until now + lease. Rows are
  /// claimed in id order among those visible, and a row committed late by a long transaction may
  /// have a smaller id than rows already published. A row whose columns cannot be read is made
  /// dead with the reason instead of being returned.
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
  class Impl;  // the connection and the statements (postgres_outbox.cpp)
  explicit PostgresOutbox(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem
