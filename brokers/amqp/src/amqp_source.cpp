// AmqpSource: a queue consumed with manual acks on a connection of its own, dead letters
// published with confirms on another (publisher.hpp), reconnection with backoff.

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <deque>
#include <random>
#include <set>

#include "ack_plan.hpp"
#include "connection.hpp"
#include "endpoint.hpp"
#include "idem/amqp_broker.hpp"
#include "idem/redact.hpp"
#include "message.hpp"
#include "publisher.hpp"

namespace idem {
namespace {

using namespace amqp_detail;

// Connection ids are unique in the process, so a Delivery handed to another source (or one
// kept across a reconnect) never matches a connection it did not come on.
std::atomic<std::uint64_t> connection_ids{0};

constexpr std::string_view kIdemHeaderPrefix = "x-idem-";

class AmqpSource final : public MessageSource {
 public:
  AmqpSource(AmqpUrl url, std::string raw_url, SourceSettings settings, int wake_fd)
      : url_(std::move(url)),
        name_(redact_url(raw_url)),
        settings_(std::move(settings)),
        wake_fd_(wake_fd),
        next_delay_(settings_.reconnect_min),
        random_(std::random_device{}()) {
    if (settings_.consumer.empty()) settings_.consumer = default_consumer_name();
    endpoint_ = endpoint_for(url_, name_, settings_.connect_timeout, "idem source " + settings_.consumer);
    dead_letter_endpoint_ = endpoint_for(url_, name_, settings_.connect_timeout, "idem dead letters " + settings_.consumer);
  }

  ~AmqpSource() override {
    conn_.reset();  // connection.close: the broker requeues what we hold at once
    dead_letters_.reset();
    ::close(wake_fd_);
  }

  AmqpSource(const AmqpSource&) = delete;
  AmqpSource& operator=(const AmqpSource&) = delete;

  /// One connection attempt: connect, declare, qos, consume.
  BrokerResult<Done> connect() {
    auto opened = Connection::open(endpoint_);
    if (!opened) return std::unexpected(map_error(opened.error()));
    auto conn = std::move(*opened);
    auto fail = [&](const Failure& f) { return std::unexpected(map_error(f)); };
    if (url_.declare) {
      if (auto r = conn->ensure_exchange(url_.dead_letter_exchange); !r) return fail(r.error());
      if (auto r = conn->ensure_queue(url_.dead_letter_queue); !r) return fail(r.error());
      if (auto r = conn->bind(url_.dead_letter_queue, url_.dead_letter_exchange, url_.queue); !r) return fail(r.error());
      if (auto r = conn->ensure_queue(url_.queue, url_.single_active_consumer); !r) return fail(r.error());
    }
    if (auto r = conn->qos(static_cast<std::uint16_t>(settings_.prefetch)); !r) return fail(r.error());
    if (auto r = conn->consume(url_.queue, settings_.consumer); !r) return fail(r.error());
    conn_ = std::move(conn);
    connection_id_ = ++connection_ids;
    assembler_.reset();
    outstanding_.clear();
    ready_.clear();
    if (ever_connected_) reconnects_.fetch_add(1, std::memory_order_relaxed);
    ever_connected_ = true;
    next_delay_ = settings_.reconnect_min;
    last_error_.reset();
    return Done{};
  }

  BrokerResult<std::vector<Delivery>> receive(std::size_t max, Millis wait) override {
    if (max == 0) return service();
    const auto deadline = Steady::now() + wait;
    for (;;) {
      if (!conn_) {
        if (auto r = reconnect_until(deadline); !r) return std::unexpected(r.error());
      }
      if (dead_letters_) dead_letters_->service();
      if (auto p = pump(); !p) {
        lose(p.error());
        continue;  // reconnect, within the wait if the backoff allows
      }
      if (!ready_.empty()) return take(max);
      auto w = conn_->wait(deadline, wake_fd_);
      if (!w) {
        lose(w.error());
        continue;
      }
      if (*w == Connection::Wait::woken) {
        drain_wakes();
        return take(max);
      }
      if (*w == Connection::Wait::timeout) return take(max);
    }
  }

  void wake() override {
    const std::uint64_t one = 1;
    // EAGAIN means the counter is full: a wake is pending anyway.
    [[maybe_unused]] const auto n = ::write(wake_fd_, &one, sizeof one);
  }

