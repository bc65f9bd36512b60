#include "webhook_sink.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include "idem/testing/manual_clock.hpp"

namespace idem::relay {
namespace {

class FakeEndpoint final : public client::Transport {
 public:
  std::expected<client::HttpResponse, client::TransportError> perform(const client::HttpRequest& request, Millis) override {
    requests.push_back(request);
    if (answers.empty()) return client::HttpResponse{200, {}, ""};
    auto a = answers.front();
    answers.erase(answers.begin());
    return a;
  }
  std::vector<client::HttpRequest> requests;
  std::vector<std::expected<client::HttpResponse, client::TransportError>> answers;
};

OutgoingMessage message(std::string id) {
  OutgoingMessage m;
  m.message_id = std::move(id);
  m.content_type = "application/json";
  m.headers = {{"event", "payment.succeeded"}};
  m.body = "{}";
  return m;
}

TEST(WebhookSink, PostsEachMessageWithItsKeyAndHeaders) {
  FakeEndpoint endpoint;
  WebhookSink sink("http://u:hunter2hunter2@127.0.0.1:9/receipts", endpoint, Millis(1000));
  EXPECT_EQ(sink.name(), "http://u:***@127.0.0.1:9/receipts");
  const std::vector<OutgoingMessage> batch = {message("a"), message("b")};
  const auto results = sink.publish(batch);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_TRUE(results[0] && results[1]);
  ASSERT_EQ(endpoint.requests.size(), 2u);
  EXPECT_EQ(client::find_header(endpoint.requests[1].headers, "Idempotency-Key"), "b");
  EXPECT_EQ(client::find_header(endpoint.requests[1].headers, "Content-Type"), "application/json");
  EXPECT_EQ(client::find_header(endpoint.requests[1].headers, "Idem-Header-event"), "payment.succeeded");
}

TEST(WebhookSink, WithSecretsEveryPostIsSignedPerStandardWebhooks) {
  FakeEndpoint endpoint;
  // The Standard Webhooks specification's example secret and a second one (a rotation).
  const std::vector<std::string> secrets = {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_MDEyMzQ1Njc4OWFiY2RlZg=="};
  auto signer = webhook::StandardSigner::from_secrets(secrets);
  ASSERT_TRUE(signer.has_value()) << signer.error();
  auto shared = std::make_shared<const webhook::StandardSigner>(std::move(*signer));
  testing::ManualClock clock(from_epoch_ms(1614265330'000));
  WebhookSink sink("http://127.0.0.1:9/receipts", endpoint, Millis(1000), shared, clock);
  OutgoingMessage m = message("msg_p5jXN8AQM9LWM0D4loKWxJek");
  m.body = R"({"test": 2432232314})";
  endpoint.answers.push_back(client::HttpResponse{503, {}, ""});
  const std::vector<OutgoingMessage> batch = {m};
  ASSERT_FALSE(sink.publish(batch)[0]);
  clock.advance(std::chrono::seconds(90));
  ASSERT_TRUE(sink.publish(batch)[0]);
  ASSERT_EQ(endpoint.requests.size(), 2u);
  const auto& first = endpoint.requests[0].headers;
  EXPECT_EQ(client::find_header(first, "Idempotency-Key"), "msg_p5jXN8AQM9LWM0D4loKWxJek");
  EXPECT_EQ(client::find_header(first, "webhook-id"), "msg_p5jXN8AQM9LWM0D4loKWxJek");
  EXPECT_EQ(client::find_header(first, "webhook-timestamp"), "1614265330");
  // The specification's signature for its secret, then the second secret's: a receiver with
  // either one accepts.
  const auto signature = client::find_header(first, "webhook-signature");
  ASSERT_TRUE(signature);
  EXPECT_TRUE(signature->starts_with("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= v1,")) << *signature;
  EXPECT_EQ(std::count(signature->begin(), signature->end(), ','), 2);
  // The retry is signed again at its own time.
  EXPECT_EQ(client::find_header(endpoint.requests[1].headers, "webhook-timestamp"), "1614265420");
  EXPECT_NE(client::find_header(endpoint.requests[1].headers, "webhook-signature"), signature);
}

TEST(WebhookSink, WithoutSecretsNothingIsSigned) {
  FakeEndpoint endpoint;
  WebhookSink sink("http://127.0.0.1:9/receipts", endpoint, Millis(1000));
  const auto request = sink.request_for(message("a"));
  EXPECT_FALSE(client::find_header(request.headers, "webhook-signature"));
  EXPECT_FALSE(client::find_header(request.headers, "webhook-id"));
  EXPECT_EQ(client::find_header(request.headers, "Idempotency-Key"), "a");
}

TEST(WebhookSink, TheOrderingKeyGoesAsIdemOrderingKeyOnce) {
  FakeEndpoint endpoint;
  WebhookSink sink("http://127.0.0.1:9/receipts", endpoint, Millis(1000));
  OutgoingMessage keyed = message("a");
  keyed.ordering_key = "pay_7";
  keyed.headers.emplace_back("ordering_key", "a user's");
  OutgoingMessage plain = message("b");
  plain.headers.emplace_back("ordering_key", "a user's");
  OutgoingMessage bad = message("c");
  bad.ordering_key = "has a space";
  const std::vector<OutgoingMessage> batch = {keyed, plain, bad};
  const auto results = sink.publish(batch);
  ASSERT_EQ(results.size(), 3u);
  EXPECT_TRUE(results[0] && results[1]);
  ASSERT_FALSE(results[2]);
  EXPECT_EQ(results[2].error().code, BrokerErrc::rejected);
  EXPECT_NE(results[2].error().message.find("ordering key"), std::string::npos);
  ASSERT_EQ(endpoint.requests.size(), 2u) << "the invalid key is never sent";
  const Headers& first = endpoint.requests[0].headers;
  EXPECT_EQ(first, (Headers{{"Idempotency-Key", "a"},
                            {"Content-Type", "application/json"},
                            {"Idem-Ordering-Key", "pay_7"},
                            {"Idem-Header-event", "payment.succeeded"}}));
  // Without one: no Idem-Ordering-Key, and the message's header of that name is not sent either.
  EXPECT_EQ(endpoint.requests[1].headers, (Headers{{"Idempotency-Key", "b"},
                                                   {"Content-Type", "application/json"},
                                                   {"Idem-Header-event", "payment.succeeded"}}));
}

TEST(WebhookSink, AnswersDecideRetryOrRefusal) {
  FakeEndpoint endpoint;
  endpoint.answers = {client::HttpResponse{503, {{"Retry-After", "3"}}, "down"},
                      client::HttpResponse{422, {}, "{\"error\":\"no such account\"}"},
                      std::unexpected(client::TransportError{client::TransportErrc::could_not_connect, "refused"})};
  WebhookSink sink("http://127.0.0.1:9/x", endpoint, Millis(1000));
  const std::vector<OutgoingMessage> batch = {message("a"), message("b"), message("c")};
  const auto results = sink.publish(batch);
  ASSERT_EQ(results.size(), 3u);
  ASSERT_FALSE(results[0]);
  EXPECT_EQ(results[0].error().code, BrokerErrc::unavailable);
  EXPECT_EQ(sink.take_retry_after(), Millis(3000));
  EXPECT_FALSE(sink.take_retry_after());
  ASSERT_FALSE(results[1]);
  EXPECT_EQ(results[1].error().code, BrokerErrc::rejected);
  EXPECT_NE(results[1].error().message.find("no such account"), std::string::npos);
  ASSERT_FALSE(results[2]);
  EXPECT_EQ(results[2].error().code, BrokerErrc::unavailable);
  EXPECT_FALSE(results[2].error().in_doubt);  // never connected: the endpoint cannot have it
  // The last POST got no answer: the endpoint is away (the relay counts no attempt then).
  EXPECT_FALSE(sink.ping());
  const std::vector<OutgoingMessage> one = {message("d")};
  EXPECT_TRUE(sink.publish(one)[0]);
  EXPECT_TRUE(sink.ping());
}

}  // namespace
}  // namespace idem::relay
