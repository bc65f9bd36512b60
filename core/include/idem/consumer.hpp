#pragma once

// Message consumers (SPEC §10): at-least-once queues (Kafka, RabbitMQ, SQS, ...) deliver some
// messages twice; process_once runs a message's handler once per message id, on any store.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <expected>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "idem/clock.hpp"
#include "idem/engine.hpp"
#include "idem/result.hpp"
#include "idem/store.hpp"

namespace idem {

/// How a Consumer behaves; defaults suit a queue that redelivers within hours.
struct ConsumerOptions {
  /// The consumer's name (its consumer group, or the service and queue): every message id is
  /// scoped by it, so two consumers of one topic each process every message once. 1-128
  /// visible ASCII characters. Its records are stored under the tenant "consumer NAME", which no
  /// HTTP tenant can name (those have no spaces), so requests through the gateway can never
  /// touch a consumer's records in a shared store.
  std::string name;
  /// How long a consumer holds a message while its handler runs. Another delivery of the same
  /// message meanwhile gets MessageStatus::in_progress. Make it longer than the handler's worst
  /// case: when it runs out, another delivery takes the message over (see on_lease_expiry).
  Millis lease = std::chrono::minutes(5);
  /// How long a processed message is remembered: longer than the queue can redeliver (its
  /// retention, a dead-letter replay window).
  Millis retention = std::chrono::days(7);
  /// A message whose holder's lease ran out (the consumer crashed or hung): process it again
  /// (`reexecute`), or answer MessageStatus::outcome_unknown until an operator resolves it with
  /// `idemctl resolve` (`unknown`). With the transactional forms (SqliteStore, PostgresStore)
  /// taking over is always safe: the crashed holder's effect was never committed.
  LeaseExpiry on_lease_expiry = LeaseExpiry::reexecute;
  /// "now" for leases and retention; the system clock when null. Must outlive the consumer.
  const Clock* clock = nullptr;
};

/// What process_once did with one delivery of a message.
enum class MessageStatus : std::uint8_t {
  processed,        ///< this call ran the handler and recorded the message as processed: ack it
  duplicate,        ///< processed before (by any consumer of this name): the handler did not run; ack it
  in_progress,      ///< another delivery holds it right now: the handler did not run; let it come back later
  outcome_unknown,  ///< its holder vanished and on_lease_expiry is `unknown`: an operator decides
  conflict,         ///< processed or held with another payload under this id (a producer reusing
                    ///< ids): the handler did not run; dead-letter it
  handler_failed,   ///< the handler ran and reported a failure: nothing is recorded, so the next
                    ///< delivery runs it again
  lost,             ///< the handler ran, but the lease ran out first and another delivery took the
                    ///< message over; transactional forms rolled the effect back
  invalid_id,       ///< the message id breaks the rules below: nothing was claimed or run; dead-letter it
};

/// "processed", "duplicate", ... (logs, metrics).
std::string_view to_string(MessageStatus status);

/// The answer to process_once.
struct MessageOutcome {
  MessageStatus status = MessageStatus::processed;
  /// processed: what the handler returned; duplicate: what it returned when the message was
  /// processed (empty for the transactional forms, whose effect lives in the application's tables).
  std::string result;
  /// A sentence for the log: the handler's error, why the message was lost, ...
  std::string detail;
  /// Whether the queue may forget this delivery (processed, duplicate); conflict, invalid_id
  /// and outcome_unknown want a person, the others another delivery.
  bool ack() const { return status == MessageStatus::processed || status == MessageStatus::duplicate; }
};

/// A message handler: performs the effect and returns a short result to remember (an id the
/// effect created), or an error message. It may throw; process_once then forgets the claim and
/// rethrows, so the next delivery runs it again.
using MessageHandler = std::move_only_function<std::expected<std::string, std::string>()>;

/// Processes each message id once per consumer name, on any Store (SPEC §10).
///
/// A delivery first claims (consumer, message id) in the store, exactly like a request with an
/// Idempotency-Key: one delivery wins and runs the handler, concurrent ones get in_progress,
/// later ones duplicate. After the handler the record is completed, with its result.
///
/// With a store that keeps the application's data too (SqliteStore, PostgresStore), use
/// process_once_in_transaction (idem/sqlite_consumer.hpp, idem/postgres_consumer.hpp): the
/// handler's writes and the "processed" record then commit in one transaction, so a crash at
/// any point leaves either both or neither. With process_once the handler's effect is outside
/// the store: a consumer that dies after the effect and before the record is written leaves the
/// message in progress; once the lease runs out, on_lease_expiry decides.
///
/// Blocking: call it from a consumer's worker threads, never from an event loop or a store
/// callback. Thread-safe; one Consumer serves any number of threads.
class Consumer {
 public:
  /// Fails (a sentence naming the problem) for a name that is not 1-128 visible ASCII
  /// characters, or a lease or retention that is not positive.
  static std::expected<Consumer, std::string> create(Store& store, ConsumerOptions options);

