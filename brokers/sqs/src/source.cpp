// SqsSource: long polls handed out as Deliveries; held messages kept invisible by a heartbeat on
// the client's I/O thread. State shared with that thread (what is held, what a poll brought, the
// poll's error) is under mutex_; every SQS call is made outside it.

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <random>

#include "client.hpp"
#include "errors.hpp"
#include "idem/redact.hpp"
#include "idem/sqs_broker.hpp"
#include "protocol.hpp"

namespace idem {
namespace {

using namespace sqs_detail;

// How long a failed visibility extension waits before it is tried again, at most.
constexpr Millis kExtendRetry{1000};
// Parallel DeleteMessageBatch / ChangeMessageVisibilityBatch calls of one ack or close.
constexpr std::size_t kParallel = 4;

std::atomic<std::uint64_t> next_connection{1};

class SqsSource final : public MessageSource {
 public:
  SqsSource(SqsUrl url, std::string name, SourceSettings settings, SqsEvents events)
      : url_(std::move(url)),
        name_(std::move(name)),
        settings_(std::move(settings)),
        events_(std::move(events)),
        queue_url_(url_.queue_url()),
        connection_(next_connection.fetch_add(1)) {
    settings_.prefetch = std::clamp<std::size_t>(settings_.prefetch, 1, 65535);
    settings_.connect_timeout = std::max(settings_.connect_timeout, Millis{100});
    settings_.reconnect_min = std::max(settings_.reconnect_min, Millis{1});
    settings_.reconnect_max = std::max(settings_.reconnect_max, settings_.reconnect_min);
    client_ = std::make_unique<Client>(ClientConfig::of(url_, settings_.connect_timeout));
  }

  ~SqsSource() override {
    std::uint64_t poll = 0;
    {
      std::unique_lock lock(mutex_);
      closing_ = true;
      poll = poll_id_;
    }
    // A poll still waiting is ended; what it brought, had it answered already, is handed back
    // with the rest.
    if (poll != 0) client_->cancel(poll);
    std::vector<std::pair<std::string, std::string>> release, remove;
    {
      std::unique_lock lock(mutex_);
      // The poll, and extensions on their way (one landing after the release would hide its
      // message again), end first; closing_ starts no more.
      changed_.wait(lock, [&] {
        return !polling_ && std::none_of(held_.begin(), held_.end(), [](const auto& e) { return e.second.extending; });
      });
      for (const auto& [handle, h] : held_) {
        if (h.lost) continue;
        (h.copied ? remove : release).emplace_back(std::to_string(handle), h.receipt);
      }
      held_.clear();
      ready_.clear();
    }
    // Handed back as a closed AMQP channel would: delivered again at once, not after the
    // visibility timeout. Dead-lettered ones whose delete failed are deleted.
    std::vector<Request> requests;
    for (std::size_t at = 0; at < release.size(); at += kMaxBatchEntries) {
      std::vector<std::pair<std::string, std::string>> batch(release.begin() + static_cast<std::ptrdiff_t>(at),
                                                             release.begin() + static_cast<std::ptrdiff_t>(
                                                                                   std::min(at + kMaxBatchEntries, release.size())));
      requests.push_back({"ChangeMessageVisibilityBatch", change_visibility_batch_request(queue_url_, batch, 0),
                          settings_.connect_timeout});
    }
    for (std::size_t at = 0; at < remove.size(); at += kMaxBatchEntries) {
      std::vector<std::pair<std::string, std::string>> batch(remove.begin() + static_cast<std::ptrdiff_t>(at),
                                                             remove.begin() + static_cast<std::ptrdiff_t>(
                                                                                  std::min(at + kMaxBatchEntries, remove.size())));
      requests.push_back({"DeleteMessageBatch", delete_batch_request(queue_url_, batch), settings_.connect_timeout});
    }
    if (!requests.empty()) {
      for (const Reply& r : client_->call_all(std::move(requests), kParallel)) {
        if (!r.ok()) {
          warn(failure(r, "handing held messages back at close").message +
               " (they come back after their visibility timeout instead)");
          break;
        }
      }
    }
    client_->stop();
  }

  SqsSource(const SqsSource&) = delete;
  SqsSource& operator=(const SqsSource&) = delete;

