#pragma once

// The MessageSource on a consumer group (idem/redis_stream_broker.hpp says what it does; this
// says how).
//
// Two connections: `read_` carries only XREADGROUP ... >, which may block in Redis for the whole
// wait; `ctl_` carries everything else (acks, dead letters, pings, pending-list reads, claims),
// so they never queue behind a blocked read. A wake() during a blocked read leaves that read
// outstanding; the next receive collects its reply, so entries that arrived meanwhile are not
// lost (they are on this consumer's pending list from the moment Redis answered anyway).
//
// receive() takes, in this order and up to min(max, prefetch): entries a collected read brought
// beyond what its receive could take; requeued entries, read again from this consumer's pending
// list; on the first receive, everything still pending for this consumer name (a restart); when
// due, entries idle longer than claim_idle on any consumer (XAUTOCLAIM); then new entries,
// waiting only when nothing else was found.

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "channel.hpp"
#include "endpoint.hpp"
#include "entry_codec.hpp"
#include "errors.hpp"
#include "idem/broker.hpp"
#include "idem/redis_stream_broker.hpp"

namespace idem::redis_streams {

/// Delays between reconnects: doubling from min to max, each drawn between half and all of it.
class Backoff {
 public:
  Backoff(Millis min, Millis max) : min_(min), max_(max), next_(min), random_(std::random_device{}()) {}
  /// The delay before the next attempt; the one after is twice as long (up to max).
  Millis next();
  /// After a success: start from min again.
  void reset() { next_ = min_; }

 private:
  Millis min_, max_, next_;
  std::minstd_rand random_;
};

/// A consumer in a group of one stream.
class StreamSource final : public MessageSource {
 public:
  /// Checks the settings, connects and creates the group (it may exist).
  static BrokerResult<std::unique_ptr<StreamSource>> open(std::string_view url, const SourceSettings& settings,
                                                          RedisStreamEvents events);
  ~StreamSource() override;
  StreamSource(const StreamSource&) = delete;
  StreamSource& operator=(const StreamSource&) = delete;

  BrokerResult<std::vector<Delivery>> receive(std::size_t max, Millis wait) override;
  void wake() override;
  BrokerResult<Done> ack(std::span<const Delivery> deliveries) override;
  BrokerResult<Done> requeue(const Delivery& delivery) override;
  BrokerResult<Done> dead_letter(const Delivery& delivery, const DeadLetterReason& why) override;
  BrokerResult<Done> ping() override;
  std::string name() const override { return endpoint_.name; }
  std::uint64_t reconnects() const override { return reconnects_.load(std::memory_order_relaxed); }

 private:
  StreamSource(RedisStreamUrl url, Endpoint endpoint, SourceSettings settings, RedisStreamEvents events, int wake_fd);

  // Connections and the group. connect() waits for the backoff (interruptibly) until
  // `wait_until` at most; it makes sure the group exists.
  BrokerResult<Done> connect(Steady::time_point wait_until);
  BrokerResult<Done> ensure_group();
  // A failure: mapped, and for anything but an error reply, both connections dropped and the
  // next attempt scheduled (ids stay valid across connections, so nothing else is reset).
  BrokerError fail(const redis_detail::Failure& failure, ErrorContext context);
  BrokerError drop(BrokerError error);
  BrokerError reply_error(const redis_detail::Reply& reply, ErrorContext context);
  // NOGROUP, UNBLOCKED: the group or the whole stream vanished (Redis restarted without
  // persistence, XGROUP DESTROY, DEL): create it again now; any other error reply is mapped.
  // Done means the caller's step did nothing and may be tried later.
  BrokerResult<Done> group_gone(const redis_detail::Reply& reply);
  // Commands on ctl_, pipelined, with one answer deadline.
  BrokerResult<std::vector<redis_detail::Reply>> control(const std::vector<std::vector<std::string>>& commands,
                                                         ErrorContext context);

  // The steps of receive(); each appends to `out` up to `limit`.
  void take_buffered(std::vector<Delivery>& out, std::size_t limit);
  BrokerResult<Done> redeliver_requeued(std::vector<Delivery>& out, std::size_t limit);
  BrokerResult<Done> scan_own_pending(std::vector<Delivery>& out, std::size_t limit);
  BrokerResult<Done> claim_from_idle(std::vector<Delivery>& out, std::size_t limit);
  BrokerResult<Done> read_new(std::vector<Delivery>& out, std::size_t limit, Steady::time_point until);
  BrokerResult<Done> take_read_reply(const redis_detail::Reply& reply, std::vector<Delivery>& out, std::size_t limit);

  BrokerResult<Delivery> make_delivery(RawEntry entry, std::uint32_t delivery_count);
  // Entries deleted from the stream while pending: acked (a no-op where XAUTOCLAIM already
  // dropped them, Redis 7), counted and reported.
  BrokerResult<Done> settle_deleted(const std::vector<std::string>& ids, std::string_view how);
  BrokerResult<Done> check_own(const Delivery& delivery) const;
  void drain_wake();
  bool wait_for_wake(Steady::time_point until);
  void warn(const std::string& line) const;

  RedisStreamUrl url_;
  Endpoint endpoint_;
  SourceSettings settings_;
  RedisStreamEvents events_;
  std::string consumer_;
  int wake_fd_;
  std::uint64_t token_;  // Delivery::connection of this source's deliveries

  std::optional<Channel> ctl_;
  std::optional<Channel> read_;
  Steady::time_point read_answer_by_{};  // when an outstanding read's reply is overdue
  bool group_ready_ = false;
  bool group_created_before_ = false;
  bool ever_connected_ = false;
  std::atomic<std::uint64_t> reconnects_{0};  // read by metrics from any thread
  Backoff backoff_;
  Steady::time_point next_connect_{};
  std::optional<BrokerError> last_error_;  // why the connections were dropped

  bool own_pending_done_ = false;
  std::string own_pending_cursor_ = "0";
  std::vector<std::string> requeued_;  // entry ids to read again from this consumer's pending list
  std::deque<Delivery> buffered_;
  Steady::time_point next_claim_{};
  std::string claim_cursor_ = "0-0";
  std::uint64_t deleted_while_pending_ = 0;
  std::uint64_t handles_ = 0;
};

}  // namespace idem::redis_streams
