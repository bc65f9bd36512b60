#pragma once

// The consume loop (SPEC §10): receive from a broker, decide (process_once or a handler of the
// caller's), act on the outcome: ack, retry with backoff, or dead-letter; one direction, outcomes
// as values. It is what examples/ledger_consumer, examples/notifier and idem-consume run, on
// any MessageSource (brokers/amqp, brokers/redis_streams).
//
// The one rule: a delivery is acknowledged only after its outcome is durable, either its record
// in the store (processed, duplicate) or its copy in the dead-letter queue (the source's
// dead_letter acks only after the broker confirmed the copy). A consumer that dies at any point
// leaves its unacknowledged deliveries to the broker, which delivers them again; the store's
// record makes the second delivery a duplicate.

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <expected>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "idem/broker.hpp"
#include "idem/consumer.hpp"
#include "idem/key_holds.hpp"
#include "idem/latency_histogram.hpp"

namespace idem {

/// What the loop does with one delivery once it has been processed.
struct MessageDisposition {
  enum class Action : std::uint8_t {
    ack,          ///< done with (processed, or processed before): acknowledge it
    retry,        ///< try it again in this process after a delay (handler failed, store down, held elsewhere)
    dead_letter,  ///< move it to the dead-letter queue with `reason` and acknowledge it
  };
  Action action = Action::ack;
  /// dead_letter: one word (`DeadLetterReason::reason`); retry: why, for the log.
  std::string reason;
  /// A sentence for the log and the dead letter: the handler's error, the store's, ...
  std::string detail;
  /// retry: wait at least this long (a handler's Retry-After), else the loop's backoff.
  std::optional<Millis> retry_after;
  /// retry: whether this try counts toward max_attempts. A handler that ran and failed counts;
  /// a message held by another delivery, or a store that could not be reached, does not.
  bool counts_as_attempt = true;

  static MessageDisposition ack_it(std::string reason = {}) { return {Action::ack, std::move(reason), {}, {}, false}; }
  static MessageDisposition retry_it(std::string reason, std::string detail, bool counts, std::optional<Millis> after = {}) {
    return {Action::retry, std::move(reason), std::move(detail), after, counts};
  }
  static MessageDisposition dead_letter_it(std::string reason, std::string detail) {
    return {Action::dead_letter, std::move(reason), std::move(detail), {}, false};
  }
};

/// What a processor is told about the delivery besides the message.
struct DeliveryAttempt {
  /// 1 for the first try of this message known here; counts the broker's earlier deliveries
  /// and this process's earlier failed tries.
  std::uint32_t number = 1;
  /// The last failure's detail, if this is a retry.
  std::string last_error;
};

/// Processes one delivery: blocking, on one of the loop's worker threads. Must not throw
/// (a throw is taken as a failed try with its message).
using DeliveryProcessor = std::function<MessageDisposition(const Delivery&, const DeliveryAttempt&)>;

/// The effect of one message, for a loop that claims and records its messages itself (the
/// ConsumeLoop constructor taking a Consumer): runs once per message id, on a worker, blocking;
/// returns a short result to remember (an id the effect created), or, when it failed, what to do
/// with the delivery: MessageDisposition::retry_it (counted, with the reason "handler_failed"
/// for the metrics) or dead_letter_it. A failure forgets the claim, so the message runs again
/// when it comes back. Must not throw (a throw is a failed, counted try).
using MessageEffect = std::function<std::expected<std::string, MessageDisposition>(const Delivery&, const DeliveryAttempt&)>;

/// One delivery of a batch handed to a BatchProcessor.
struct BatchItem {
  const Delivery& delivery;
  const DeliveryAttempt& attempt;
};

/// Processes deliveries together, blocking, on one of the loop's workers: a receive's deliveries
/// that can run at once come as one batch (a retry, or a key's waiting delivery, alone). Returns
/// one disposition per item, in order. For one business transaction over a batch, with a
/// savepoint per message: process_batch_in_transaction (idem/sqlite_consumer.hpp,
/// idem/postgres_consumer.hpp) and dispositions_of. Must not throw (a throw is a failed, counted
/// try of every item).
using BatchProcessor = std::function<std::vector<MessageDisposition>(const std::vector<BatchItem>&)>;

/// The disposition of a process_once / process_once_in_transaction answer:
///   processed, duplicate                      -> ack
///   handler_failed                            -> retry, counted
///   in_progress, lost, a retryable store error -> retry, not counted (the record decides next time)
///   conflict, invalid_id                      -> dead_letter
///   outcome_unknown                           -> dead_letter "outcome_unknown": parked for an
///                                                operator (idemctl resolve), never run again here
///   a store error that is not retryable       -> retry, counted (a corrupt record is not lost:
///                                                after max_attempts it is dead-lettered)
MessageDisposition disposition_of(const StoreResult<MessageOutcome>& outcome);

/// disposition_of for each answer of a batch (process_batch_in_transaction), in order.
std::vector<MessageDisposition> dispositions_of(const std::vector<StoreResult<MessageOutcome>>& outcomes);

/// Counters of one loop, for /metrics. All monotonic except in_flight.
struct ConsumeStats {
  std::atomic<std::uint64_t> received{0};
  std::atomic<std::uint64_t> processed{0};         ///< acked after a successful try
  std::atomic<std::uint64_t> duplicates{0};        ///< acked because they were processed before
  std::atomic<std::uint64_t> retried{0};           ///< tries scheduled again
  std::atomic<std::uint64_t> dead_lettered{0};
  std::atomic<std::uint64_t> stale{0};             ///< deliveries of a lost connection, left to the broker
  std::atomic<std::uint64_t> broker_errors{0};
  std::atomic<std::int64_t> in_flight{0};          ///< held: received, not yet acked or dead-lettered
  /// ordering = key: deliveries held that wait for an earlier one of their key to be settled.
  std::atomic<std::int64_t> waiting_for_key{0};
  /// How long each try of the processor took.
  LatencyHistogram latency;
  /// Dead letters by reason ("missing_id", "poison", ...), under its own lock.
  std::map<std::string, std::uint64_t> dead_letters_by_reason() const;

