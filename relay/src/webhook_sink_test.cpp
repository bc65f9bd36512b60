#include "webhook_sink.hpp"

#include <gtest/gtest.h>

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
