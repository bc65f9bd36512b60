#pragma once

// The transactional outbox (SPEC §11). A business transaction that must tell others enqueues its
// events in the same transaction as its own writes and the key's completion
// (SqliteOutbox::enqueue, PostgresOutbox::enqueue, inside complete_in_transaction's work), so
// that the three commit together or not at all. A relay (idem-relay) reads the outbox through an
// OutboxReader and publishes each row at least once, with its stable message id; consumers
// dedupe by that id. Nothing is marked sent before the sink confirmed it.
//
// The tables are documented (docs/outbox.md), so that a service in any language can insert rows
// in its own transaction and let idem-relay publish them.

#include <chrono>
#include <cstdint>
#include <expected>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "idem/broker.hpp"
#include "idem/clock.hpp"
#include "idem/result.hpp"

namespace idem {

/// One event to publish, as the business transaction enqueues it.
struct OutboxMessage {
  /// The consumers' dedupe key: stable for this event, e.g. "pay_123/payment.succeeded". 1-256
  /// visible ASCII characters (SPEC §2's rules), unique in the outbox.
  std::string message_id;
  /// Where it goes, if not the sink's default: an AMQP routing key, a stream name; a webhook
  /// sink ignores it. 0-256 characters.
  std::string destination;
  std::string content_type = "application/json";
  MessageHeaders headers;
  std::string body;
  /// The aggregate the event belongs to (a payment id, an order id), empty for none: rows of
  /// one ordering key are published one at a time, in the order their transactions committed,
  /// and the key travels with the message (OutgoingMessage::ordering_key). 1-128 visible ASCII
  /// characters (valid_ordering_key).
  std::string ordering_key;
};

/// A row's state in the outbox.
enum class OutboxState : std::uint8_t {
  pending,  ///< waiting to be published (or to be published again after a failure)
  sent,     ///< the sink confirmed it; deleted after the retention
  dead,     ///< refused by the sink, or failed max_attempts times; kept, with its reason, for an operator
};

/// "pending", "sent", "dead".
std::string_view to_string(OutboxState state);

/// A row as a relay or an operator sees it.
struct OutboxRow {
  std::int64_t id = 0;  ///< enqueue order (per outbox)
  OutboxMessage message;
  OutboxState state = OutboxState::pending;
  TimePoint created{};
  std::uint32_t attempts = 0;         ///< publishes tried so far
  TimePoint next_attempt{};           ///< a pending row is not published before this
  std::string last_error;             ///< why the last publish failed, or why it is dead
  std::optional<TimePoint> sent;      ///< when the sink confirmed it
  /// Why no relay can publish the row as it stands, empty when one can: a message id breaking
  /// SPEC §2's rules or headers that are not all strings, as a foreign writer can insert them
  /// into a SQLite outbox (docs/outbox.md). The headers are then empty. A claim makes such a
  /// row dead with this reason and does not return it; list and get show it.
  std::string unreadable;
  /// The row's place among its ordering key's rows, 0 without a key: larger is later in commit
  /// order (PostgreSQL: 1, 2, ... a key; SQLite: the id, which its one writer takes in commit order).
  std::int64_t key_seq = 0;
};

/// What a relay claims at once.
struct OutboxClaim {
  std::size_t limit = 100;
  TimePoint now{};
  /// While a relay holds rows they are not handed to another relay (PostgreSQL); a relay that
  /// died holding them loses them to the next one after this.
  Millis lease = std::chrono::seconds(30);
  /// The claiming relay's name (host-pid), recorded on the rows it holds.
  std::string owner;
  /// Destinations whose dead rows let the later rows of their ordering key go on ("*": every
  /// destination). Elsewhere a
  /// dead row holds its key's later rows back until an operator retries or drops it (rows of
  /// other keys, and rows without a key, are never held by it).
  std::vector<std::string> dead_rows_pass{};
};

/// How a row's publish went, for OutboxReader::settle.
struct OutboxResult {
  std::int64_t id = 0;
  enum class Kind : std::uint8_t {
    sent,   ///< the sink confirmed it
    retry,     ///< try again at `next_attempt` (attempts + 1, last_error kept)
    dead,      ///< give up: kept as dead with `error`
    postpone,  ///< not tried (it waits behind a failed row, or the sink is away): pending again at
               ///< `next_attempt`, attempts unchanged, `error` kept as last_error
  } kind = Kind::sent;
  std::string error;
  TimePoint next_attempt{};
};

/// What the outbox holds, for metrics and idemctl.
struct OutboxCounts {
  std::uint64_t pending = 0;
  std::uint64_t sent = 0;
  std::uint64_t dead = 0;
  /// created of the oldest pending row; nullopt when none is pending.
  std::optional<TimePoint> oldest_pending;
  /// Ordering keys whose next row is dead: their later rows wait for an operator (retry or drop).
  std::uint64_t held_keys = 0;
  /// created of the oldest row held back that way; nullopt when none is.
  std::optional<TimePoint> oldest_held;
};

/// Which rows OutboxReader::list returns: ordered by id, after `after_id`.
struct OutboxQuery {
  std::optional<OutboxState> state;
  std::int64_t after_id = 0;
  std::size_t limit = 100;
};

/// A relay's and an operator's access to one outbox (SqliteOutbox, PostgresOutbox). Blocking;
/// one thread at a time.
class OutboxReader {
 public:
  virtual ~OutboxReader() = default;

