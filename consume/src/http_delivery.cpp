#include "http_delivery.hpp"

#include "idem/client/retry.hpp"
#include "idem/sidecar/message_http.hpp"

namespace idem::consume {
HttpDelivery::HttpDelivery(Consumer& consumer, client::Transport& transport, HttpDeliveryOptions options)
    : consumer_(consumer), transport_(transport), options_(std::move(options)) {}

client::HttpRequest HttpDelivery::request_for(const Delivery& d, const DeliveryAttempt& attempt) const {
  client::HttpRequest request = sidecar::message_post(options_.url, d.message_id, d.content_type, d.headers, d.body);
  // The delivery's own facts go after Content-Type, before the message's headers.
  Headers facts = {{std::string(kSourceHeader), options_.source_name},
                   {std::string(kAttemptHeader), std::to_string(attempt.number)},
                   {std::string(kRedeliveredHeader), d.redelivered ? "true" : "false"}};
  // The brokers' sources hand out only valid keys; another MessageSource might not, and a header
  // carries only a valid one unchanged.
  if (valid_ordering_key(d.ordering_key)) facts.push_back({std::string(kOrderingKeyHttpHeader), d.ordering_key});
  request.headers.insert(request.headers.begin() + 2, facts.begin(), facts.end());
  // Signed last, when sent: each attempt gets its own timestamp.
  if (options_.signer) {
    sidecar::sign_message(request, *options_.signer, d.message_id, to_epoch_ms(options_.clock->now()) / 1000);
  }
  return request;
}

std::expected<std::string, MessageDisposition> HttpDelivery::effect(const Delivery& d,
                                                                    const DeliveryAttempt& attempt) const {
  auto response = transport_.perform(request_for(d, attempt), options_.timeout);
  if (!response) {
    return std::unexpected(MessageDisposition::retry_it(
        "handler_failed", "the handler did not answer: " + response.error().message, /*counts=*/true));
  }
  const int status = response->status;
  if (status >= 200 && status < 300) return "HTTP " + std::to_string(status);
  std::string detail = sidecar::describe_answer("the handler", status, response->body);
  if (!sidecar::retryable_status(status)) return std::unexpected(MessageDisposition::dead_letter_it("rejected", std::move(detail)));
  std::optional<Millis> retry_after;
  if (auto value = client::find_header(response->headers, "Retry-After")) {
    retry_after = client::parse_retry_after(*value, SystemClock::instance().now());
  }
  return std::unexpected(MessageDisposition::retry_it("handler_failed", std::move(detail), /*counts=*/true, retry_after));
}

MessageDisposition HttpDelivery::operator()(const Delivery& d, const DeliveryAttempt& attempt) const {
  std::optional<MessageDisposition> failed;
  auto outcome = consumer_.process_once(d.message_id, d.body, [&]() -> std::expected<std::string, std::string> {
    auto ran = effect(d, attempt);
    if (ran) return std::move(*ran);
    failed = std::move(ran.error());
    return std::unexpected(failed->detail);
  });
  // handler_failed released the claim: the message may run again, here or wherever it goes.
  if (outcome && outcome->status == MessageStatus::handler_failed && failed) return std::move(*failed);
  return disposition_of(outcome);
}

}  // namespace idem::consume
