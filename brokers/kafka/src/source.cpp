// KafkaSource: a consumer group member that hands out records as Deliveries and commits, per
// partition, only the contiguous prefix of done offsets (commit_ledger.hpp). Everything runs
// on the one thread that uses the source: librdkafka calls the rebalance, commit and error
// callbacks from inside rd_kafka_consumer_poll, which only receive() and the destructor call.

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <deque>

#include "client.hpp"
#include "commit_ledger.hpp"
#include "consumer_conf.hpp"
#include "idem/kafka_broker.hpp"
#include "producer.hpp"
#include "record_headers.hpp"

namespace idem {
namespace {

using namespace kafka_detail;
using Steady = std::chrono::steady_clock;

// What this source takes out of librdkafka's message queue ahead of handing it out (fill()):
// beyond that, records wait in librdkafka, which stops fetching at the bounds of
// consumer_conf.hpp (kafka_live_test.cpp checks them).
constexpr std::size_t kBufferRecords = 2048;
constexpr std::size_t kBufferBytes = 16 * 1024 * 1024;
// Records moved from librdkafka's message queue at once.
constexpr std::size_t kFillBatch = 256;

// The longest one rd_kafka_consumer_poll waits: wake() interrupts it anyway (queue yield);
// this bounds how late a retry or a revocation deadline is noticed.
constexpr Millis kPollSlice{100};

int to_ms(Steady::duration d) {
  return static_cast<int>(std::clamp<std::int64_t>(std::chrono::duration_cast<Millis>(d).count(), 0, kPollSlice.count()));
}

struct PartitionListDeleter {
  void operator()(rd_kafka_topic_partition_list_t* list) const { rd_kafka_topic_partition_list_destroy(list); }
};
using PartitionList = std::unique_ptr<rd_kafka_topic_partition_list_t, PartitionListDeleter>;

class KafkaSource final : public MessageSource {
 public:
  KafkaSource(KafkaUrl url, std::string name, SourceSettings settings, KafkaEvents events)
      : url_(std::move(url)), name_(std::move(name)), settings_(std::move(settings)) {
    if (settings_.consumer.empty()) settings_.consumer = default_client_name();
    settings_.prefetch = std::clamp<std::size_t>(settings_.prefetch, 1, 65535);
    events_.where = name_;
    events_.user = url_.sasl_username;
    events_.secrets = secrets_of(url_);
    events_.on_warning = std::move(events.on_warning);
    events_.owner = this;
  }

  ~KafkaSource() override {
    if (!rk_) return;
    closing_ = true;
    // What is done is committed now, while this member still belongs to the group; then
    // leaving the group revokes everything (on_rebalance commits again, synchronously, and
    // lets go at once: nothing still running can be acked after this).
    if (revoking_) finish_revoke();
    commit_now("closing");
    // librdkafka wants the queues' references given back before the close.
    if (queue_ != nullptr) rd_kafka_queue_destroy(queue_);
    queue_ = nullptr;
    if (messages_ != nullptr) rd_kafka_queue_destroy(messages_);
    messages_ = nullptr;
    rd_kafka_consumer_close(rk_.get());
    rk_.reset();
  }

  KafkaSource(const KafkaSource&) = delete;
  KafkaSource& operator=(const KafkaSource&) = delete;