  void count_dead_letter(const std::string& reason);

 private:
  mutable std::mutex reasons_mutex_;
  std::map<std::string, std::uint64_t> reasons_;
};

/// Which deliveries the loop runs one after the other.
enum class ConsumeOrdering : std::uint8_t {
  none,  ///< any delivery may run beside any other (up to workers)
  /// Deliveries with the same ordering key (Delivery::ordering_key) run one at a time, in the
  /// order the source delivered them: the next starts once the previous is settled (acked, or
  /// dead-lettered), and a retry of one holds the key's later ones back. Deliveries without a
  /// key, and of different keys, run side by side as with `none`.
  key,
};

/// How the loop runs; defaults suit handlers that take milliseconds to seconds.
struct ConsumeLoopOptions {
  /// Threads running the processor. Deliveries beyond them wait (up to the source's prefetch).
  std::size_t workers = 8;
  /// Most deliveries held at once (received, not yet acked); at most the source's prefetch.
  /// With ordering = key, deliveries waiting for their key count too.
  std::size_t max_in_flight = 64;
  /// ConsumeOrdering.
  ConsumeOrdering ordering = ConsumeOrdering::none;
  /// ordering = key: where keys are held behind a dead letter (idem-consume: a StoreKeyHolds on
  /// its store, unless `dead_letters = "pass"`). When set, a delivery of a key that is finally
  /// dead-lettered holds its key, and the key's later deliveries are dead-lettered behind it
  /// ("held", parked in order) until the parked ones have run again in that order: the operator
  /// replays the key's dead letters once the cause is fixed (the first parked runs; each that is
  /// settled lets the next run), or drops the first (`idemctl consumer holds`). When null, the
  /// key's later deliveries run after a dead letter (the dead-letter queue keeps the one that
  /// failed). Must outlive the loop; called from workers.
  KeyHolds* holds = nullptr;
  /// A message body larger than this is dead-lettered ("too_large") without being processed.
  std::size_t max_message_bytes = 1024 * 1024;
  /// Tries before a failing message is dead-lettered ("poison") with its last error; the
  /// broker's earlier deliveries count too, so a message that kills its consumer each time is
  /// caught as well.
  std::uint32_t max_attempts = 5;
  /// Backoff between tries of one message: doubles from retry_min up to retry_max, with full
  /// jitter (a random delay between half and all of it), or the processor's retry_after.
  Millis retry_min = std::chrono::milliseconds(200);
  Millis retry_max = std::chrono::seconds(30);
  /// On stop(): how long tries already running may take to finish; deliveries not done by then
  /// are left unacknowledged, and the broker delivers them again.
  Millis drain_timeout = std::chrono::seconds(30);
  /// How long one receive waits when nothing is held (bounds how quickly stop() is seen if wake
  /// is lost; normally stop() wakes it at once).
  Millis idle_wait = std::chrono::seconds(1);
  /// Told every delivery's outcome: final ones ("processed", "duplicate", "dead_letter:poison",
  /// "stale", "requeued") on the receiving thread, retries ("retry:handler_failed", ...) on a
  /// worker; so it must be thread-safe. For logs and tests. Optional.
  std::function<void(const Delivery&, std::string_view outcome, std::string_view detail)> on_outcome;
  /// Told about broker trouble (a lost connection, a failed ack), once per event. Optional.
  std::function<void(std::string_view line)> on_warning;
};

/// Runs a DeliveryProcessor over every delivery of a source until stopped.
///
/// Before the processor runs, the loop itself dead-letters what must never be processed: a
/// message without an id ("missing_id"), an id breaking SPEC §2's rules ("invalid_id"), a body
/// over max_message_bytes ("too_large"), and a message the broker has delivered more than
/// max_attempts times ("poison"). Thread-safe: stop() and ready() from any thread.
class ConsumeLoop {
 public:
  ConsumeLoop(MessageSource& source, DeliveryProcessor processor, ConsumeLoopOptions options = {});
  /// The batched form, for an effect outside the store (what process_once does, one round trip
  /// per batch instead of two per message): the deliveries of each receive that can run at once
  /// are claimed in `consumer`'s store with one call (Consumer::claim_many); a retried or a
  /// key's waiting delivery is claimed on its own when it runs; the completions of effects that
  /// finished close together are written with one call (Consumer::complete_many) before their
  /// acks. Outcomes as with process_once (disposition_of). `consumer` must outlive the loop.
  ConsumeLoop(MessageSource& source, Consumer& consumer, MessageEffect effect, ConsumeLoopOptions options = {});
  /// The batch processor's form: each receive's deliveries that can run at once go to
  /// `processor` together, on one worker (one business transaction for all of them, say); a
  /// retried delivery, or a key's waiting one, goes alone. Other receives' batches run on other
  /// workers meanwhile.
  ConsumeLoop(MessageSource& source, BatchProcessor processor, ConsumeLoopOptions options = {});
  ~ConsumeLoop();
  ConsumeLoop(const ConsumeLoop&) = delete;
  ConsumeLoop& operator=(const ConsumeLoop&) = delete;

