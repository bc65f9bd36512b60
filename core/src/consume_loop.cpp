#include "idem/consume_loop.hpp"

#include <algorithm>
#include <exception>
#include <random>

namespace idem {
namespace {

using Steady = std::chrono::steady_clock;

constexpr std::size_t kMaxMessageId = 256;

std::string attempts_text(std::uint32_t n) { return std::to_string(n) + (n == 1 ? " try" : " tries"); }

}  // namespace

std::optional<std::string> message_id_problem(std::string_view id) {
  if (id.empty()) return "the message id is empty";
  if (id.size() > kMaxMessageId) return "the message id is longer than " + std::to_string(kMaxMessageId) + " characters";
  if (!all_visible_ascii(id)) return "the message id has a character that is not visible ASCII (encode such ids, e.g. in hex)";
  return std::nullopt;
}

MessageDisposition disposition_of(const StoreResult<MessageOutcome>& outcome) {
  if (!outcome) {
    const StoreError& e = outcome.error();
    std::string detail = "store " + std::string(to_string(e.code)) + ": " + e.message;
    return MessageDisposition::retry_it("store_error", std::move(detail), /*counts=*/!e.retryable());
  }
  switch (outcome->status) {
    case MessageStatus::processed:
      return MessageDisposition::ack_it("processed");
    case MessageStatus::duplicate:
      return MessageDisposition::ack_it("duplicate");
    case MessageStatus::handler_failed:
      return MessageDisposition::retry_it("handler_failed", outcome->detail, /*counts=*/true);
    case MessageStatus::in_progress:
    case MessageStatus::lost:
      return MessageDisposition::retry_it(std::string(to_string(outcome->status)), outcome->detail, /*counts=*/false);
    case MessageStatus::conflict:
      return MessageDisposition::dead_letter_it("conflict", outcome->detail);
    case MessageStatus::invalid_id:
      return MessageDisposition::dead_letter_it("invalid_id", outcome->detail);
    case MessageStatus::outcome_unknown:
      return MessageDisposition::dead_letter_it("outcome_unknown", outcome->detail);
  }
  return MessageDisposition::retry_it("internal", "unknown message status", true);
}

std::vector<MessageDisposition> dispositions_of(const std::vector<StoreResult<MessageOutcome>>& outcomes) {
  std::vector<MessageDisposition> dispositions;
  dispositions.reserve(outcomes.size());
  for (const auto& outcome : outcomes) dispositions.push_back(disposition_of(outcome));
  return dispositions;
}

// ---------------------------------------------------------------------------------------------
// ConsumeStats

void ConsumeStats::count_dead_letter(const std::string& reason) {
  dead_lettered.fetch_add(1, std::memory_order_relaxed);
  const std::lock_guard lock(reasons_mutex_);
  ++reasons_[reason];
}

std::map<std::string, std::uint64_t> ConsumeStats::dead_letters_by_reason() const {
  const std::lock_guard lock(reasons_mutex_);
  return reasons_;
}

// ---------------------------------------------------------------------------------------------
// ConsumeLoop

struct ConsumeLoop::Task {
  Delivery delivery;
  DeliveryAttempt attempt;
  std::uint32_t tries = 0;     // processor runs so far, counted or not (for the backoff)
  std::uint32_t failures = 0;  // counted failures so far in this process
  Steady::time_point ready_at{};
  // A dead letter that could not be written yet: written again when the task comes round,
  // without running the processor again.
  std::optional<MessageDisposition> pending;
  // Set when the loop stops before this task ran again: hand it back to the broker.
  bool requeue = false;
  // ordering = key, and the delivery has a key: it holds the key from when it runs until it is
  // settled (key_queues_).
  bool keyed = false;
  // With holds: its key is held and it is the first parked delivery (its dead letter replayed):
  // it runs, and once settled the next parked one may.
  bool first_parked = false;
  // The batched form: this try's claim (taken with its batch at receipt, or by the worker), or
  // what the claim found instead; the completion of an effect that ran, for settle_finished.
  std::optional<Consumer::Held> held;
  std::optional<StoreResult<MessageOutcome>> found;
  // Also kept when the store did not take it (down, timed out): the effect ran, so the next try
  // writes the same completion again, with the same claim's fence, and never runs the effect
  // again (claiming again would meet its own claim in progress and wait out the lease).
  std::optional<CompleteRequest> completion;
  // The batch processor's form: a receive's deliveries that run together (this task is only
  // their container: it holds no delivery of its own).
  std::vector<std::unique_ptr<Task>> group;
};

ConsumeLoop::ConsumeLoop(MessageSource& source, DeliveryProcessor processor, ConsumeLoopOptions options)
    : source_(source), processor_(std::move(processor)), options_(std::move(options)) {
  options_.workers = std::max<std::size_t>(options_.workers, 1);
  options_.max_in_flight = std::max<std::size_t>(options_.max_in_flight, 1);
  options_.max_attempts = std::max<std::uint32_t>(options_.max_attempts, 1);
}

ConsumeLoop::ConsumeLoop(MessageSource& source, Consumer& consumer, MessageEffect effect, ConsumeLoopOptions options)
    : ConsumeLoop(source, DeliveryProcessor{}, std::move(options)) {
  consumer_ = &consumer;
  effect_ = std::move(effect);
}

ConsumeLoop::ConsumeLoop(MessageSource& source, BatchProcessor processor, ConsumeLoopOptions options)
    : ConsumeLoop(source, DeliveryProcessor{}, std::move(options)) {
  batch_processor_ = std::move(processor);
}

ConsumeLoop::~ConsumeLoop() {
  {
    const std::lock_guard lock(mutex_);
    workers_stop_ = true;
  }
  work_ready_.notify_all();
  for (auto& t : workers_) {
    if (t.joinable()) t.join();
  }
}

void ConsumeLoop::stop() {
  stopping_.store(true);
  {
    const std::lock_guard lock(mutex_);  // so a receiving thread about to wait sees it
  }
  settled_.notify_all();
  work_ready_.notify_all();
  source_.wake();
}

void ConsumeLoop::tell(const Delivery& d, std::string_view outcome, std::string_view detail) const {
  if (options_.on_outcome) options_.on_outcome(d, outcome, detail);
}

Millis ConsumeLoop::backoff(std::uint32_t tries) {
  thread_local std::minstd_rand random{std::random_device{}()};
  Millis base = options_.retry_min;
  for (std::uint32_t i = 1; i < tries && base < options_.retry_max; ++i) base *= 2;
  base = std::min(base, options_.retry_max);
  std::uniform_int_distribution<std::int64_t> jitter(base.count() / 2, std::max<std::int64_t>(base.count(), 1));
  return Millis{jitter(random)};
}

std::optional<MessageDisposition> ConsumeLoop::screen(const Delivery& d) const {
  if (!d.has_message_id) {
    return MessageDisposition::dead_letter_it("missing_id",
                                       "the message has no message id, so it cannot be processed once; nothing was run");
  }
  if (auto problem = message_id_problem(d.message_id)) {
    return MessageDisposition::dead_letter_it("invalid_id", *problem + "; nothing was run");
  }
  if (d.body.size() > options_.max_message_bytes) {
    return MessageDisposition::dead_letter_it("too_large", "the message body is " + std::to_string(d.body.size()) +
                                                        " bytes, over the limit of " +
                                                        std::to_string(options_.max_message_bytes) + "; nothing was run");
  }
  if (d.delivery_count > options_.max_attempts) {
    return MessageDisposition::dead_letter_it(
        "poison", "the broker delivered this message " + std::to_string(d.delivery_count) + " times, more than the " +
                      attempts_text(options_.max_attempts) +
                      " allowed (a consumer may have died processing it each time); it was not run again");
  }
  return std::nullopt;
}

std::optional<MessageDisposition> ConsumeLoop::check_hold(Task& task) {
  if (!task.keyed || options_.holds == nullptr) return std::nullopt;
  const Delivery& d = task.delivery;
  auto parked = options_.holds->parked(d.ordering_key);
  if (!parked) {
    return MessageDisposition::retry_it("store_error",
                                        "reading whether ordering key " + d.ordering_key + " is held failed: " +
                                            parked.error().message,
                                        /*counts=*/false);
  }
  task.first_parked = !parked->empty() && parked->front() == d.message_id;
  if (parked->empty() || task.first_parked) return std::nullopt;  // not held, or its turn has come
  if (std::find(parked->begin(), parked->end(), d.message_id) == parked->end()) {
    if (auto added = options_.holds->park(d.ordering_key, d.message_id); !added) {
      return MessageDisposition::retry_it("store_error",
                                          "parking the message behind held ordering key " + d.ordering_key +
                                              " failed: " + added.error().message,
                                          /*counts=*/false);
    }
  }
  return MessageDisposition::dead_letter_it(
      "held", "ordering key " + d.ordering_key + " is held behind message " + parked->front() +
                  ", which was dead-lettered: this one waits behind it in the dead-letter queue, not run. Once the "
                  "cause is fixed, replay the key's dead letters in order (or drop " +
                  parked->front() + " with idemctl consumer holds drop)");
}

std::optional<std::string> ConsumeLoop::record_hold(Task& task, const MessageDisposition& disposition) {
  if (!task.keyed || options_.holds == nullptr) return std::nullopt;
  const Delivery& d = task.delivery;
  if (disposition.action == MessageDisposition::Action::dead_letter && disposition.reason != "held") {
    if (auto added = options_.holds->park(d.ordering_key, d.message_id); !added) {
      return "holding ordering key " + d.ordering_key + " behind this dead letter failed: " + added.error().message;
    }
  } else if (disposition.action == MessageDisposition::Action::ack && task.first_parked) {
    if (auto removed = options_.holds->unpark_first(d.ordering_key, d.message_id); !removed) {
      return "letting the next parked message of ordering key " + d.ordering_key +
             " run failed: " + removed.error().message;
    }
  }
  return std::nullopt;
}

namespace {

// What a completion's answer makes of a delivery whose effect happened.
MessageDisposition completed(const StoreResult<FenceStatus>& answer) {
  if (!answer) {
    return MessageDisposition::retry_it("store_error",
                                        "recording the message failed after its effect: store " +
                                            std::string(to_string(answer.error().code)) + ": " + answer.error().message +
                                            " (the record is written again; the effect does not run again)",
                                        /*counts=*/false);
  }
  if (*answer == FenceStatus::lost) {
    return MessageDisposition::retry_it("lost",
                                        "the effect ran, but the lease ran out and another delivery took the message "
                                        "over before it was recorded (make the consumer's lease longer than its "
                                        "effect's worst case)",
                                        /*counts=*/false);
  }
  return MessageDisposition::ack_it("processed");
}

}  // namespace

void ConsumeLoop::claim_batch(std::vector<std::unique_ptr<Task>>& tasks) {
  std::vector<Consumer::Message> messages;
  messages.reserve(tasks.size());
  for (const auto& task : tasks) messages.push_back({task->delivery.message_id, task->delivery.body});
  auto answers = consumer_->claim_many(messages);
  for (std::size_t i = 0; i < tasks.size(); ++i) take_claim(*tasks[i], std::move(answers[i]));
}

void ConsumeLoop::take_claim(Task& task, StoreResult<std::variant<Consumer::Held, MessageOutcome>> answer) {
  if (!answer) {
    task.found = std::unexpected(std::move(answer.error()));
  } else if (auto* held = std::get_if<Consumer::Held>(&*answer)) {
    task.held = *held;
  } else {
    task.found = std::get<MessageOutcome>(std::move(*answer));
  }
}

void ConsumeLoop::release_claim(Task& task) {
  task.found.reset();
  if (!task.held) return;
  (void)consumer_->release(*task.held);  // best effort: if it fails, the lease runs out instead
  task.held.reset();
}

MessageDisposition ConsumeLoop::run_effect(Task& task) {
  const Delivery& d = task.delivery;
  if (!task.held && !task.found) take_claim(task, consumer_->claim(d.message_id, d.body));
  if (task.found) {
    const StoreResult<MessageOutcome> found = std::move(*task.found);
    task.found.reset();
    return disposition_of(found);
  }
  const Consumer::Held held = *task.held;
  task.held.reset();
  std::expected<std::string, MessageDisposition> ran;
  try {
    ran = effect_(d, task.attempt);
  } catch (const std::exception& e) {
    ran = std::unexpected(MessageDisposition::retry_it("handler_failed", std::string("the effect threw: ") + e.what(), true));
  } catch (...) {
    ran = std::unexpected(MessageDisposition::retry_it("handler_failed", "the effect threw", true));
  }
  if (!ran) {
    MessageDisposition failed = std::move(ran.error());
    if (auto released = consumer_->release(held); !released) {
      failed.detail += " (forgetting the claim failed: " + released.error().message +
                       "; the message stays in progress until its lease runs out)";
    }
    return failed;
  }
  task.completion = consumer_->completion(held, std::move(*ran));
  return record_completion(task);
}

MessageDisposition ConsumeLoop::record_completion(Task& task) {
  // Its key's hold moves on as soon as this is settled: record it now, not with a batch.
  if (!task.first_parked) return MessageDisposition::ack_it("processed");  // complete_batch writes it
  std::vector<CompleteRequest> one{*task.completion};
  auto answers = consumer_->complete_many(std::move(one));
  if (answers.front() || answers.front().error().code == StoreErrc::internal) task.completion.reset();
  return completed(answers.front());
}

void ConsumeLoop::complete_batch(Settled& done) {
  std::vector<CompleteRequest> requests;
  std::vector<std::size_t> which;
  for (std::size_t i = 0; i < done.size(); ++i) {
    Task& task = *done[i].first;
    if (!task.completion) continue;
    if (done[i].second.action == MessageDisposition::Action::ack) {
      requests.push_back(*task.completion);  // a copy: kept on the task until the store took it
      which.push_back(i);
    } else {
      task.completion.reset();
    }
  }
  if (requests.empty()) return;
  auto answers = consumer_->complete_many(std::move(requests));
  for (std::size_t j = 0; j < which.size(); ++j) {
    const StoreResult<FenceStatus> answer =
        j < answers.size() ? std::move(answers[j])
                           : std::unexpected(StoreError{StoreErrc::internal, "the store answered fewer completions than it was asked", false});
    Task& task = *done[which[j]].first;
    // Taken, or fenced out (another delivery took the message over): nothing to write again. An
    // internal error (a store that answered nonsense) claims afresh rather than loop on it.
    if (answer || answer.error().code == StoreErrc::internal) task.completion.reset();
    done[which[j]].second = completed(answer);
  }
}

void ConsumeLoop::handle_received(std::vector<Delivery> deliveries) {
  const auto now = Steady::now();
  std::size_t to_run = 0;
  std::vector<std::unique_ptr<Task>> to_claim;  // the batched form: what runs at once, claimed first
  {
    const std::lock_guard lock(mutex_);
    for (Delivery& d : deliveries) {
      stats_.received.fetch_add(1, std::memory_order_relaxed);
      stats_.in_flight.fetch_add(1, std::memory_order_relaxed);
      ++held_;
      auto task = std::make_unique<Task>();
      task->attempt.number = std::max<std::uint32_t>(d.delivery_count, 1);
      task->delivery = std::move(d);
      task->ready_at = now;
      const bool keyed = options_.ordering == ConsumeOrdering::key && !task->delivery.ordering_key.empty();
      if (auto screened = screen(task->delivery)) {
        // With holds, a delivery refused before it runs takes its turn in its key like any other
        // (when it has an id to be parked by), so that its dead letter holds the key in order.
        if (!keyed || options_.holds == nullptr || !task->delivery.has_message_id ||
            message_id_problem(task->delivery.message_id)) {
          finished_.emplace_back(std::move(task), std::move(*screened));
          continue;
        }
        task->pending = std::move(*screened);
      }
      if (keyed) {
        task->keyed = true;
        auto [queue, first] = key_queues_.try_emplace(task->delivery.ordering_key);
        if (!first) {  // an earlier delivery of the key is not settled yet: this one waits for it
          stats_.waiting_for_key.fetch_add(1, std::memory_order_relaxed);
          queue->second.push_back(std::move(task));
          continue;
        }
      }
      if ((consumer_ != nullptr || batch_processor_) && !task->pending) {
        to_claim.push_back(std::move(task));
        continue;
      }
      waiting_.push_back(std::move(task));
      ++to_run;
    }
  }
  if (!to_claim.empty()) {
    // One task for the lot. A worker claims them with one store call (the batched form) and
    // runs them, or hands them to the batch processor together: the store's round trip is not
    // on this thread, which every delivery passes through.
    auto group = std::make_unique<Task>();
    group->ready_at = now;
    group->group = std::move(to_claim);
    const std::lock_guard lock(mutex_);
    waiting_.push_back(std::move(group));
    to_run += 1;
  }
  wake_workers(to_run);
}

void ConsumeLoop::wake_workers(std::size_t tasks) {
  // As many workers as there are new tasks: waking all eight for one message only has seven go
  // back to sleep.
  if (tasks >= options_.workers) {
    work_ready_.notify_all();
  } else {
    for (std::size_t i = 0; i < tasks; ++i) work_ready_.notify_one();
  }
}

std::size_t ConsumeLoop::release_key_locked(const std::string& key, std::optional<std::uint64_t> stale_connection) {
  auto queue = key_queues_.find(key);
  if (queue == key_queues_.end()) return 0;
  if (queue->second.empty()) {
    key_queues_.erase(queue);
    return 0;
  }
  std::unique_ptr<Task> next = std::move(queue->second.front());
  queue->second.pop_front();
  stats_.waiting_for_key.fetch_sub(1, std::memory_order_relaxed);
  if (stopping_.load() || (stale_connection && next->delivery.connection == *stale_connection)) {
    // Not started: back to the broker (for a lost connection's delivery, a no-op: the broker
    // delivers it again after the one before it), and the one after it when it is settled.
    next->requeue = true;
    finished_.emplace_back(std::move(next), MessageDisposition{});
    return 0;
  }
  next->ready_at = Steady::now();
  waiting_.push_back(std::move(next));
  return 1;
}

void ConsumeLoop::schedule(std::unique_ptr<Task> task, Steady::time_point at) {
  task->ready_at = at;
  {
    const std::lock_guard lock(mutex_);
    waiting_.push_back(std::move(task));
  }
  work_ready_.notify_one();
}

void ConsumeLoop::finish_many(Settled& finals) {
  if (finals.empty()) return;
  bool first = false;
  bool batch = false;
  {
    const std::lock_guard lock(mutex_);
    first = finished_.empty();
    for (auto& f : finals) finished_.push_back(std::move(f));
    batch = finished_.size() >= settle_batch() || waiting_.empty();
  }
  finals.clear();
  // The receiving thread settles everything finished at once. Waking it for each task had it
  // settle one, ack one and receive one per wake (a syscall or two and a broker round trip per
  // message), so:
  // - in receive(), it is woken by the first tasks finished after it last settled (it empties
  //   finished_ before it waits there again);
  // - waiting for room (the window full), by a batch of finished tasks, or by each task finished
  //   while none waits to run (no batch is coming: a stuck handler must not hold the others'
  //   acks), or by the last running task (worker()).
  if (batch) settled_.notify_all();
  if (first) source_.wake();
}

std::size_t ConsumeLoop::settle_batch() const {
  return std::clamp<std::size_t>(options_.max_in_flight / 8, 1, options_.workers);
}

bool ConsumeLoop::effects_are_cheap() const {
  return effect_ns_.load(std::memory_order_relaxed) < kCheapEffectNs;
}

void ConsumeLoop::observe_effect(Steady::duration took) {
  stats_.latency.observe(took);
  // A moving average; updates racing between workers may lose one, which only slows it.
  const std::int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(took).count();
  const std::int64_t average = effect_ns_.load(std::memory_order_relaxed);
  effect_ns_.store(average + (ns - average) / 8, std::memory_order_relaxed);
}

void ConsumeLoop::worker(std::size_t id) {
  std::unique_lock lock(mutex_);
  while (true) {
    if (workers_stop_) return;
    // The task that is due soonest, and how many are due.
    const auto now = Steady::now();
    auto soonest = waiting_.end();
    std::size_t due = 0;
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if ((*it)->ready_at <= now) ++due;
      if (soonest == waiting_.end() || (*it)->ready_at < (*soonest)->ready_at) soonest = it;
    }
    if (soonest == waiting_.end()) {
      work_ready_.wait(lock);
      continue;
    }
    if ((*soonest)->ready_at > now && !stopping_.load()) {
      // A copy: while this thread waits, another may take that task and free it.
      const Steady::time_point until = (*soonest)->ready_at;
      work_ready_.wait_until(lock, until);
      continue;
    }
    std::unique_ptr<Task> task = std::move(*soonest);
    waiting_.erase(soonest);
    if (stopping_.load()) {
      // Not started again once stopping: the broker gives it to whoever runs next, at once (its
      // claim forgotten). Counted as running while its claim is released, so that the draining
      // thread never sees it in none of waiting_, finished_ and running_ (it would take the loop
      // for drained of everything but what it held, and return without it).
      ++running_;
      lock.unlock();
      release_claim(*task);
      lock.lock();
      --running_;
      for (auto& member : task->group) {
        member->requeue = true;
        finished_.emplace_back(std::move(member), MessageDisposition{});
      }
      if (task->group.empty()) {
        task->requeue = true;
        finished_.emplace_back(std::move(task), MessageDisposition{});
      }
      lock.unlock();
      settled_.notify_all();
      source_.wake();
      lock.lock();
      continue;
    }
    std::size_t count = 1;  // tasks this worker runs now
    if (!task->group.empty()) {
      ++running_;
      lock.unlock();
      if (batch_processor_) {
        run_group(std::move(task));
      } else {
        start_group(std::move(task));
      }
    } else {
      Chunk& chunk = chunks_[id];
      if (effects_are_cheap()) {
        // Cheap effects: up to kCheapShare due tasks at once, so that a message costs a share of
        // one pass through the lock and of one wake-up, not a whole one (for a no-op effect those
        // were most of a message's cost). They wait in this worker's chunk, where the receiving
        // thread takes them back should the one running stall (reclaim_stalled). Slow effects
        // are taken one at a time.
        const std::size_t share = std::min(kCheapShare, due);
        for (auto it = waiting_.begin(); it != waiting_.end() && chunk.rest.size() + 1 < share;) {
          if ((*it)->ready_at <= now && (*it)->group.empty()) {
            chunk.rest.push_back(std::move(*it));
            it = waiting_.erase(it);
          } else {
            ++it;
          }
        }
      }
      chunk.started = now;
      running_ += 1 + chunk.rest.size();
      lock.unlock();
      count = run_chunk(id, std::move(task));
    }
    lock.lock();
    running_ -= count;
    if (running_ == 0) settled_.notify_all();
  }
}