  /// Creates the consumer, checks the cluster and both topics, subscribes.
  BrokerResult<Done> open() {
    auto conf = consumer_conf(url_, url_.client_id.empty() ? settings_.consumer : url_.client_id, settings_.connect_timeout,
                              settings_.reconnect_min, settings_.reconnect_max, events_);
    if (!conf) return std::unexpected(conf.error());
    rd_kafka_conf_set_rebalance_cb(conf->get(), &KafkaSource::rebalance_cb);
    rd_kafka_conf_set_offset_commit_cb(conf->get(), &KafkaSource::commit_cb);
    auto rk = create(RD_KAFKA_CONSUMER, std::move(*conf), name_);
    if (!rk) return std::unexpected(rk.error());
    rk_ = std::move(*rk);
    // Events (errors, rebalances, commit results) come through rd_kafka_consumer_poll; records
    // through messages_, where each assigned partition's queue is forwarded (on_rebalance), so
    // that they are taken only when there is room for them while events are always served.
    // (Pausing fetches to bound memory instead dropped what librdkafka had fetched ahead, and
    // fetching it again after every resume held a consume loop to a few thousand records/s.)
    rd_kafka_poll_set_consumer(rk_.get());
    queue_ = rd_kafka_queue_get_consumer(rk_.get());
    messages_ = rd_kafka_queue_new(rk_.get());

    rd_kafka_t* handle = rk_.get();
    const auto serve = [this] { serve_events(); };
    if (auto ok = check_cluster(handle, url_.topic, settings_.connect_timeout, events_, serve, "opening the consumer"); !ok) {
      return ok;
    }
    if (auto ok = check_cluster(handle, url_.dead_letter_topic, settings_.connect_timeout, events_, serve,
                                "checking the dead-letter topic");
        !ok) {
      return ok;
    }
    PartitionList topics(rd_kafka_topic_partition_list_new(1));
    rd_kafka_topic_partition_list_add(topics.get(), url_.topic.c_str(), RD_KAFKA_PARTITION_UA);
    if (const rd_kafka_resp_err_t err = rd_kafka_subscribe(handle, topics.get()); err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      return std::unexpected(failure(err, "subscribing to topic " + url_.topic));
    }
    return Done{};
  }

  BrokerResult<std::vector<Delivery>> receive(std::size_t max, Millis wait) override {
    std::vector<Delivery> out;
    max = std::min(max, settings_.prefetch);
    const auto deadline = Steady::now() + wait;
    serve_events();
    while (true) {
      if (auto trouble = take_trouble()) return std::unexpected(std::move(*trouble));
      finish_revoke_if_ready();
      take_ready(out, max);
      if (!out.empty() || max == 0) break;
      if (woken_.exchange(false)) break;
      const auto now = Steady::now();
      if (now >= deadline) break;
      auto until = deadline;
      if (!retries_.empty()) until = std::min(until, retries_.front().due);
      if (revoking_) until = std::min(until, revoking_->deadline);
      poll_once(to_ms(until - now));
    }
    maybe_commit();
    return out;
  }

  void wake() override {
    woken_.store(true);
    if (queue_ != nullptr) rd_kafka_queue_yield(queue_);
    if (messages_ != nullptr) rd_kafka_queue_yield(messages_);
  }

  BrokerResult<Done> ack(std::span<const Delivery> deliveries) override {
    std::size_t acked = 0, stale = 0;
    for (const Delivery& d : deliveries) {
      switch (ledger_.done(d.connection, static_cast<std::int64_t>(d.handle))) {
        case CommitLedger::Mark::ok:
          ++acked;
          break;
        case CommitLedger::Mark::stale:
          ++stale;
          break;
        case CommitLedger::Mark::settled:
          break;  // acked twice: nothing to do
      }
    }
    finish_revoke_if_ready();
    maybe_commit();
    if (acked == 0 && stale > 0) return std::unexpected(stale_error("the deliveries"));
    return Done{};
  }

  BrokerResult<Done> requeue(const Delivery& d) override {
    const auto offset = static_cast<std::int64_t>(d.handle);
    switch (ledger_.park(d.connection, offset)) {
      case CommitLedger::Mark::stale:
        return std::unexpected(stale_error("the delivery"));
      case CommitLedger::Mark::settled:
        return std::unexpected(BrokerError{BrokerErrc::invalid, name_ + ": requeue of " + d.broker_ref + ", which is not held", false});
      case CommitLedger::Mark::ok:
        break;
    }
    // Kafka has no per-message requeue: the message waits here and is handed out again (its
    // offset stays uncommitted meanwhile). A partition being revoked hands out nothing more:
    // its next owner delivers it.
    const auto partition = ledger_.partition_of(d.connection);
    if (partition && ledger_.active(*partition)) {
      Retry r{Steady::now() + url_.requeue_delay, *partition, d};
      const auto at = std::upper_bound(retries_.begin(), retries_.end(), r.due,
                                       [](Steady::time_point due, const Retry& other) { return due < other.due; });
      retries_.insert(at, std::move(r));
    }
    finish_revoke_if_ready();
    return Done{};
  }