  /// Receives and processes until stop(); then drains (see drain_timeout) and returns. Blocks the
  /// calling thread, which is the only one that touches the source. Returns an error only when the
  /// broker refused us (credentials, permissions: an operator must act); a broker that cannot be
  /// reached is retried, with ready() false meanwhile.
  BrokerResult<Done> run();

  /// Asks run() to stop receiving, finish what is running and return. Any thread; not from a
  /// signal handler (use a thread that waits for signals).
  void stop();

  /// Whether the last receive reached the broker (for /readyz).
  bool ready() const { return ready_.load(std::memory_order_relaxed); }

  /// The loop's counters.
  const ConsumeStats& stats() const { return stats_; }

  /// After run(): whether every delivery held was settled within drain_timeout. When not, some
  /// processor is still running: the destructor waits for it, so a process that must exit now
  /// should exit without destroying the loop (the broker redelivers what was not acked).
  bool drained() const { return drained_.load(); }

 private:
  struct Task;
  // Tasks with their final dispositions, to be settled by the receiving thread.
  using Settled = std::vector<std::pair<std::unique_ptr<Task>, MessageDisposition>>;
  // Effects whose moving average is below this are "cheap": a worker takes up to kCheapShare
  // due tasks at once (its chunk).
  static constexpr std::int64_t kCheapEffectNs = 50'000;
  static constexpr std::size_t kCheapShare = 16;
  // A chunk whose running task has taken longer than this gives the rest back (reclaim_stalled).
  static constexpr std::chrono::milliseconds kStalledAfter{1};
  // A worker's tasks taken with the one it runs, not started yet; under mutex_.
  struct Chunk {
    std::deque<std::unique_ptr<Task>> rest;
    std::chrono::steady_clock::time_point started{};  // when the running one started
  };
  void worker(std::size_t id);
  // Runs `task`, then the rest of worker `id`'s chunk one by one, and hands the finished ones
  // over together; how many it ran.
  std::size_t run_chunk(std::size_t id, std::unique_ptr<Task> task);
  // Puts a chunk's tasks back among the waiting (they no longer count as running); how many.
  std::size_t give_back_locked(Chunk& chunk);
  // The receiving thread's watch: a chunk whose running task stalled (a cheap effect that hangs
  // this once) gives the rest back to other workers, so that it holds none of them up for long.
  void reclaim_stalled();
  // The batched form: claims a receive's group with one store call, then lets workers run it.
  void start_group(std::unique_ptr<Task> group);
  void wake_workers(std::size_t tasks);
  bool effects_are_cheap() const;
  void observe_effect(std::chrono::steady_clock::duration took);
  void handle_received(std::vector<Delivery> deliveries);
  // The receiving thread's side: acts on finished tasks (ack, dead-letter), batched.
  void settle_finished();
  std::optional<MessageDisposition> screen(const Delivery& d) const;
  // The batched form: claims `tasks` with one store call; each gets its claim or its outcome.
  void claim_batch(std::vector<std::unique_ptr<Task>>& tasks);
  // A claim's answer kept on its task: the claim to run with, or what it found instead.
  static void take_claim(Task& task, StoreResult<std::variant<Consumer::Held, MessageOutcome>> answer);
  // The batched form's processor: claim (unless claimed in a batch), run the effect, leave the
  // completion for settle_finished (or write it now when the key's hold must follow it).
  MessageDisposition run_effect(Task& task);
  // The completion of a task whose effect ran: written by complete_batch with the others, or now
  // when its key's hold moves on with it; kept on the task when the store did not take it.
  MessageDisposition record_completion(Task& task);
  // Forgets a task's unused claim (it will not run here), so that its next delivery runs at once.
  void release_claim(Task& task);
  // Runs one task by whichever form the loop has.
  MessageDisposition process_one(Task& task);
  // The batch processor's form: runs a receive's group (those whose key is not held) together.
  void run_group(std::unique_ptr<Task> group);
  // A try's disposition: a retry is scheduled (or, out of tries, becomes a dead letter); a final
  // one is settled once its key's hold is recorded.
  void conclude(std::unique_ptr<Task> task, MessageDisposition disposition, Settled& finals);
  // The batched form: writes the completions of finished tasks with one store call; a lost or
  // failed one becomes a retry.
  void complete_batch(Settled& done);
  // ordering = key with holds: before a keyed task runs, whether its key is held (then it is
  // parked behind the held one: a "held" dead letter, or a retry when the store cannot say).
  std::optional<MessageDisposition> check_hold(Task& task);
  // After a keyed task's final disposition, before it is settled: a dead letter parks it (its
  // key is held from then on); a held key's first parked delivery, processed, lets the next
  // parked one run. Why not, when the store failed (the task is tried again later).
  std::optional<std::string> record_hold(Task& task, const MessageDisposition& disposition);
  // Hands final dispositions to the receiving thread (and wakes it when due).
  void finish_many(Settled& finals);
  void tell(const Delivery& d, std::string_view outcome, std::string_view detail) const;
  void schedule(std::unique_ptr<Task> task, std::chrono::steady_clock::time_point at);
  // ordering = key: a settled task's key lets its next delivery run, or go back to the broker
  // when stopping, or when it came on `stale_connection` (its predecessor was not processed and
  // comes again: it must not be overtaken). Under mutex_; how many workers to wake.
  std::size_t release_key_locked(const std::string& key, std::optional<std::uint64_t> stale_connection);
  std::size_t settle_batch() const;  // finished tasks that wake a receiving thread waiting for room
  Millis backoff(std::uint32_t failures);