  /// Takes up to `limit` pending rows due by `now`, in id order, for this relay. PostgreSQL:
  /// rows another relay holds are skipped (FOR UPDATE SKIP LOCKED, then a lease on each row).
  /// A row with an ordering key is taken only when every earlier row of its key (key_seq) is
  /// sent, or dead in a destination of `dead_rows_pass`: so at most one row of a key is in
  /// flight, on one relay, and the next waits for its confirm.
  virtual StoreResult<std::vector<OutboxRow>> claim(const OutboxClaim& claim) = 0;

  /// Records how each claimed row's publish went, in one transaction. A row no longer held by
  /// this relay (its lease ran out and another took it) is left as the other relay has it.
  virtual StoreResult<Done> settle(const std::vector<OutboxResult>& results, TimePoint now,
                                   const std::string& owner) = 0;

  /// Deletes up to `limit` sent rows sent before `before`; how many.
  virtual StoreResult<std::size_t> purge_sent(TimePoint before, std::size_t limit) = 0;

  /// Counts rows by state.
  virtual StoreResult<OutboxCounts> count() = 0;

  /// Rows for an operator (idemctl outbox list).
  virtual StoreResult<std::vector<OutboxRow>> list(const OutboxQuery& query) = 0;
  /// One row by id; nullopt when absent.
  virtual StoreResult<std::optional<OutboxRow>> get(std::int64_t id) = 0;
  /// A dead row becomes pending again, due now, its attempts reset (idemctl outbox retry):
  /// true when it was dead.
  virtual StoreResult<bool> retry_dead(std::int64_t id, TimePoint now) = 0;
  /// Deletes a dead row (idemctl outbox drop): true when it was dead.
  virtual StoreResult<bool> drop_dead(std::int64_t id) = 0;

  /// Checks that the database answers (readiness).
  virtual StoreResult<Done> ping() = 0;
};

/// Whether a message can be enqueued: nullopt when it can, else a sentence saying why not
/// (an id breaking SPEC §2's rules, a destination over 256 characters; text that a database or a
/// JSON column cannot hold: invalid UTF-8 or a NUL byte in the destination, the content type or a
/// header; an empty or repeated header name).
std::optional<std::string> outbox_message_problem(const OutboxMessage& message);

/// The `headers` column's form (docs/outbox.md): a JSON object of string values, in the headers'
/// order. Expects headers outbox_message_problem accepts (valid UTF-8).
std::string outbox_headers_to_json(const MessageHeaders& headers);

/// A message outbox_message_problem accepted, with its headers already in the column's form:
/// what a store's enqueue inserts without checking or encoding again. Checking costs about as
/// much as a third of the INSERT, so a service that plans its writes on other threads than the
/// one running the transaction (the payments example: the store's single writer) checks there.
/// Immutable: it stays what was checked.
class CheckedOutboxMessage {
 public:
  /// The message, or the sentence outbox_message_problem gave.
  static std::expected<CheckedOutboxMessage, std::string> check(OutboxMessage message);

  const OutboxMessage& message() const { return message_; }
  /// outbox_headers_to_json(message().headers).
  const std::string& headers_json() const { return headers_json_; }

 private:
  CheckedOutboxMessage(OutboxMessage message, std::string headers_json)
      : message_(std::move(message)), headers_json_(std::move(headers_json)) {}

  OutboxMessage message_;
  std::string headers_json_;
};

/// Reads a `headers` column: the members of a JSON object whose values are all strings, in
/// their order. The error is a sentence saying what is wrong (not JSON, not an object, a value
/// that is not a string).
std::expected<MessageHeaders, std::string> outbox_headers_from_json(std::string_view json);

/// What a store's reader does with a row it read (`row.message.message_id` set): fills the
/// headers from the `headers` column, or sets `row.unreadable` when no relay can publish the row
/// (headers that outbox_headers_from_json refuses, an id breaking SPEC §2's rules).
void read_outbox_headers(OutboxRow& row, std::string_view headers_json);

}  // namespace idem