  BrokerResult<Done> dead_letter(const Delivery& d, const DeadLetterReason& why) override {
    const auto offset = static_cast<std::int64_t>(d.handle);
    const auto partition = ledger_.partition_of(d.connection);
    if (!partition) return std::unexpected(stale_error("the delivery"));
    if (ledger_.delivery_count(d.connection, offset) == 0) {
      return std::unexpected(BrokerError{BrokerErrc::invalid, name_ + ": dead_letter of " + d.broker_ref + ", which is not held", false});
    }
    if (!dead_letters_ || dead_letters_->broken()) {
      dead_letters_.reset();
      ProducerOptions o;
      o.client_id = (url_.client_id.empty() ? settings_.consumer : url_.client_id) + "-dead-letters";
      o.connect_timeout = settings_.connect_timeout;
      o.confirm_timeout = std::max(settings_.connect_timeout, Millis{1000});
      o.topic = url_.dead_letter_topic;
      o.doing = "opening the dead-letter producer";
      auto opened = Producer::open(url_, name_, std::move(o));
      if (!opened) return std::unexpected(opened.error());
      dead_letters_ = std::move(*opened);
    }
    const auto headers = dead_letter_headers(d, why, url_.id_header, DeadLetterOrigin{url_.topic, *partition, offset});
    Record copy;
    copy.topic = url_.dead_letter_topic;
    if (d.has_message_id) copy.key = d.message_id;
    for (const auto& [name, value] : headers) copy.headers.emplace_back(name, value);
    copy.value = d.body;
    auto written = dead_letters_->produce(std::span(&copy, 1));
    if (!written.front()) return std::unexpected(written.front().error());
    // The cluster has the copy: the original counts as done for the commit.
    if (ledger_.done(d.connection, offset) == CommitLedger::Mark::stale) {
      return std::unexpected(stale_error("the delivery (its copy is in the dead-letter topic; the original comes back and is "
                                         "dead-lettered again)"));
    }
    finish_revoke_if_ready();
    maybe_commit();
    return Done{};
  }

  BrokerResult<Done> ping() override {
    const auto serve = [this] { serve_events(); };
    return check_cluster(rk_.get(), "", settings_.connect_timeout, events_, serve, "ping");
  }

  std::string name() const override { return name_; }

  std::uint64_t reconnects() const override { return reconnects_.load(std::memory_order_relaxed); }

 private:
  // A record fetched and not yet handed out.
  struct Fetched {
    std::int32_t partition = 0;
    std::int64_t offset = 0;
    Delivery delivery;
  };
  // A requeued delivery waiting to be handed out again.
  struct Retry {
    Steady::time_point due;
    std::int32_t partition = 0;
    Delivery delivery;
  };
  // Partitions a rebalance took away, still draining their held deliveries.
  struct Revoking {
    PartitionList partitions;
    Steady::time_point deadline;
  };

  static void rebalance_cb(rd_kafka_t*, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* partitions, void* opaque) {
    auto* events = static_cast<ClientEvents*>(opaque);
    static_cast<KafkaSource*>(events->owner)->on_rebalance(err, partitions);
  }

  static void commit_cb(rd_kafka_t*, rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* offsets, void* opaque) {
    auto* events = static_cast<ClientEvents*>(opaque);
    static_cast<KafkaSource*>(events->owner)->on_committed(err, offsets);
  }

  bool cooperative() const {
    const char* protocol = rd_kafka_rebalance_protocol(rk_.get());  // NULL when not in a group yet
    return protocol != nullptr && std::string_view(protocol) == "COOPERATIVE";
  }