  /// Runs `handler` unless this message id was processed, or is being processed, already.
  /// `message_id`: the queue's id for the message (Kafka: topic/partition/offset or a producer
  /// id; SQS: MessageId; RabbitMQ: message-id), 1-256 visible ASCII characters (encode others,
  /// e.g. in hex; any other id is MessageStatus::invalid_id). `payload`: the message's bytes, or
  /// anything that identifies its content; the same id with another payload is a conflict.
  /// A store error fails the call either before the handler runs (it did not run) or after it
  /// (it ran, and the record is left as the store has it: in progress until its lease runs
  /// out, or completed if the failed completion reached the store after all).
  StoreResult<MessageOutcome> process_once(std::string_view message_id, std::string_view payload,
                                           MessageHandler handler);

  /// The building blocks of process_once, for the transactional forms.
  /// A held message: run the effect, then record it with `completion`.
  struct Held {
    Fence fence;
    TimePoint lease_expires{};
    ClaimKind kind = ClaimKind::fresh;
    /// Which claim of the message this is (Record::attempt): 1 the first time, one more for each
    /// takeover of a holder whose lease ran out. A handler failure forgets the claim (release),
    /// so the delivery after it starts at 1 again.
    std::uint32_t attempt = 1;
  };
  /// Claims the message: Held to run it, or the outcome that says why not.
  StoreResult<std::variant<Held, MessageOutcome>> claim(std::string_view message_id, std::string_view payload);
  /// One message to claim with claim_many.
  struct Message {
    std::string_view id;
    std::string_view payload;
  };
  /// Claims many messages in one store call (Store::claim_many): one answer per message, in
  /// order, each what claim() would have answered (an id claimed twice in one batch: the second
  /// finds the first's claim, in_progress).
  std::vector<StoreResult<std::variant<Held, MessageOutcome>>> claim_many(const std::vector<Message>& messages);
  /// The completion that records a held message as processed, remembering `result`.
  CompleteRequest completion(const Held& held, std::string result) const;
  /// Records completions: one store call for all of them (Store::complete_many), one answer each.
  BatchResults<FenceStatus> complete_many(std::vector<CompleteRequest> completions);
  /// Forgets a held message whose handler failed, so the next delivery runs it again.
  StoreResult<FenceStatus> release(const Held& held);
  /// The transactional forms' common path: claims, then calls `complete(request, declined)`,
  /// which must run the store's complete_in_transaction with the application's work, setting
  /// `declined` when that work returned false or threw. Declined: the claim is forgotten
  /// (handler_failed). A store error that is not in doubt: the transaction did not commit, the
  /// claim is forgotten and the error returned. In doubt: the record stays as it is (both or
  /// neither committed), and the error is returned.
  StoreResult<MessageOutcome> process_once_with(
      std::string_view message_id, std::string_view payload,
      std::move_only_function<StoreResult<FenceStatus>(CompleteRequest, bool& declined)> complete);
  /// The batch transactional forms' common path: claims `messages` with one claim_many, then, if
  /// any is held, calls `complete` once with the held ones' completions and, for each, its index
  /// in `messages`; `complete` must run the store's complete_many_in_transaction with the
  /// application's work and return its answers, one per completion. One outcome per message, in
  /// order, each what process_once_with gives for its case: declined (handler_failed) and failed
  /// items not in doubt have their claims forgotten, with one release_many for all of them.
  std::vector<StoreResult<MessageOutcome>> process_batch_with(
      const std::vector<Message>& messages,
      std::move_only_function<BatchResults<WorkResult>(std::vector<CompleteRequest> completions,
                                                       const std::vector<std::size_t>& indexes)>
          complete);
  /// The store this consumer claims in.
  const Store& store() const { return *store_; }
  /// The tenant this consumer's records carry: "consumer NAME".
  const std::string& tenant() const { return tenant_; }
  const ConsumerOptions& options() const { return options_; }