  /// Checks the queue and its dead-letter queue, then starts the visibility heartbeat.
  BrokerResult<Done> open() {
    if (auto ok = check_queue(queue_url_, url_.queue, "opening the source", false); !ok) return ok;
    // A consumer may be allowed only to send to the dead-letter queue: AccessDenied is let through.
    if (auto ok = check_queue(url_.dead_letter_url, url_.dead_letter_queue, "checking the dead-letter queue", true); !ok) {
      return ok;
    }
    client_->set_ticker([this] { return heartbeat(); });
    return Done{};
  }

  BrokerResult<std::vector<Delivery>> receive(std::size_t max, Millis wait) override {
    const auto deadline = Steady::now() + wait;
    max = std::min(max, settings_.prefetch);
    std::vector<Delivery> out;
    std::unique_lock lock(mutex_);
    while (true) {
      while (out.size() < max && !ready_.empty()) {
        out.push_back(std::move(ready_.front()));
        ready_.pop_front();
      }
      if (out.size() >= max) break;
      if (poll_error_) {
        if (!out.empty()) break;  // the error is told next time
        BrokerError e = std::move(*poll_error_);
        poll_error_.reset();
        return std::unexpected(std::move(e));
      }
      // The last poll brought fewer than it could: the queue has nothing more right now.
      if (!out.empty() && !polling_ && !last_poll_full_) break;
      if (woken_) {
        woken_ = false;
        break;
      }
      const auto now = Steady::now();
      if (!polling_ && now >= backoff_until_) {
        const std::size_t room = settings_.prefetch > held_.size() ? settings_.prefetch - held_.size() : 0;
        if (room > 0) {
          const std::size_t n = std::min({kMaxBatchEntries, max - out.size(), room});
          // Long poll for the first messages; more to fill `max` are taken without waiting.
          const int wait_seconds = out.empty() ? static_cast<int>(url_.wait_seconds.count()) : 0;
          polling_ = true;
          last_poll_full_ = false;
          lock.unlock();
          start_poll(n, wait_seconds);
          lock.lock();
          continue;
        }
        if (!out.empty()) break;  // `prefetch` held: nothing more until some are settled
      }
      if (now >= deadline) break;
      auto until = deadline;
      if (!polling_ && backoff_until_ > now) until = std::min(until, backoff_until_);
      changed_.wait_until(lock, until);
    }
    return out;
  }

  void wake() override {
    {
      const std::lock_guard lock(mutex_);
      woken_ = true;
    }
    changed_.notify_all();
  }

  BrokerResult<Done> ack(std::span<const Delivery> deliveries) override {
    std::vector<std::pair<std::string, std::string>> receipts;
    std::size_t stale = 0;
    {
      const std::lock_guard lock(mutex_);
      for (const Delivery& d : deliveries) {
        auto it = d.connection == connection_ ? held_.find(d.handle) : held_.end();
        if (it == held_.end()) {
          ++stale;
          continue;
        }
        // No longer held whatever the delete does: if it fails, the message comes back when its
        // visibility runs out, and is a duplicate then.
        receipts.emplace_back(std::string(), std::move(it->second.receipt));
        held_.erase(it);
      }
    }
    std::vector<Request> requests;
    for (std::size_t at = 0; at < receipts.size(); at += kMaxBatchEntries) {
      std::vector<std::pair<std::string, std::string>> batch;
      for (std::size_t i = at; i < std::min(at + kMaxBatchEntries, receipts.size()); ++i) {
        batch.emplace_back(std::to_string(i - at), std::move(receipts[i].second));
      }
      requests.push_back({"DeleteMessageBatch", delete_batch_request(queue_url_, batch), settings_.connect_timeout});
    }
    std::size_t deleted = 0;
    std::optional<BrokerError> error;
    for (const Reply& r : client_->call_all(std::move(requests), kParallel)) {
      if (!r.ok()) {
        if (!error) error = failure(r, "acknowledging (DeleteMessageBatch)");
        continue;
      }
      auto result = parse_batch_result(r.body);
      if (!result) {
        if (!error) error = unexpected_answer("acknowledging (DeleteMessageBatch)", result.error());
        continue;
      }
      deleted += result->successful.size();
      for (const auto& [id, f] : result->failed) {
        BrokerError e = entry_failure(f, "acknowledging (DeleteMessageBatch)");
        if (e.code == BrokerErrc::stale) {
          ++stale;
        } else if (!error) {
          error = std::move(e);
        }
      }
    }
    if (error) return std::unexpected(std::move(*error));
    if (deleted == 0 && stale > 0) {
      return std::unexpected(BrokerError{BrokerErrc::stale,
                                         name_ + ": the deliveries are no longer held by this source (their visibility "
                                                 "lapsed, or they were settled already); SQS delivers them again",
                                         false});
    }
    return Done{};
  }