  MessageSource& source_;
  DeliveryProcessor processor_;
  Consumer* consumer_ = nullptr;  // the batched form
  MessageEffect effect_;
  BatchProcessor batch_processor_;  // the batch processor's form
  ConsumeLoopOptions options_;
  ConsumeStats stats_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> ready_{false};
  std::atomic<bool> drained_{false};
  // The processor's or effect's moving-average run time; starts slow, so that nothing is taken
  // in shares until effects are seen to be cheap.
  std::atomic<std::int64_t> effect_ns_{1'000'000};

  std::mutex mutex_;
  std::condition_variable work_ready_;  // workers: a task is waiting, or they must stop
  std::condition_variable settled_;     // the receiving thread: a task finished, or stop()
  // Tasks waiting to run, soonest first; tasks whose processor returned, for the receiving thread.
  std::vector<std::unique_ptr<Task>> waiting_;
  Settled finished_;
  std::size_t held_ = 0;     // deliveries received and not yet settled
  std::size_t running_ = 0;  // tasks a worker is processing now
  // ordering = key: for each key with a delivery waiting, running or unsettled, the key's later
  // deliveries, in delivery order.
  std::unordered_map<std::string, std::deque<std::unique_ptr<Task>>> key_queues_;
  bool workers_stop_ = false;
  std::unique_ptr<Chunk[]> chunks_;  // one per worker
  std::vector<std::thread> workers_;
};

/// Whether a message id is usable as a dedupe key (SPEC §2's rules for ids: 1-256 visible ASCII
/// characters); nullopt when it is, else a sentence saying why not.
std::optional<std::string> message_id_problem(std::string_view id);

}  // namespace idem