 private:
  Consumer(Store& store, ConsumerOptions options);
  TimePoint now() const;
  // The claim of one message, and what its store answer means.
  ClaimRequest claim_request(std::string_view message_id, std::string_view payload) const;
  static std::variant<Held, MessageOutcome> claim_answer(ClaimResult claimed, const Fence& fence,
                                                         TimePoint lease_expires);
  // Forgets the claim of a message whose handler failed; handler_failed with `detail`.
  MessageOutcome handler_failed(const Held& held, std::string detail);

  Store* store_;
  ConsumerOptions options_;
  std::string tenant_;
};

namespace detail {
/// process_once_in_transaction for any store with a complete_in_transaction(CompleteRequest,
/// Work, ...) whose Work is `bool(Handle, std::string& error)` (SqliteStore, PostgresStore).
template <class TransactionalStore, class Work>
StoreResult<MessageOutcome> process_once_in_transaction(Consumer& consumer, TransactionalStore& store,
                                                        std::string_view message_id, std::string_view payload,
                                                        Work& work) {
  if (&consumer.store() != static_cast<const Store*>(&store)) {
    return std::unexpected(StoreError{
        StoreErrc::internal, "process_once_in_transaction: the consumer was created on another store", false});
  }
  return consumer.process_once_with(message_id, payload, [&](CompleteRequest request, bool& declined) {
    return store.complete_in_transaction(std::move(request), [&](auto&& handle, std::string& error) {
      declined = true;  // until work returns true; also when it throws
      const bool ok = work(std::forward<decltype(handle)>(handle), error);
      declined = !ok;
      return ok;
    });
  });
}

/// process_batch_in_transaction for any store with a complete_many_in_transaction taking Items
/// of {CompleteRequest, Work} whose Work is `bool(Handle, std::string& error)` (SqliteStore,
/// PostgresStore). `work` is `bool(std::size_t index, Handle, std::string& error)`, index into
/// `messages`; it is called on the store's thread while this call waits.
template <class Item, class TransactionalStore, class BatchWork>
std::vector<StoreResult<MessageOutcome>> process_batch_in_transaction(Consumer& consumer, TransactionalStore& store,
                                                                      const std::vector<Consumer::Message>& messages,
                                                                      BatchWork& work) {
  if (&consumer.store() != static_cast<const Store*>(&store)) {
    return std::vector<StoreResult<MessageOutcome>>(
        messages.size(), std::unexpected(StoreError{StoreErrc::internal,
                                                    "process_batch_in_transaction: the consumer was created on another store",
                                                    false}));
  }
  return consumer.process_batch_with(
      messages, [&](std::vector<CompleteRequest> completions, const std::vector<std::size_t>& indexes) {
        std::vector<Item> items;
        items.reserve(completions.size());
        for (std::size_t j = 0; j < completions.size(); ++j) {
          items.push_back(Item{std::move(completions[j]), [&work, index = indexes[j]](auto&& handle, std::string& error) {
                                 return work(index, std::forward<decltype(handle)>(handle), error);
                               }});
        }
        return store.complete_many_in_transaction(std::move(items));
      });
}
}  // namespace detail

}  // namespace idem