  BrokerResult<Done> ack(std::span<const Delivery> deliveries) override {
    if (deliveries.empty()) return Done{};
    std::vector<std::uint64_t> tags;
    std::size_t stale = 0;
    for (const auto& d : deliveries) {
      if (!current(d)) {
        ++stale;
      } else if (outstanding_.contains(d.handle)) {
        tags.push_back(d.handle);
      }  // else acked or requeued before: done already
    }
    if (tags.empty()) {
      if (stale == deliveries.size()) return std::unexpected(stale_error(stale == 1 ? "the delivery" : std::to_string(stale) + " deliveries"));
      return Done{};
    }
    return ack_tags(std::move(tags));
  }

  BrokerResult<Done> requeue(const Delivery& d) override {
    if (!current(d)) return std::unexpected(stale_error("the delivery"));
    if (!outstanding_.contains(d.handle)) return std::unexpected(settled_error(d));
    amqp_basic_reject_t m{};
    m.delivery_tag = d.handle;
    m.requeue = 1;
    if (auto r = conn_->send(AMQP_BASIC_REJECT_METHOD, &m, "requeueing delivery " + d.broker_ref); !r) {
      return std::unexpected(lose(r.error()));
    }
    outstanding_.erase(d.handle);
    return Done{};
  }

  BrokerResult<Done> dead_letter(const Delivery& d, const DeadLetterReason& why) override {
    if (!current(d)) return std::unexpected(stale_error("the delivery"));
    if (!outstanding_.contains(d.handle)) return std::unexpected(settled_error(d));
    if (!dead_letters_) dead_letters_ = std::make_unique<ConfirmPublisher>(dead_letter_endpoint_);

    const std::string attempts = std::to_string(why.attempts);
    Outgoing copy;
    copy.exchange = url_.dead_letter_exchange;
    copy.routing_key = url_.queue;
    copy.message_id = d.has_message_id ? std::string_view(d.message_id) : std::string_view();
    copy.content_type = d.content_type;
    copy.ordering_key = d.ordering_key;
    copy.body = d.body;
    for (const auto& [name, value] : d.headers) {
      // A message dead-lettered before (and moved back by an operator) carries our old ones.
      if (!std::string_view(name).starts_with(kIdemHeaderPrefix)) copy.headers.push_back({name, value, std::nullopt});
    }
    copy.headers.push_back({"x-idem-reason", why.reason, std::nullopt});
    copy.headers.push_back({"x-idem-detail", why.detail, std::nullopt});
    copy.headers.push_back({"x-idem-last-error", why.last_error, std::nullopt});
    copy.headers.push_back({"x-idem-attempts", attempts, static_cast<std::int64_t>(why.attempts)});
    copy.headers.push_back({"x-idem-source", url_.queue, std::nullopt});

    auto published = dead_letters_->publish(std::span(&copy, 1), settings_.connect_timeout);
    PublishResult& result = published.front();
    if (!result.result) {
      BrokerError e = result.result.error();
      if (result.returned) {
        // Nothing takes the copy: acking the original now would lose the message.
        e.code = BrokerErrc::refused;
        e.message += ": bind queue \"" + url_.dead_letter_queue + "\" to exchange \"" + url_.dead_letter_exchange +
                     "\" with routing key \"" + url_.queue + "\" (declare=true does)";
      }
      return std::unexpected(e);
    }
    // The broker has the copy (confirmed): now the original may go.
    if (!current(d)) {
      return std::unexpected(stale_error("the delivery (its copy is in the dead-letter queue; the original will be dead-lettered again)"));
    }
    return ack_tags({d.handle});
  }

  BrokerResult<Done> ping() override {
    if (!conn_) {
      if (Steady::now() < next_attempt_) return std::unexpected(still_down());
      if (auto r = attempt(); !r) return r;
    }
    if (auto p = pump(); !p) return std::unexpected(lose(p.error()));
    if (auto q = conn_->qos(static_cast<std::uint16_t>(settings_.prefetch)); !q) return std::unexpected(lose(q.error()));
    return Done{};
  }

  std::string name() const override { return name_; }

  std::uint64_t reconnects() const override { return reconnects_.load(std::memory_order_relaxed); }

 private:
  // receive(0, ...): a caller with no room for deliveries (a consume loop whose workers are all
  // busy) still keeps the connections alive: heartbeats go out and what arrived is read (and
  // kept), without waiting and without reconnecting.
  BrokerResult<std::vector<Delivery>> service() {
    if (dead_letters_) dead_letters_->service();
    if (!conn_) return std::unexpected(still_down());
    if (auto alive = conn_->keep_alive(); !alive) return std::unexpected(lose(alive.error()));
    if (auto p = pump(); !p) return std::unexpected(lose(p.error()));
    return std::vector<Delivery>{};
  }
  static std::string default_consumer_name() {
    char host[256] = {};
    if (::gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "localhost");
    return std::string(host) + "-" + std::to_string(::getpid());
  }