void ConsumeLoop::start_group(std::unique_ptr<Task> group) {
  claim_batch(group->group);
  const auto now = Steady::now();
  std::size_t n = 0;
  {
    const std::lock_guard lock(mutex_);
    for (auto& member : group->group) {
      member->ready_at = now;
      waiting_.push_back(std::move(member));
      ++n;
    }
  }
  // This worker takes its share when it comes back for work; the others are woken for the rest.
  const std::size_t per_worker = effects_are_cheap() ? kCheapShare : 1;
  if (n > per_worker) wake_workers((n - 1) / per_worker);  // ceil((n - per_worker) / per_worker)
}

std::size_t ConsumeLoop::run_chunk(std::size_t id, std::unique_ptr<Task> task) {
  Settled ran;
  while (task) {
    MessageDisposition disposition;
    if (task->pending) {
      disposition = *task->pending;
    } else if (task->completion) {
      disposition = record_completion(*task);  // its effect ran; its completion did not take
    } else if (auto held = check_hold(*task)) {
      release_claim(*task);
      disposition = std::move(*held);
    } else {
      const auto t0 = Steady::now();
      try {
        disposition = process_one(*task);
      } catch (const std::exception& e) {
        disposition = MessageDisposition::retry_it("handler_failed", std::string("the processor threw: ") + e.what(), true);
      } catch (...) {
        disposition = MessageDisposition::retry_it("handler_failed", "the processor threw", true);
      }
      observe_effect(Steady::now() - t0);
      ++task->tries;
    }
    ran.emplace_back(std::move(task), std::move(disposition));
    // The next of this worker's chunk, unless the receiving thread took them back meanwhile.
    const std::lock_guard lock(mutex_);
    Chunk& chunk = chunks_[id];
    if (!chunk.rest.empty() && stopping_.load()) {
      // Stopping: what has not started waits again, and workers hand it back to the broker.
      give_back_locked(chunk);
      work_ready_.notify_all();
    } else if (!chunk.rest.empty()) {
      task = std::move(chunk.rest.front());
      chunk.rest.pop_front();
      chunk.started = Steady::now();
    }
  }
  const std::size_t count = ran.size();
  Settled finals;
  for (auto& [done, disposition] : ran) conclude(std::move(done), std::move(disposition), finals);
  finish_many(finals);
  return count;
}

