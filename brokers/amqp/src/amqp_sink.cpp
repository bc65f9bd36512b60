// AmqpSink: OutgoingMessages to an exchange through a ConfirmPublisher.

#include "endpoint.hpp"
#include "idem/amqp_broker.hpp"
#include "idem/redact.hpp"
#include "publisher.hpp"

namespace idem {
namespace {

using namespace amqp_detail;

class AmqpSink final : public MessageSink {
 public:
  AmqpSink(AmqpUrl url, std::string name, SinkSettings settings)
      : url_(std::move(url)),
        name_(std::move(name)),
        settings_(settings),
        publisher_(endpoint_for(url_, name_, settings_.connect_timeout, "idem sink"), setup_for(url_)) {}

  std::vector<BrokerResult<Done>> publish(std::span<const OutgoingMessage> messages) override {
    std::vector<BrokerResult<Done>> results(messages.size(), Done{});
    std::vector<Outgoing> out;
    std::vector<std::size_t> index;  // out[k] is messages[index[k]]
    out.reserve(messages.size());
    for (std::size_t i = 0; i < messages.size(); ++i) {
      const OutgoingMessage& m = messages[i];
      Outgoing o;
      o.exchange = url_.exchange;
      o.routing_key = m.destination.empty() ? std::string_view(url_.routing_key) : std::string_view(m.destination);
      if (o.exchange.empty() && o.routing_key.empty()) {
        // The default exchange routes by queue name: without one nothing can take it.
        results[i] = std::unexpected(BrokerError{
            BrokerErrc::invalid, name_ + ": no routing key: give routing_key= in the URL or the message's destination", false});
        continue;
      }
      o.message_id = m.message_id;
      o.content_type = m.content_type;
      o.ordering_key = m.ordering_key;
      o.body = m.body;
      o.headers.reserve(m.headers.size());
      for (const auto& [name, value] : m.headers) o.headers.push_back({name, value, std::nullopt});
      out.push_back(std::move(o));
      index.push_back(i);
    }
    auto published = publisher_.publish(out, settings_.confirm_timeout);
    for (std::size_t k = 0; k < published.size(); ++k) results[index[k]] = std::move(published[k].result);
    return results;
  }

  BrokerResult<Done> ping() override { return publisher_.ping(); }
  std::string name() const override { return name_; }

 private:
  // Declares on each connect (declare=true): the exchange, or with the default exchange the
  // routing key's queue, so that messages published before any consumer ran are kept.
  static ConfirmPublisher::Setup setup_for(const AmqpUrl& url) {
    if (!url.declare) return {};
    if (!url.exchange.empty()) {
      return [exchange = url.exchange](Connection& c) { return c.ensure_exchange(exchange); };
    }
    if (!url.routing_key.empty()) {
      return [queue = url.routing_key](Connection& c) { return c.ensure_queue(queue); };
    }
    return {};
  }

  AmqpUrl url_;
  std::string name_;
  SinkSettings settings_;
  ConfirmPublisher publisher_;
};

}  // namespace

BrokerResult<std::unique_ptr<MessageSink>> open_amqp_sink(std::string_view url, const SinkSettings& settings) {
  auto parsed = parse_amqp_url(url, AmqpUrlRole::sink);
  if (!parsed) return std::unexpected(parsed.error());
  if (settings.connect_timeout <= Millis::zero() || settings.confirm_timeout <= Millis::zero()) {
    return std::unexpected(BrokerError{BrokerErrc::invalid, redact_url(url) + ": connect_timeout and confirm_timeout must be positive", false});
  }
  auto sink = std::make_unique<AmqpSink>(std::move(*parsed), redact_url(url), settings);
  // Connect now, so a wrong URL or password is seen at start-up.
  if (auto r = sink->ping(); !r) return std::unexpected(r.error());
  return std::unique_ptr<MessageSink>(std::move(sink));
}

}  // namespace idem