  BrokerResult<Done> requeue(const Delivery& d) override {
    std::string receipt;
    {
      std::unique_lock lock(mutex_);
      auto it = d.connection == connection_ ? held_.find(d.handle) : held_.end();
      if (it == held_.end()) return std::unexpected(stale_error("requeue of " + d.broker_ref));
      // An extension still on its way could reach SQS after the requeue and hide the message
      // again for a whole visibility timeout: let it land first.
      changed_.wait(lock, [&] { return !held_.at(d.handle).extending; });
      receipt = std::move(held_.at(d.handle).receipt);
      held_.erase(d.handle);
    }
    const Reply r = client_->call({"ChangeMessageVisibility", change_visibility_request(queue_url_, receipt, 0),
                                   settings_.connect_timeout});
    if (!r.ok()) return std::unexpected(failure(r, "requeueing (ChangeMessageVisibility 0)"));
    return Done{};
  }

  BrokerResult<Done> dead_letter(const Delivery& d, const DeadLetterReason& why) override {
    std::string receipt;
    DeadLetterOrigin origin;
    bool copied = false;
    {
      const std::lock_guard lock(mutex_);
      auto it = d.connection == connection_ ? held_.find(d.handle) : held_.end();
      if (it == held_.end()) return std::unexpected(stale_error("dead_letter of " + d.broker_ref));
      receipt = it->second.receipt;
      origin = DeadLetterOrigin{url_.queue, it->second.sqs_message_id, it->second.group_id};
      copied = it->second.copied;
    }
    if (!copied) {
      const bool fifo = url_.dead_letter_queue.ends_with(".fifo");
      const SendEntry copy = dead_letter_entry(d, why, url_.id_attribute, origin, fifo);
      const Reply r = client_->call({"SendMessage", send_request(url_.dead_letter_url, copy), settings_.connect_timeout});
      if (!r.ok()) {
        Failure f = prepared(r, "sending the dead-letter copy", url_.dead_letter_queue);
        f.sends = true;
        return std::unexpected(map_error(f));
      }
      const std::lock_guard lock(mutex_);
      if (auto it = held_.find(d.handle); it != held_.end()) it->second.copied = true;
    }
    // SQS has the copy: the original goes. A retry after a failed delete only deletes.
    const Reply r = client_->call({"DeleteMessage", delete_request(queue_url_, receipt), settings_.connect_timeout});
    if (!r.ok()) return std::unexpected(failure(r, "deleting the dead-lettered original (its copy is in the dead-letter queue)"));
    const std::lock_guard lock(mutex_);
    held_.erase(d.handle);
    return Done{};
  }

  BrokerResult<Done> ping() override { return check_queue(queue_url_, url_.queue, "ping", false); }

  std::string name() const override { return name_; }

  std::uint64_t reconnects() const override { return reconnects_.load(std::memory_order_relaxed); }

 private:
  // A message received and not yet settled.
  struct Held {
    std::string receipt;
    std::string sqs_message_id;
    std::string group_id;
    Steady::time_point visible_until;  // by SQS's clock, at the latest: from when the request was sent
    Steady::time_point retry_at{};     // a failed extension is tried again from then
    bool extending = false;            // an extension is in flight
    bool lost = false;                 // SQS no longer knows its receipt: not extended any more
    bool copied = false;               // its dead-letter copy is in the dead-letter queue
  };

  void start_poll(std::size_t n, int wait_seconds) {
    const auto sent_at = Steady::now();
    Request r{"ReceiveMessage",
              receive_request(queue_url_, n, wait_seconds, static_cast<int>(url_.visibility_timeout.count())),
              settings_.connect_timeout + std::chrono::seconds(wait_seconds)};
    const std::uint64_t id = client_->start(std::move(r), [this, n, sent_at](Reply reply) { polled(std::move(reply), n, sent_at); });
    const std::lock_guard lock(mutex_);
    if (polling_) poll_id_ = id;
  }