std::size_t ConsumeLoop::give_back_locked(Chunk& chunk) {
  const std::size_t n = chunk.rest.size();
  for (auto& task : chunk.rest) waiting_.push_back(std::move(task));
  chunk.rest.clear();
  running_ -= n;
  return n;
}

void ConsumeLoop::reclaim_stalled() {
  std::size_t n = 0;
  {
    const std::lock_guard lock(mutex_);
    const auto stalled_since = Steady::now() - kStalledAfter;
    for (std::size_t i = 0; chunks_ && i < options_.workers; ++i) {
      Chunk& chunk = chunks_[i];
      if (!chunk.rest.empty() && chunk.started < stalled_since) n += give_back_locked(chunk);
    }
  }
  wake_workers(n);
}

MessageDisposition ConsumeLoop::process_one(Task& task) {
  if (consumer_ != nullptr) return run_effect(task);
  if (batch_processor_) {
    auto dispositions = batch_processor_({BatchItem{task.delivery, task.attempt}});
    if (dispositions.size() != 1) {
      return MessageDisposition::retry_it("handler_failed", "the batch processor answered " +
                                                                std::to_string(dispositions.size()) + " dispositions for 1 delivery", true);
    }
    return std::move(dispositions.front());
  }
  return processor_(task.delivery, task.attempt);
}

