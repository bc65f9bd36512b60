#include "webhook_sink.hpp"

#include <algorithm>
#include <iterator>

#include "idem/client/retry.hpp"
#include "idem/redact.hpp"
#include "idem/sidecar/message_http.hpp"

namespace idem::relay {

WebhookSink::WebhookSink(std::string url, client::Transport& transport, Millis timeout,
                         std::shared_ptr<const webhook::StandardSigner> signer, const Clock& clock)
    : url_(std::move(url)), transport_(transport), timeout_(timeout), signer_(std::move(signer)), clock_(clock) {}

std::string WebhookSink::name() const { return redact_url(url_); }

BrokerResult<Done> WebhookSink::ping() {
  if (away_) return std::unexpected(BrokerError{BrokerErrc::unavailable, *away_, false});
  return Done{};
}

client::HttpRequest WebhookSink::request_for(const OutgoingMessage& m) const {
  MessageHeaders own;
  own.reserve(m.headers.size());
  std::copy_if(m.headers.begin(), m.headers.end(), std::back_inserter(own), [](const auto& h) { return h.first != kOrderingKeyHeader; });
  client::HttpRequest request = sidecar::message_post(url_, m.message_id, m.content_type, own, m.body);
  if (!m.ordering_key.empty()) {
    // After Idempotency-Key and Content-Type, before the message's own headers.
    request.headers.insert(request.headers.begin() + 2, Header{std::string(kOrderingKeyHttpHeader), m.ordering_key});
  }
  // Signed last, at the time of sending: a retry gets a fresh timestamp, which a receiver's
  // tolerance (5 minutes by default) needs for a row retried hours later.
  if (signer_) sidecar::sign_message(request, *signer_, m.message_id, to_epoch_ms(clock_.now()) / 1000);
  return request;
}

std::optional<Millis> WebhookSink::take_retry_after() { return std::exchange(retry_after_, std::nullopt); }

std::vector<BrokerResult<Done>> WebhookSink::publish(std::span<const OutgoingMessage> messages) {
  std::vector<BrokerResult<Done>> results;
  results.reserve(messages.size());
  for (const OutgoingMessage& m : messages) {
    if (!m.ordering_key.empty() && !valid_ordering_key(m.ordering_key)) {
      results.push_back(std::unexpected(
          BrokerError{BrokerErrc::rejected, "the message's ordering key is not 1-128 visible ASCII characters", false}));
      continue;
    }
    auto response = transport_.perform(request_for(m), timeout_);
    if (!response) {
      // Not sent: the endpoint may or may not have taken it (in doubt unless it never connected).
      away_ = "the webhook did not answer: " + response.error().message;
      results.push_back(std::unexpected(BrokerError{BrokerErrc::unavailable,
                                                    "the webhook did not answer: " + response.error().message,
                                                    response.error().in_doubt()}));
      continue;
    }
    away_.reset();
    const int status = response->status;
    if (status >= 200 && status < 300) {
      results.push_back(Done{});
      continue;
    }
    std::string detail = sidecar::describe_answer("the webhook", status, response->body);
    if (sidecar::retryable_status(status)) {
      if (auto value = client::find_header(response->headers, "Retry-After")) {
        retry_after_ = client::parse_retry_after(*value, SystemClock::instance().now());
      }
      results.push_back(std::unexpected(BrokerError{BrokerErrc::unavailable, detail, true}));
    } else {
      results.push_back(std::unexpected(BrokerError{BrokerErrc::rejected, detail, false}));
    }
  }
  return results;
}

}  // namespace idem::relay