  bool current(const Delivery& d) const { return conn_ && d.connection == connection_id_; }

  BrokerError stale_error(const std::string& what) const {
    return BrokerError{BrokerErrc::stale, name_ + ": " + what + " came on a connection since replaced; the broker delivers it again", false};
  }
  BrokerError settled_error(const Delivery& d) const {
    return BrokerError{BrokerErrc::invalid, name_ + ": delivery " + d.broker_ref + " was acknowledged or requeued already", false};
  }

  BrokerError still_down() const {
    BrokerError e = last_error_.value_or(BrokerError{BrokerErrc::unavailable, name_ + ": not connected", false});
    const auto wait = std::chrono::ceil<Millis>(next_attempt_ - Steady::now()).count();
    if (wait > 0) e.message += " (next attempt in " + std::to_string(wait) + " ms)";
    return e;
  }

  // The delay before the next attempt: doubling from reconnect_min to reconnect_max, each
  // drawn from [d/2, d] so that consumers a broker restart disconnected together do not come
  // back together.
  Millis next_backoff() {
    const Millis d = next_delay_;
    next_delay_ = std::min(next_delay_ * 2, settings_.reconnect_max);
    std::uniform_int_distribution<std::int64_t> pick(d.count() / 2, d.count());
    return Millis(pick(random_));
  }

  BrokerResult<Done> attempt() {
    auto r = connect();
    if (!r) {
      last_error_ = r.error();
      next_attempt_ = Steady::now() + next_backoff();
    }
    return r;
  }

  // Connects once the backoff allows, waiting for that within `deadline` (wake() ends the wait).
  BrokerResult<Done> reconnect_until(Steady::time_point deadline) {
    if (Steady::now() < next_attempt_) {
      if (next_attempt_ > deadline) {
        sleep_until(deadline);
        return std::unexpected(still_down());
      }
      if (!sleep_until(next_attempt_)) return std::unexpected(still_down());
    }
    return attempt();
  }

  // Sleeps until `t`; false when wake() ended the sleep first.
  bool sleep_until(Steady::time_point t) {
    for (;;) {
      const auto now = Steady::now();
      if (now >= t) return true;
      pollfd p{wake_fd_, POLLIN, 0};
      const auto ms = std::chrono::ceil<std::chrono::milliseconds>(t - now).count();
      const int n = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(ms, 60'000)));
      if (n > 0) {
        drain_wakes();
        return false;
      }
      if (n < 0 && errno != EINTR) return true;
    }
  }

  void drain_wakes() {
    std::uint64_t count = 0;
    [[maybe_unused]] const auto n = ::read(wake_fd_, &count, sizeof count);
  }

  // The connection is gone or unusable: every delivery of it is stale now (the broker requeues
  // them when it sees the connection close) and the next attempt waits for the backoff.
  BrokerError lose(const Failure& failure) {
    BrokerError e = map_error(failure);
    conn_.reset();
    connection_id_ = 0;
    outstanding_.clear();
    ready_.clear();
    assembler_.reset();
    last_error_ = e;
    next_attempt_ = Steady::now() + next_backoff();
    return e;
  }

  // Reads every frame there is without blocking; completed deliveries go to ready_.
  std::expected<void, Failure> pump() {
    amqp_frame_t frame;
    for (;;) {
      auto got = conn_->next_frame(frame);
      if (!got) return std::unexpected(got.error());
      if (!*got) return {};
      auto step = assembler_.feed(frame);
      if (!step) {
        conn_->release();
        return std::unexpected(step.error());
      }
      if (*step == Assembler::Step::complete) {
        Incoming in = assembler_.take();
        conn_->release();
        outstanding_.insert(in.delivery_tag);
        ready_.push_back(to_delivery(std::move(in)));
        continue;
      }
      if (*step == Assembler::Step::more) {
        conn_->release();
        continue;
      }
      const auto id = frame.payload.method.id;
      if (id == AMQP_CHANNEL_CLOSE_METHOD) return std::unexpected(conn_->channel_closed(frame, "consuming from queue \"" + url_.queue + "\""));
      conn_->release();
      if (id == AMQP_BASIC_CANCEL_METHOD) {
        Failure f;
        f.kind = Failure::Kind::cancelled;
        f.where = name_;
        f.doing = "consuming from queue \"" + url_.queue + "\"";
        return std::unexpected(std::move(f));
      }
      // Anything else (a late RPC reply) needs no answer.
    }
  }

  Delivery to_delivery(Incoming in) const {
    Delivery d;
    d.message_id = std::move(in.message_id);
    d.has_message_id = in.has_message_id;
    d.content_type = std::move(in.content_type);
    d.ordering_key = std::move(in.ordering_key);
    d.headers = std::move(in.headers);
    d.body = std::move(in.body);
    d.redelivered = in.redelivered;
    if (in.x_delivery_count && *in.x_delivery_count >= 0 && *in.x_delivery_count < UINT32_MAX) {
      d.delivery_count = static_cast<std::uint32_t>(*in.x_delivery_count) + 1;
    } else {
      d.delivery_count = in.redelivered ? 2 : 1;
    }
    d.broker_ref = std::to_string(in.delivery_tag);
    d.handle = in.delivery_tag;
    d.connection = connection_id_;
    return d;
  }

  std::vector<Delivery> take(std::size_t max) {
    std::vector<Delivery> out;
    const std::size_t n = std::min(max, ready_.size());
    out.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      out.push_back(std::move(ready_.front()));
      ready_.pop_front();
    }
    return out;
  }