  // On the I/O thread: a poll's answer.
  void polled(Reply reply, std::size_t asked, Steady::time_point sent_at) {
    std::optional<BrokerError> error;
    std::vector<ReceivedMessage> messages;
    if (!reply.ok()) {
      error = failure(reply, "receiving (ReceiveMessage)");
    } else if (auto parsed = parse_receive(reply.body); !parsed) {
      error = unexpected_answer("receiving (ReceiveMessage)", parsed.error());
    } else {
      messages = std::move(*parsed);
    }
    {
      const std::lock_guard lock(mutex_);
      polling_ = false;
      poll_id_ = 0;
      if (error) {
        if (!closing_) {
          poll_error_ = std::move(error);
          outage_ = true;
          backoff_ = backoff_.count() == 0 ? settings_.reconnect_min : std::min(backoff_ * 2, settings_.reconnect_max);
          thread_local std::minstd_rand random{std::random_device{}()};
          std::uniform_int_distribution<std::int64_t> jitter(backoff_.count() / 2, backoff_.count());
          backoff_until_ = Steady::now() + Millis{jitter(random)};
        }
      } else {
        if (outage_) reconnects_.fetch_add(1, std::memory_order_relaxed);
        outage_ = false;
        backoff_ = Millis{0};
        backoff_until_ = {};
        last_poll_full_ = messages.size() >= asked;
        for (ReceivedMessage& m : messages) {
          const std::uint64_t handle = next_handle_++;
          Held h;
          h.receipt = m.receipt_handle;
          h.sqs_message_id = m.sqs_message_id;
          h.group_id = m.group_id.value_or("");
          h.visible_until = sent_at + url_.visibility_timeout;
          held_.emplace(handle, std::move(h));
          Delivery d = to_delivery(std::move(m), url_.id_attribute, url_.fifo());
          d.handle = handle;
          d.connection = connection_;
          ready_.push_back(std::move(d));
        }
      }
    }
    changed_.notify_all();
  }

  // On the I/O thread: extends the visibility of every held message with half of it left (or
  // whose last extension failed a while ago); returns when to look again.
  Steady::time_point heartbeat() {
    const auto now = Steady::now();
    const auto half = std::chrono::duration_cast<Steady::duration>(url_.visibility_timeout) / 2;
    auto next = now + std::min<Steady::duration>(half, std::chrono::seconds(1));
    std::vector<std::vector<std::pair<std::string, std::string>>> batches;
    std::vector<std::vector<std::uint64_t>> handles;
    {
      const std::lock_guard lock(mutex_);
      if (closing_) return now + std::chrono::seconds(1);
      for (auto& [handle, h] : held_) {
        if (h.extending || h.lost) continue;
        const auto due = std::max(h.visible_until - half, h.retry_at);
        if (due > now) {
          next = std::min(next, due);
          continue;
        }
        if (batches.empty() || batches.back().size() == kMaxBatchEntries) {
          batches.emplace_back();
          handles.emplace_back();
        }
        batches.back().emplace_back(std::to_string(batches.back().size()), h.receipt);
        handles.back().push_back(handle);
        h.extending = true;
      }
    }
    for (std::size_t i = 0; i < batches.size(); ++i) {
      Request r{"ChangeMessageVisibilityBatch",
                change_visibility_batch_request(queue_url_, batches[i], static_cast<int>(url_.visibility_timeout.count())),
                settings_.connect_timeout};
      client_->start(std::move(r), [this, h = std::move(handles[i]), now](Reply reply) { extended(std::move(reply), h, now); });
    }
    return next;
  }

  // On the I/O thread: an extension's answer.
  void extended(Reply reply, const std::vector<std::uint64_t>& handles, Steady::time_point sent_at) {
    std::vector<std::string> warnings;
    std::optional<BatchResult> result;
    if (reply.ok()) {
      if (auto parsed = parse_batch_result(reply.body)) {
        result = std::move(*parsed);
      } else {
        warnings.push_back(unexpected_answer("extending visibility", parsed.error()).message);
      }
    }
    {
      const std::lock_guard lock(mutex_);
      // Told once per outage, not once a second.
      if (!reply.ok() && !closing_ && !extend_failing_) {
        warnings.push_back(failure(reply, "extending the visibility of held messages").message + "; trying again");
      }
      extend_failing_ = !reply.ok();
      const auto now = Steady::now();
      const auto retry = std::min<Steady::duration>(kExtendRetry, url_.visibility_timeout / 4);
      for (std::size_t i = 0; i < handles.size(); ++i) {
        auto it = held_.find(handles[i]);
        if (it == held_.end()) continue;  // settled meanwhile
        Held& h = it->second;
        h.extending = false;
        if (!result) {
          h.retry_at = now + retry;
          continue;
        }
        const std::string id = std::to_string(i);
        if (auto f = result->failed.find(id); f != result->failed.end()) {
          if (entry_failure(f->second, "extending visibility").code == BrokerErrc::stale ||
              short_code(f->second.code) == "InvalidParameterValue") {
            // Its receipt is void (the visibility lapsed and SQS may have handed it to another
            // consumer), or it reached SQS's 12 hours: stop extending; its ack will tell.
            h.lost = true;
            warnings.push_back(name_ + ": the visibility of message " + h.sqs_message_id +
                               " could not be extended (" + short_code(f->second.code) + ": " + f->second.message +
                               "); it may be delivered to another consumer");
          } else {
            h.retry_at = now + retry;
          }
          continue;
        }
        h.visible_until = sent_at + url_.visibility_timeout;
        h.retry_at = {};
      }
    }
    changed_.notify_all();  // a requeue or the close may wait for these
    for (const auto& line : warnings) warn(line);
  }