void ConsumeLoop::run_group(std::unique_ptr<Task> group) {
  std::vector<std::unique_ptr<Task>> runnable;
  Settled finals;
  for (auto& member : group->group) {
    if (auto held = check_hold(*member)) {
      conclude(std::move(member), std::move(*held), finals);
    } else {
      runnable.push_back(std::move(member));
    }
  }
  if (runnable.empty()) {
    finish_many(finals);
    return;
  }
  std::vector<BatchItem> items;
  items.reserve(runnable.size());
  for (const auto& task : runnable) items.push_back(BatchItem{task->delivery, task->attempt});
  std::vector<MessageDisposition> dispositions;
  const auto t0 = Steady::now();
  try {
    dispositions = batch_processor_(items);
    if (dispositions.size() != runnable.size()) {
      const std::string detail = "the batch processor answered " + std::to_string(dispositions.size()) +
                                 " dispositions for " + std::to_string(runnable.size()) + " deliveries";
      dispositions.assign(runnable.size(), MessageDisposition::retry_it("handler_failed", detail, true));
    }
  } catch (const std::exception& e) {
    dispositions.assign(runnable.size(), MessageDisposition::retry_it(
                                             "handler_failed", std::string("the batch processor threw: ") + e.what(), true));
  } catch (...) {
    dispositions.assign(runnable.size(),
                        MessageDisposition::retry_it("handler_failed", "the batch processor threw", true));
  }
  stats_.latency.observe(Steady::now() - t0);
  for (std::size_t i = 0; i < runnable.size(); ++i) {
    ++runnable[i]->tries;
    conclude(std::move(runnable[i]), std::move(dispositions[i]), finals);
  }
  finish_many(finals);
}

