#include "http_delivery.hpp"

#include "idem/client/retry.hpp"
#include "idem/sidecar/message_http.hpp"

namespace idem::consume {
namespace {

// What one POST came to, for the disposition.
struct Answer {
  enum class Kind { ok, retry, reject } kind = Kind::ok;
  std::string detail;
  std::optional<Millis> retry_after;
};

}  // namespace

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
  return request;
}

MessageDisposition HttpDelivery::operator()(const Delivery& d, const DeliveryAttempt& attempt) const {
  Answer answer;
  auto outcome = consumer_.process_once(d.message_id, d.body, [&]() -> std::expected<std::string, std::string> {
    auto response = transport_.perform(request_for(d, attempt), options_.timeout);
    if (!response) {
      answer.kind = Answer::Kind::retry;
      answer.detail = "the handler did not answer: " + response.error().message;
      return std::unexpected(answer.detail);
    }
    const int status = response->status;
    if (status >= 200 && status < 300) return "HTTP " + std::to_string(status);
    answer.detail = sidecar::describe_answer("the handler", status, response->body);
    if (sidecar::retryable_status(status)) {
      answer.kind = Answer::Kind::retry;
      if (auto value = client::find_header(response->headers, "Retry-After")) {
        answer.retry_after = client::parse_retry_after(*value, SystemClock::instance().now());
      }
    } else {
      answer.kind = Answer::Kind::reject;
    }
    return std::unexpected(answer.detail);
  });
  // handler_failed released the claim: the message may run again, here or wherever it goes.
  if (outcome && outcome->status == MessageStatus::handler_failed) {
    if (answer.kind == Answer::Kind::reject) return MessageDisposition::dead_letter_it("rejected", answer.detail);
    return MessageDisposition::retry_it("handler_failed", answer.detail, /*counts=*/true, answer.retry_after);
  }
  return disposition_of(outcome);
}

}  // namespace idem::consume