  BrokerResult<Done> check_queue(const std::string& queue_url, const std::string& queue, const std::string& doing,
                                 bool allow_access_denied) {
    const Reply r = client_->call({"GetQueueAttributes", get_attributes_request(queue_url, {"QueueArn"}), settings_.connect_timeout});
    if (r.ok()) return Done{};
    Failure f = prepared(r, doing, queue);
    if (allow_access_denied && is_access_denied(f)) return Done{};
    return std::unexpected(map_error(f));
  }

  Failure prepared(const Reply& r, const std::string& doing, const std::string& queue) const {
    Failure f = r.failure();
    f.where = name_;
    f.doing = doing;
    f.queue = queue;
    f.key_id = url_.access_key_id;
    f.secrets = client_->secrets();
    return f;
  }

  BrokerError failure(const Reply& r, const std::string& doing) const { return map_error(prepared(r, doing, url_.queue)); }

  BrokerError entry_failure(const EntryFailure& e, const std::string& doing) const {
    Failure f;
    f.aws_code = e.code;
    f.aws_message = e.message;
    f.sender_fault = e.sender_fault;
    f.where = name_;
    f.doing = doing;
    f.queue = url_.queue;
    f.key_id = url_.access_key_id;
    f.secrets = client_->secrets();
    return map_error(f);
  }

  BrokerError unexpected_answer(const std::string& doing, const std::string& what) const {
    return BrokerError{BrokerErrc::internal, name_ + ": " + doing + ": unexpected answer from SQS: " + what, false};
  }

  BrokerError stale_error(const std::string& what) const {
    return BrokerError{BrokerErrc::stale,
                       name_ + ": " + what + ": the delivery is not held by this source (settled already, or its visibility "
                                             "lapsed); SQS delivers the message again",
                       false};
  }

  void warn(const std::string& line) const {
    if (events_.on_warning) events_.on_warning(line);
  }

  SqsUrl url_;
  std::string name_;
  SourceSettings settings_;
  SqsEvents events_;
  std::string queue_url_;
  const std::uint64_t connection_;
  std::unique_ptr<Client> client_;

  std::mutex mutex_;
  std::condition_variable changed_;       // a poll or an extension answered, or wake()
  std::map<std::uint64_t, Held> held_;    // by Delivery::handle; ready_'s too
  std::deque<Delivery> ready_;            // received, not yet handed out
  std::uint64_t next_handle_ = 1;
  bool polling_ = false;
  std::uint64_t poll_id_ = 0;  // the client's id of the poll in flight, for cancel()
  bool last_poll_full_ = false;
  std::optional<BrokerError> poll_error_;
  bool woken_ = false;
  bool closing_ = false;
  bool outage_ = false;
  bool extend_failing_ = false;  // the last extension failed: told once
  Millis backoff_{0};
  Steady::time_point backoff_until_{};
  std::atomic<std::uint64_t> reconnects_{0};
};

}  // namespace

BrokerResult<std::unique_ptr<MessageSource>> open_sqs_source(std::string_view url, const SourceSettings& settings, SqsEvents events) {
  auto parsed = parse_complete_sqs_url(url, SqsUrlRole::source);
  if (!parsed) return std::unexpected(parsed.error());
  auto source = std::make_unique<SqsSource>(std::move(*parsed), redact_url(url), settings, std::move(events));
  if (auto opened = source->open(); !opened) return std::unexpected(opened.error());
  return source;
}

}  // namespace idem
