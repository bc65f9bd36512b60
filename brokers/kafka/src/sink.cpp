// KafkaSink: OutgoingMessages as records of an idempotent producer (producer.hpp).

#include "idem/kafka_broker.hpp"
#include "producer.hpp"
#include "record_headers.hpp"

namespace idem {
namespace {

using namespace kafka_detail;

class KafkaSink final : public MessageSink {
 public:
  KafkaSink(KafkaUrl url, std::string name, SinkSettings settings, std::unique_ptr<Producer> producer)
      : url_(std::move(url)), name_(std::move(name)), settings_(settings), producer_(std::move(producer)) {}

  std::vector<BrokerResult<Done>> publish(std::span<const OutgoingMessage> messages) override {
    if (!producer_ || producer_->broken()) {
      // A fatal error (the idempotent producer's sequence broken, say) ends a producer for
      // good: this publish opens a new one.
      producer_.reset();
      auto reopened = open_producer(url_, name_, settings_);
      if (!reopened) return std::vector<BrokerResult<Done>>(messages.size(), std::unexpected(reopened.error()));
      producer_ = std::move(*reopened);
    }
    std::vector<BrokerResult<Done>> results(messages.size(), Done{});
    std::vector<Record> records;
    std::vector<std::size_t> index;  // records[k] is messages[index[k]]
    records.reserve(messages.size());
    index.reserve(messages.size());
    for (std::size_t i = 0; i < messages.size(); ++i) {
      const OutgoingMessage& m = messages[i];
      if (!m.ordering_key.empty() && !valid_ordering_key(m.ordering_key)) {
        results[i] = std::unexpected(BrokerError{
            BrokerErrc::rejected, name_ + ": the message's ordering key is not 1-128 visible ASCII characters", false});
        continue;
      }
      Record r;
      r.topic = m.destination.empty() ? std::string_view(url_.topic) : std::string_view(m.destination);
      r.key = record_key(m);
      r.headers = outgoing_headers(m, url_.id_header);
      r.value = m.body;
      records.push_back(std::move(r));
      index.push_back(i);
    }
    if (records.empty()) return results;
    auto produced = producer_->produce(records);
    for (std::size_t k = 0; k < produced.size(); ++k) results[index[k]] = std::move(produced[k]);
    return results;
  }

  BrokerResult<Done> ping() override {
    if (!producer_) return std::unexpected(BrokerError{BrokerErrc::unavailable, name_ + ": no producer (the last one failed)", false});
    return producer_->ping();
  }

  std::string name() const override { return name_; }

  static BrokerResult<std::unique_ptr<Producer>> open_producer(const KafkaUrl& url, const std::string& name,
                                                               const SinkSettings& settings) {
    ProducerOptions o;
    o.client_id = url.client_id.empty() ? std::string("idem") : url.client_id;
    o.connect_timeout = settings.connect_timeout;
    o.confirm_timeout = settings.confirm_timeout;
    o.topic = url.topic;
    o.doing = "opening a producer for topic " + url.topic;
    return Producer::open(url, name, std::move(o));
  }

 private:
  KafkaUrl url_;
  std::string name_;
  SinkSettings settings_;
  std::unique_ptr<Producer> producer_;
};

}  // namespace

BrokerResult<std::unique_ptr<MessageSink>> open_kafka_sink(std::string_view url, const SinkSettings& settings) {
  auto parsed = parse_kafka_url(url, KafkaUrlRole::sink);
  if (!parsed) return std::unexpected(parsed.error());
  std::string name = redact_kafka_url(url);
  auto producer = KafkaSink::open_producer(*parsed, name, settings);
  if (!producer) return std::unexpected(producer.error());
  return std::make_unique<KafkaSink>(std::move(*parsed), std::move(name), settings, std::move(*producer));
}

}  // namespace idem