  void on_rebalance(rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* partitions) {
    if (err == RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS) {
      for (int i = 0; i < partitions->cnt; ++i) (void)ledger_.assign(partitions->elems[i].partition);
      if (cooperative()) {
        if (rd_kafka_error_t* e = rd_kafka_incremental_assign(rk_.get(), partitions)) warn_error(e, "assigning partitions");
      } else if (const rd_kafka_resp_err_t e = rd_kafka_assign(rk_.get(), partitions); e != RD_KAFKA_RESP_ERR_NO_ERROR) {
        warn(failure(e, "assigning partitions").message);
      }
      // The partitions' records go to messages_ (records fetched before this line came through
      // the consumer queue: serve_events takes those).
      for (int i = 0; i < partitions->cnt; ++i) {
        if (rd_kafka_queue_t* q = rd_kafka_queue_get_partition(rk_.get(), url_.topic.c_str(), partitions->elems[i].partition)) {
          rd_kafka_queue_forward(q, messages_);
          rd_kafka_queue_destroy(q);
        }
      }
      // librdkafka keeps a partition's pause across unassign and assign: one paused while it
      // was revoked must not come back paused (it would never be fetched).
      rd_kafka_resume_partitions(rk_.get(), partitions);
      return;
    }
    if (err == RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS) {
      const bool lost = rd_kafka_assignment_lost(rk_.get()) != 0;
      if (lost) reconnects_.fetch_add(1, std::memory_order_relaxed);
      for (int i = 0; i < partitions->cnt; ++i) stop_handing_out(partitions->elems[i].partition);
      // Merged with a revocation still draining (an eager protocol revokes everything at once).
      PartitionList all(rd_kafka_topic_partition_list_copy(partitions));
      if (revoking_) {
        for (int i = 0; i < revoking_->partitions->cnt; ++i) {
          const auto& tp = revoking_->partitions->elems[i];
          if (rd_kafka_topic_partition_list_find(all.get(), tp.topic, tp.partition) == nullptr) {
            rd_kafka_topic_partition_list_add(all.get(), tp.topic, tp.partition);
          }
        }
      }
      const auto deadline = revoking_ ? revoking_->deadline : Steady::now() + url_.revoke_timeout;
      revoking_ = Revoking{std::move(all), deadline};
      // Deliveries still running may be acked until the deadline: librdkafka waits for the
      // unassign call (made from finish_revoke, later), and so does the group. Not when
      // closing (nothing will be acked any more) or when the partitions were lost (another
      // member owns them already, so a commit would be refused).
      if (closing_ || lost) {
        finish_revoke(/*commit=*/!lost);
      } else {
        rd_kafka_pause_partitions(rk_.get(), revoking_->partitions.get());
      }
      return;
    }
    // A rebalance that failed: librdkafka asks for the assignment to be cleared.
    warn(failure(err, "rebalancing").message);
    for (const std::int32_t p : ledger_.partitions()) stop_handing_out(p);
    for (const std::int32_t p : ledger_.partitions()) ledger_.revoke(p);
    revoking_.reset();
    rd_kafka_assign(rk_.get(), nullptr);
  }

  void on_committed(rd_kafka_resp_err_t err, rd_kafka_topic_partition_list_t* offsets) {
    if (offsets == nullptr) return;
    for (int i = 0; i < offsets->cnt; ++i) {
      const auto& tp = offsets->elems[i];
      if (tp.offset < 0) continue;
      const rd_kafka_resp_err_t e = tp.err != RD_KAFKA_RESP_ERR_NO_ERROR ? tp.err : err;
      if (e == RD_KAFKA_RESP_ERR_NO_ERROR) {
        ledger_.committed(tp.partition, tp.offset);
      } else {
        ledger_.commit_failed(tp.partition, tp.offset);
        // During a rebalance commits are refused for a moment: they are sent again.
        if (e != RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS && e != RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION &&
            e != RD_KAFKA_RESP_ERR__NO_OFFSET) {
          warn(failure(e, "committing offsets").message);
        }
      }
    }
  }

  // Drops what was fetched or waits for a retry in the partition: its next owner reads it
  // again from the last commit.
  void stop_handing_out(std::int32_t partition) {
    ledger_.start_revoke(partition);
    std::erase_if(fetched_, [&](const Fetched& f) {
      if (f.partition != partition) return false;
      fetched_bytes_ -= f.delivery.body.size();
      return true;
    });
    std::erase_if(retries_, [partition](const Retry& r) { return r.partition == partition; });
  }

  void finish_revoke_if_ready() {
    if (!revoking_) return;
    bool drained = true;
    for (int i = 0; i < revoking_->partitions->cnt; ++i) {
      if (ledger_.held(revoking_->partitions->elems[i].partition) > 0) drained = false;
    }
    if (drained || Steady::now() >= revoking_->deadline) finish_revoke();
  }