  BrokerResult<Done> ack_tags(std::vector<std::uint64_t> tags) {
    const AckPlan plan = plan_acks(outstanding_, std::move(tags));
    auto send = [&](std::uint64_t tag, bool multiple) -> BrokerResult<Done> {
      amqp_basic_ack_t m{};
      m.delivery_tag = tag;
      m.multiple = multiple ? 1 : 0;
      if (auto r = conn_->send(AMQP_BASIC_ACK_METHOD, &m, "acknowledging"); !r) {
        BrokerError e = lose(r.error());
        e.message += " (the broker delivers the unacknowledged messages again)";
        return std::unexpected(e);
      }
      if (multiple) {
        outstanding_.erase(outstanding_.begin(), outstanding_.upper_bound(tag));
      } else {
        outstanding_.erase(tag);
      }
      return Done{};
    };
    if (plan.multiple_up_to) {
      if (auto r = send(*plan.multiple_up_to, true); !r) return r;
    }
    for (const auto tag : plan.singles) {
      if (auto r = send(tag, false); !r) return r;
    }
    return Done{};
  }

  AmqpUrl url_;
  std::string name_;
  SourceSettings settings_;
  Endpoint endpoint_;
  Endpoint dead_letter_endpoint_;
  int wake_fd_;
  std::unique_ptr<Connection> conn_;
  std::uint64_t connection_id_ = 0;
  std::set<std::uint64_t> outstanding_;  // delivered on conn_, not yet acked or requeued
  std::deque<Delivery> ready_;           // delivered, not yet returned by receive()
  Assembler assembler_;
  std::unique_ptr<ConfirmPublisher> dead_letters_;
  Millis next_delay_;
  Steady::time_point next_attempt_{};
  std::optional<BrokerError> last_error_;
  bool ever_connected_ = false;
  std::atomic<std::uint64_t> reconnects_{0};
  std::mt19937_64 random_;
};

}  // namespace

BrokerResult<std::unique_ptr<MessageSource>> open_amqp_source(std::string_view url, const SourceSettings& settings) {
  auto parsed = parse_amqp_url(url, AmqpUrlRole::source);
  if (!parsed) return std::unexpected(parsed.error());
  const auto invalid = [&](const std::string& what) {
    return std::unexpected(BrokerError{BrokerErrc::invalid, redact_url(url) + ": " + what, false});
  };
  if (settings.prefetch < 1 || settings.prefetch > 65535) return invalid("prefetch must be 1-65535");
  if (settings.connect_timeout <= Millis::zero()) return invalid("connect_timeout must be positive");
  if (settings.reconnect_min <= Millis::zero() || settings.reconnect_max < settings.reconnect_min) {
    return invalid("reconnect_min must be positive and at most reconnect_max");
  }
  if (settings.consumer.size() > kMaxShortString) return invalid("the consumer name is longer than AMQP's 255 bytes");
  const int wake_fd = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd < 0) return std::unexpected(BrokerError{BrokerErrc::internal, redact_url(url) + ": eventfd failed", false});
  auto source = std::make_unique<AmqpSource>(std::move(*parsed), std::string(url), settings, wake_fd);
  if (auto r = source->connect(); !r) return std::unexpected(r.error());
  return std::unique_ptr<MessageSource>(std::move(source));
}

}  // namespace idem