void ConsumeLoop::conclude(std::unique_ptr<Task> task, MessageDisposition disposition, Settled& finals) {
  if (disposition.action == MessageDisposition::Action::retry) {
    if (disposition.counts_as_attempt) {
      ++task->failures;
      task->attempt.last_error = disposition.detail;
    }
    if (disposition.counts_as_attempt && task->attempt.number >= options_.max_attempts) {
      std::string detail = "failed " + attempts_text(task->attempt.number) + ", the limit; last error: " +
                           task->attempt.last_error;
      disposition = MessageDisposition::dead_letter_it("poison", std::move(detail));
    } else {
      if (disposition.counts_as_attempt) ++task->attempt.number;
      stats_.retried.fetch_add(1, std::memory_order_relaxed);
      Millis delay = backoff(task->tries);
      if (disposition.retry_after) delay = std::clamp(*disposition.retry_after, delay, options_.retry_max);
      tell(task->delivery, "retry:" + disposition.reason, disposition.detail);
      schedule(std::move(task), Steady::now() + delay);
    }
  }
  if (task) {  // a final disposition: settle it, once its key's hold says so
    if (auto trouble = record_hold(*task, disposition)) {
      // Decided, not settled: settled when it comes round again, without running it again.
      stats_.retried.fetch_add(1, std::memory_order_relaxed);
      tell(task->delivery, "retry:store_error", *trouble);
      task->pending = std::move(disposition);
      ++task->tries;
      const Millis delay = backoff(task->tries);
      schedule(std::move(task), Steady::now() + delay);
    } else {
      finals.emplace_back(std::move(task), std::move(disposition));
    }
  }
}