  // Commits what is done in the revoked partitions, forgets them, and tells librdkafka.
  void finish_revoke(bool commit = true) {
    if (!revoking_) return;
    rd_kafka_topic_partition_list_t* parts = revoking_->partitions.get();
    if (commit) commit_now("a rebalance revoked partitions", parts);
    for (int i = 0; i < parts->cnt; ++i) {
      const std::int32_t p = parts->elems[i].partition;
      if (const std::size_t held = ledger_.held(p); held > 0 && !closing_) {
        warn(name_ + ": partition " + std::to_string(p) + " was revoked with " + std::to_string(held) +
             " deliveries still running after " + std::to_string(url_.revoke_timeout.count()) +
             " ms (revoke_timeout_ms): their acks will be stale, and the partition's next owner delivers them again");
      }
      ledger_.revoke(p);
    }
    if (cooperative()) {
      if (rd_kafka_error_t* e = rd_kafka_incremental_unassign(rk_.get(), parts)) warn_error(e, "unassigning partitions");
    } else {
      rd_kafka_assign(rk_.get(), nullptr);
    }
    revoking_.reset();
  }

  // Synchronous commit of everything done and not confirmed yet (in `only`, if given).
  void commit_now(const std::string& why, const rd_kafka_topic_partition_list_t* only = nullptr) {
    std::vector<CommitLedger::Commit> commits = ledger_.to_commit(/*unconfirmed=*/true);
    if (only != nullptr) {
      std::erase_if(commits, [&](const CommitLedger::Commit& c) {
        return rd_kafka_topic_partition_list_find(only, url_.topic.c_str(), c.partition) == nullptr;
      });
    }
    if (commits.empty()) return;
    PartitionList list = to_list(commits);
    const rd_kafka_resp_err_t err = rd_kafka_commit(rk_.get(), list.get(), 0);
    for (int i = 0; i < list->cnt; ++i) {
      const auto& tp = list->elems[i];
      if (err == RD_KAFKA_RESP_ERR_NO_ERROR && tp.err == RD_KAFKA_RESP_ERR_NO_ERROR) {
        ledger_.committed(tp.partition, tp.offset);
      } else {
        warn(failure(tp.err != RD_KAFKA_RESP_ERR_NO_ERROR ? tp.err : err, "committing offsets (" + why + ")").message +
             "; the messages done since the last commit will be delivered again (duplicates)");
      }
    }
  }

  // An asynchronous commit of the done prefixes that moved, at most every commit_interval.
  void maybe_commit() {
    if (!rk_) return;
    const auto now = Steady::now();
    if (now - last_commit_ < url_.commit_interval) return;
    const std::vector<CommitLedger::Commit> commits = ledger_.to_commit();
    if (commits.empty()) return;
    PartitionList list = to_list(commits);
    if (const rd_kafka_resp_err_t err = rd_kafka_commit(rk_.get(), list.get(), 1); err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      return;  // not sent (no group generation yet, say): the next call tries again
    }
    ledger_.sent(commits);
    last_commit_ = now;
  }

  PartitionList to_list(const std::vector<CommitLedger::Commit>& commits) const {
    PartitionList list(rd_kafka_topic_partition_list_new(static_cast<int>(commits.size())));
    for (const auto& c : commits) rd_kafka_topic_partition_list_add(list.get(), url_.topic.c_str(), c.partition)->offset = c.offset;
    return list;
  }

  // Serves callbacks without waiting; records fetched meanwhile are kept.
  void serve_events() {
    if (!rk_) return;
    // The consumer queue holds events, and the records fetched before their partition's queue
    // was forwarded to messages_. Bounded, to stay finite whatever arrives meanwhile.
    for (std::size_t i = 0; i < kBufferRecords + 64; ++i) {
      rd_kafka_message_t* m = rd_kafka_consumer_poll(rk_.get(), 0);
      if (m == nullptr) break;
      take(m);
    }
    fill(0);
  }

  // Waits up to timeout_ms for records (when there is room for them), else for events.
  void poll_once(int timeout_ms) {
    if (room() > 0) {
      fill(timeout_ms);
    } else if (rd_kafka_message_t* m = rd_kafka_consumer_poll(rk_.get(), timeout_ms)) {
      take(m);
    }
    serve_events();
  }

