#include "producer.hpp"

#include <algorithm>
#include <chrono>

namespace idem::kafka_detail {
namespace {

using Steady = std::chrono::steady_clock;

// librdkafka's own message.timeout.ms expires at confirm_timeout; waiting a little longer lets
// its report say whether the record was ever sent (rd_kafka_message_status).
constexpr Millis kReportGrace{1000};

int ms_of(Steady::duration d) {
  return static_cast<int>(std::clamp<std::int64_t>(std::chrono::duration_cast<Millis>(d).count(), 0, 100));
}

}  // namespace

Producer::Producer(std::string where, ProducerOptions options) : options_(std::move(options)) {
  events_.where = std::move(where);
  events_.owner = this;
}

BrokerResult<std::unique_ptr<Producer>> Producer::open(const KafkaUrl& url, std::string where, ProducerOptions options) {
  std::unique_ptr<Producer> p(new Producer(std::move(where), std::move(options)));
  p->events_.user = url.sasl_username;
  p->events_.secrets = secrets_of(url);
  const ProducerOptions& o = p->options_;
  auto conf = base_conf(url, o.client_id, o.connect_timeout, Millis{100}, Millis{10'000}, p->events_);
  if (!conf) return std::unexpected(conf.error());
  const std::string& at = p->events_.where;
  const std::pair<const char*, std::string> props[] = {
      // Retries never duplicate or reorder a record within a partition (producer id + sequence
      // numbers), and a record is confirmed only once every in-sync replica has it.
      {"enable.idempotence", "true"},
      {"acks", "all"},
      {"message.timeout.ms", std::to_string(std::max<std::int64_t>(o.confirm_timeout.count(), 1))},
      {"linger.ms", "5"},
  };
  for (const auto& [name, value] : props) {
    if (auto ok = set(conf->get(), name, value, at); !ok) return std::unexpected(ok.error());
  }
  rd_kafka_conf_set_dr_msg_cb(conf->get(), on_delivery);
  auto rk = create(RD_KAFKA_PRODUCER, std::move(*conf), at);
  if (!rk) return std::unexpected(rk.error());
  p->rk_ = std::move(*rk);
  rd_kafka_t* handle = p->rk_.get();
  auto checked = check_cluster(handle, o.topic, o.connect_timeout, p->events_, [handle] { rd_kafka_poll(handle, 0); }, o.doing);
  if (!checked) return std::unexpected(checked.error());
  return p;
}

Producer::~Producer() {
  if (!rk_) return;
  // What is still in flight belongs to publishes that already gave up on it (in doubt): give
  // it a moment to land, then drop the rest.
  rd_kafka_flush(rk_.get(), 1000);
  rd_kafka_purge(rk_.get(), RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
  rd_kafka_poll(rk_.get(), 0);
}

void Producer::on_delivery(rd_kafka_t*, const rd_kafka_message_t* message, void* opaque) {
  auto* events = static_cast<ClientEvents*>(opaque);
  if (events != nullptr && events->owner != nullptr) static_cast<Producer*>(events->owner)->delivered(message);
}

void Producer::delivered(const rd_kafka_message_t* message) {
  const auto sequence = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(message->_private));
  const auto it = waiting_.find(sequence);
  if (it == waiting_.end() || results_ == nullptr) return;
  const std::size_t index = it->second;
  waiting_.erase(it);
  if (message->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
    (*results_)[index] = Done{};
    return;
  }
  Failure f;
  f.code = message->err;
  f.where = events_.where;
  f.topic = std::string(records_[index].topic);
  f.doing = "publishing to topic " + f.topic;
  f.user = events_.user;
  f.fatal = events_.fatal.has_value();
  // librdkafka knows whether the record reached a broker: only then may it have been written.
  f.maybe_sent = rd_kafka_message_status(message) != RD_KAFKA_MSG_STATUS_NOT_PERSISTED;
  (*results_)[index] = std::unexpected(map_error(f));
}

std::vector<BrokerResult<Done>> Producer::produce(std::span<const Record> records) {
  std::vector<BrokerResult<Done>> results(records.size(), std::unexpected(BrokerError{BrokerErrc::internal, "not produced", false}));
  results_ = &results;
  records_ = records;
  const auto deadline = Steady::now() + options_.confirm_timeout;
  for (std::size_t i = 0; i < records.size(); ++i) {
    const Record& r = records[i];
    const std::string topic(r.topic);
    const std::uint64_t sequence = ++next_sequence_;
    std::vector<rd_kafka_vu_t> vus;
    vus.reserve(5 + r.headers.size());
    auto add = [&vus](rd_kafka_vtype_t type) -> rd_kafka_vu_t& {
      vus.emplace_back();
      vus.back().vtype = type;
      return vus.back();
    };
    add(RD_KAFKA_VTYPE_TOPIC).u.cstr = topic.c_str();
    auto& value = add(RD_KAFKA_VTYPE_VALUE);
    // With RD_KAFKA_MSG_F_COPY librdkafka copies the bytes and never writes through the pointer.
    value.u.mem.ptr = const_cast<char*>(r.value.data());
    value.u.mem.size = r.value.size();
    if (r.key) {
      auto& key = add(RD_KAFKA_VTYPE_KEY);
      key.u.mem.ptr = const_cast<char*>(r.key->data());
      key.u.mem.size = r.key->size();
    }
    add(RD_KAFKA_VTYPE_MSGFLAGS).u.i = RD_KAFKA_MSG_F_COPY;
    add(RD_KAFKA_VTYPE_OPAQUE).u.ptr = reinterpret_cast<void*>(static_cast<std::uintptr_t>(sequence));
    std::vector<std::string> header_names;  // NUL-terminated copies for librdkafka
    header_names.reserve(r.headers.size());
    for (const auto& [name, text] : r.headers) {
      header_names.emplace_back(name);
      auto& h = add(RD_KAFKA_VTYPE_HEADER);
      h.u.header.name = header_names.back().c_str();
      h.u.header.val = text.data();
      h.u.header.size = static_cast<ssize_t>(text.size());
    }
    while (true) {
      rd_kafka_error_t* error = rd_kafka_produceva(rk_.get(), vus.data(), vus.size());
      if (error == nullptr) {
        waiting_[sequence] = i;
        break;
      }
      const rd_kafka_resp_err_t code = rd_kafka_error_code(error);
      const std::string detail = rd_kafka_error_string(error);
      rd_kafka_error_destroy(error);
      if (code == RD_KAFKA_RESP_ERR__QUEUE_FULL && Steady::now() < deadline) {
        rd_kafka_poll(rk_.get(), 10);  // reports free room in the queue
        continue;
      }
      Failure f;
      f.code = code;
      f.detail = detail;
      f.where = events_.where;
      f.topic = topic;
      f.doing = "publishing to topic " + topic;
      f.fatal = events_.fatal.has_value();
      results[i] = std::unexpected(map_error(f));  // never handed to librdkafka: not in doubt
      break;
    }
  }
  const auto report_deadline = deadline + kReportGrace;
  while (!waiting_.empty() && Steady::now() < report_deadline) {
    rd_kafka_poll(rk_.get(), std::max(1, ms_of(report_deadline - Steady::now())));
  }
  for (const auto& [sequence, index] : waiting_) {
    results[index] = std::unexpected(BrokerError{
        BrokerErrc::timeout,
        events_.where + ": publishing to topic " + std::string(records[index].topic) + ": no delivery report within " +
            std::to_string(options_.confirm_timeout.count()) + " ms; the record may have been written (in doubt)",
        true});
  }
  waiting_.clear();
  results_ = nullptr;
  records_ = {};
  return results;
}

BrokerResult<Done> Producer::ping() {
  rd_kafka_t* handle = rk_.get();
  return check_cluster(handle, "", options_.connect_timeout, events_, [handle] { rd_kafka_poll(handle, 0); }, "ping");
}

}  // namespace idem::kafka_detail