void ConsumeLoop::settle_finished() {
  Settled done;
  {
    const std::lock_guard lock(mutex_);
    done.swap(finished_);
  }
  if (done.empty()) return;
  // The batched form: the completions of everything finished since the last settle, with one
  // store call, before any of their acks (also that of a task going back to the broker on stop
  // whose completion had not taken: its next delivery then finds it done, not in progress).
  if (consumer_ != nullptr) complete_batch(done);

  std::size_t settled = 0;
  // Keys whose settled delivery lets the next one run; with the connection of a delivery that
  // was not processed and comes again (stale).
  std::vector<std::pair<std::string, std::optional<std::uint64_t>>> released;
  std::vector<Delivery> acks;
  std::vector<const std::string*> acked_outcomes;  // each ack's outcome, from `done`
  auto warn = [&](const std::string& line) {
    if (options_.on_warning) options_.on_warning(line);
  };

  for (auto& [task, disposition] : done) {
    const Delivery& d = task->delivery;
    if (task->requeue) {
      if (auto r = source_.requeue(d); !r && r.error().code != BrokerErrc::stale) {
        warn("requeue of message " + d.message_id + " failed: " + r.error().message +
             " (the broker delivers it again once this connection closes)");
      }
      tell(d, "requeued",
           stopping_.load() ? "the consumer is stopping"
                            : "an earlier message of its ordering key was not processed and comes again (its connection "
                              "was lost): this one must not overtake it");
      ++settled;
      if (task->keyed) released.emplace_back(d.ordering_key, d.connection);
      continue;
    }
    if (task->keyed && disposition.action == MessageDisposition::Action::ack) released.emplace_back(d.ordering_key, std::nullopt);
    switch (disposition.action) {
      case MessageDisposition::Action::ack:
        acked_outcomes.push_back(&disposition.reason);
        if (disposition.reason == "duplicate") {
          stats_.duplicates.fetch_add(1, std::memory_order_relaxed);
        } else {
          stats_.processed.fetch_add(1, std::memory_order_relaxed);
        }
        ++settled;
        acks.push_back(std::move(task->delivery));  // not a copy: the task ends here (`d` with it)
        break;
      case MessageDisposition::Action::dead_letter: {
        DeadLetterReason why{disposition.reason, disposition.detail, task->attempt.last_error, task->attempt.number};
        auto written = source_.dead_letter(d, why);
        if (written) {
          stats_.count_dead_letter(disposition.reason);
          tell(d, "dead_letter:" + disposition.reason, disposition.detail);
          ++settled;
          if (task->keyed) released.emplace_back(d.ordering_key, std::nullopt);
        } else if (written.error().code == BrokerErrc::stale) {
          stats_.stale.fetch_add(1, std::memory_order_relaxed);
          tell(d, "stale", "the connection it came on was lost; the broker delivers it again");
          ++settled;
          if (task->keyed) released.emplace_back(d.ordering_key, d.connection);
        } else {
          // Not written: keep holding it and write it again later, without processing it again.
          stats_.broker_errors.fetch_add(1, std::memory_order_relaxed);
          warn("dead-lettering message " + d.message_id + " failed: " + written.error().message + "; trying again");
          task->pending = disposition;
          ++task->tries;
          const auto delay = backoff(task->tries);
          schedule(std::move(task), Steady::now() + delay);
        }
        break;
      }
      case MessageDisposition::Action::retry: {
        // A completion that did not take (complete_batch): the effect happened. The store was
        // unavailable: the next try writes the same completion again; fenced out: the record
        // decides what the next try does.
        stats_.retried.fetch_add(1, std::memory_order_relaxed);
        tell(d, "retry:" + disposition.reason, disposition.detail);
        ++task->tries;
        const auto delay = backoff(task->tries);
        schedule(std::move(task), Steady::now() + delay);
        break;
      }
    }
  }

  if (!acks.empty()) {
    auto acked = source_.ack(acks);
    if (!acked) {
      // The records are durable: an unacknowledged message comes back and is a duplicate then.
      if (acked.error().code == BrokerErrc::stale) {
        stats_.stale.fetch_add(acks.size(), std::memory_order_relaxed);
      } else {
        stats_.broker_errors.fetch_add(1, std::memory_order_relaxed);
        warn("ack failed: " + acked.error().message + " (the broker delivers those messages again; they are duplicates then)");
      }
    }
    for (std::size_t i = 0; i < acks.size(); ++i) tell(acks[i], *acked_outcomes[i], {});
  }

  if (!released.empty()) {
    std::size_t to_run = 0;
    {
      const std::lock_guard lock(mutex_);
      for (const auto& [key, stale_connection] : released) to_run += release_key_locked(key, stale_connection);
    }
    for (std::size_t i = 0; i < to_run; ++i) work_ready_.notify_one();
  }

  if (settled > 0) {
    {
      const std::lock_guard lock(mutex_);
      held_ -= settled;
    }
    stats_.in_flight.fetch_sub(static_cast<std::int64_t>(settled), std::memory_order_relaxed);
    settled_.notify_all();
  }
}