  // How many more records fetched_ takes.
  std::size_t room() const {
    if (fetched_.size() >= kBufferRecords || fetched_bytes_ >= kBufferBytes) return 0;
    return kBufferRecords - fetched_.size();
  }

  // Moves what fits of messages_ into fetched_, waiting up to timeout_ms for the first record.
  // The wait is for one record (rd_kafka_consume_queue returns as soon as one is there): a batch
  // read waits for its whole size or the timeout, which held each record of a quiet topic up to a
  // poll slice (100 ms).
  void fill(int timeout_ms) {
    if (messages_ == nullptr || room() == 0) return;
    take_queued();
    if (!fetched_.empty() || timeout_ms <= 0) return;
    rd_kafka_message_t* first = rd_kafka_consume_queue(messages_, timeout_ms);
    if (first == nullptr) return;  // nothing came, or wake() yielded the queue
    take(first);
    take_queued();
  }

  // Moves what fits of what messages_ holds now into fetched_, without waiting.
  void take_queued() {
    std::array<rd_kafka_message_t*, kFillBatch> batch{};
    for (std::size_t want = std::min(room(), kFillBatch); want > 0; want = std::min(room(), kFillBatch)) {
      const ssize_t n = rd_kafka_consume_batch_queue(messages_, 0, batch.data(), want);
      if (n <= 0) return;
      for (ssize_t i = 0; i < n; ++i) take(batch[static_cast<std::size_t>(i)]);
      if (static_cast<std::size_t>(n) < want) return;
    }
  }

  void take(rd_kafka_message_t* m) {
    if (m->err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      on_consumer_error(m);
    } else if (m->rkt != nullptr && url_.topic == rd_kafka_topic_name(m->rkt) && ledger_.active(m->partition)) {
      Fetched f;
      f.partition = m->partition;
      f.offset = m->offset;
      decode(m, f.delivery);
      fetched_bytes_ += f.delivery.body.size();
      fetched_.push_back(std::move(f));
    }
    rd_kafka_message_destroy(m);
  }

  void decode(const rd_kafka_message_t* m, Delivery& d) const {
    IncomingRecord r;
    if (m->key != nullptr) r.key = std::string_view(static_cast<const char*>(m->key), m->key_len);
    if (m->payload != nullptr) r.value = std::string_view(static_cast<const char*>(m->payload), m->len);
    rd_kafka_headers_t* headers = nullptr;
    if (rd_kafka_message_headers(m, &headers) == RD_KAFKA_RESP_ERR_NO_ERROR && headers != nullptr) {
      const char* name = nullptr;
      const void* value = nullptr;
      std::size_t size = 0;
      for (std::size_t i = 0; rd_kafka_header_get_all(headers, i, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR; ++i) {
        std::optional<std::string_view> v;
        if (value != nullptr) v = std::string_view(static_cast<const char*>(value), size);
        r.headers.emplace_back(name, v);
      }
    }
    decode_record(r, url_.id_header, url_.id_from, d);
    d.broker_ref = url_.topic + "/" + std::to_string(m->partition) + "/" + std::to_string(m->offset);
    d.handle = static_cast<std::uint64_t>(m->offset);
  }

  void on_consumer_error(const rd_kafka_message_t* m) {
    Failure f;
    f.code = m->err;
    f.where = name_;
    f.doing = "consuming topic " + url_.topic;
    f.topic = url_.topic;
    f.user = url_.sasl_username;
    f.detail = scrub(rd_kafka_message_errstr(m), events_.secrets);
    switch (m->err) {
      case RD_KAFKA_RESP_ERR__PARTITION_EOF:
        return;
      case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
      case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
      case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
      case RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED:
        trouble_ = map_error(f);  // an operator must act: receive says so
        return;
      default:
        warn(map_error(f).message);  // librdkafka retries by itself
    }
  }

  // What receive() must report instead of deliveries: a fatal error, a refused login or a lost
  // cluster (each once; librdkafka keeps trying to reconnect by itself).
  std::optional<BrokerError> take_trouble() {
    if (events_.fatal) return map_error(*events_.fatal);
    if (trouble_) {
      auto t = std::move(trouble_);
      trouble_.reset();
      return t;
    }
    if (events_.refusal) {
      Failure f = *events_.refusal;
      events_.refusal.reset();
      return map_error(f);
    }
    if (events_.outage) {
      Failure f = *events_.outage;
      events_.outage.reset();
      reconnects_.fetch_add(1, std::memory_order_relaxed);
      return map_error(f);
    }
    return std::nullopt;
  }

  // Hands out due retries first, then fetched records, up to `max` in all.
  void take_ready(std::vector<Delivery>& out, std::size_t max) {
    const auto now = Steady::now();
    while (out.size() < max && !retries_.empty() && retries_.front().due <= now) {
      Retry r = std::move(retries_.front());
      retries_.pop_front();
      const auto count = ledger_.redeliver(r.delivery.connection, static_cast<std::int64_t>(r.delivery.handle));
      if (!count) continue;  // its partition went away meanwhile
      r.delivery.delivery_count = *count;
      r.delivery.redelivered = true;
      out.push_back(std::move(r.delivery));
    }
    while (out.size() < max && !fetched_.empty()) {
      Fetched f = std::move(fetched_.front());
      fetched_.pop_front();
      fetched_bytes_ -= f.delivery.body.size();
      const auto assignment = ledger_.hand_out(f.partition, f.offset);
      if (!assignment) continue;  // revoked, or fetched twice
      f.delivery.connection = *assignment;
      // Kafka keeps no delivery count: this source counts its own deliveries (a message
      // delivered before by a consumer that died starts at 1 again here).
      f.delivery.delivery_count = 1;
      f.delivery.redelivered = false;
      out.push_back(std::move(f.delivery));
    }
  }

  BrokerError failure(rd_kafka_resp_err_t err, const std::string& doing) const {
    Failure f;
    f.code = err;
    f.where = name_;
    f.doing = doing;
    f.topic = url_.topic;
    f.user = url_.sasl_username;
    return map_error(f);
  }

  BrokerError stale_error(const std::string& what) const {
    return BrokerError{BrokerErrc::stale,
                       name_ + ": " + what + " came from a partition this consumer no longer holds (a rebalance moved it); its "
                                          "next owner delivers the message again",
                       false};
  }

  void warn(const std::string& line) const {
    if (events_.on_warning) events_.on_warning(line);
  }

  void warn_error(rd_kafka_error_t* e, const std::string& doing) const {
    Failure f;
    f.code = rd_kafka_error_code(e);
    f.detail = rd_kafka_error_string(e);
    f.where = name_;
    f.doing = doing;
    rd_kafka_error_destroy(e);
    warn(map_error(f).message);
  }

  KafkaUrl url_;
  std::string name_;
  SourceSettings settings_;
  ClientEvents events_;
  Handle rk_;
  rd_kafka_queue_t* queue_ = nullptr;     // the consumer queue: events; for wake()'s yield
  rd_kafka_queue_t* messages_ = nullptr;  // the assigned partitions' records (on_rebalance)
  std::unique_ptr<Producer> dead_letters_;
  CommitLedger ledger_;
  std::deque<Fetched> fetched_;
  std::size_t fetched_bytes_ = 0;  // of the bodies in fetched_
  std::deque<Retry> retries_;  // soonest first
  std::optional<Revoking> revoking_;
  std::optional<BrokerError> trouble_;
  Steady::time_point last_commit_{};
  bool closing_ = false;
  std::atomic<bool> woken_{false};
  std::atomic<std::uint64_t> reconnects_{0};
};

}  // namespace

BrokerResult<std::unique_ptr<MessageSource>> open_kafka_source(std::string_view url, const SourceSettings& settings,
                                                               KafkaEvents events) {
  auto parsed = parse_kafka_url(url, KafkaUrlRole::source);
  if (!parsed) return std::unexpected(parsed.error());
  auto source = std::make_unique<KafkaSource>(std::move(*parsed), redact_kafka_url(url), settings, std::move(events));
  if (auto opened = source->open(); !opened) return std::unexpected(opened.error());
  return source;
}

}  // namespace idem