BrokerResult<Done> ConsumeLoop::run() {
  chunks_ = std::make_unique<Chunk[]>(options_.workers);
  for (std::size_t i = 0; i < options_.workers; ++i) workers_.emplace_back([this, i] { worker(i); });
  bool ever_ready = false;
  bool outage_told = false;
  std::uint32_t failures_in_a_row = 0;
  std::optional<BrokerError> refused;

  while (!stopping_.load()) {
    settle_finished();
    reclaim_stalled();
    std::size_t room = 0;
    {
      std::unique_lock lock(mutex_);
      if (held_ >= options_.max_in_flight) {
        // Full: wait for a task to finish instead of receiving; but still let the source serve
        // its connection (a receive of none), or a broker expecting heartbeats (AMQP) would
        // close it under handlers slower than two heartbeat intervals.
        const bool woken =
            settled_.wait_for(lock, options_.idle_wait, [&] { return !finished_.empty() || stopping_.load(); });
        lock.unlock();
        if (!woken) (void)source_.receive(0, Millis{0});
        continue;
      }
      room = options_.max_in_flight - held_;
    }
    auto received = source_.receive(room, options_.idle_wait);
    if (!received) {
      ready_.store(false);
      stats_.broker_errors.fetch_add(1, std::memory_order_relaxed);
      const BrokerError& e = received.error();
      if (e.code == BrokerErrc::refused && !ever_ready) {
        refused = e;  // wrong credentials or permissions from the start: say so and stop
        break;
      }
      if (!outage_told && options_.on_warning) options_.on_warning("broker: " + e.message);
      outage_told = true;
      // The source backs off between its reconnects; this only keeps a refusing broker from
      // being asked in a tight loop.
      ++failures_in_a_row;
      std::unique_lock lock(mutex_);
      settled_.wait_for(lock, std::min(backoff(failures_in_a_row), options_.idle_wait),
                        [&] { return stopping_.load(); });
      continue;
    }
    if (outage_told && options_.on_warning) options_.on_warning("broker: reachable again");
    outage_told = false;
    failures_in_a_row = 0;
    ever_ready = true;
    ready_.store(true);
    if (!received->empty()) handle_received(std::move(*received));
  }

  // Drain: waiting tasks go back to the broker; running ones may finish within drain_timeout.
  stopping_.store(true);
  work_ready_.notify_all();
  const auto deadline = Steady::now() + options_.drain_timeout;
  while (true) {
    settle_finished();
    reclaim_stalled();
    std::unique_lock lock(mutex_);
    if (held_ == 0) break;
    // Anything still waiting is requeued by a worker (they see stopping_); running ones finish.
    if (running_ == 0 && finished_.empty() && waiting_.empty()) break;  // held by nobody: cannot happen
    if (Steady::now() >= deadline) break;
    settled_.wait_until(lock, std::min(deadline, Steady::now() + std::chrono::milliseconds(50)),
                        [&] { return !finished_.empty(); });
  }
  {
    const std::lock_guard lock(mutex_);
    drained_.store(held_ == 0);
  }
  ready_.store(false);
  if (refused) return std::unexpected(std::move(*refused));
  return Done{};
}

}  // namespace idem
