#include "http_delivery.hpp"

#include <gtest/gtest.h>

#include <mutex>

#include "idem/memory_store.hpp"
#include "idem/testing/manual_clock.hpp"

namespace idem::consume {
namespace {

// The handler, as the transport below the processor (the real one is tested with a real
// handler in tests/consume).
class FakeHandler final : public client::Transport {
 public:
  std::expected<client::HttpResponse, client::TransportError> perform(const client::HttpRequest& request,
                                                                      Millis) override {
    const std::lock_guard lock(mutex);
    requests.push_back(request);
    if (fail) return std::unexpected(client::TransportError{client::TransportErrc::could_not_connect, "refused"});
    return response;
  }
  std::mutex mutex;
  std::vector<client::HttpRequest> requests;
  client::HttpResponse response{200, {}, "ok"};
  bool fail = false;
};

Delivery delivery(std::string id) {
  Delivery d;
  d.message_id = std::move(id);
  d.has_message_id = true;
  d.content_type = "application/json";
  d.body = "{\"payment\":\"pay_1\"}";
  d.headers = {{"event-type", "payment.succeeded"}, {"bad name", "x"}, {"ok", "line\nbreak"}};
  d.redelivered = true;
  d.delivery_count = 2;
  return d;
}

struct Fixture : ::testing::Test {
  MemoryStore store;
  Consumer consumer = *Consumer::create(store, {.name = "receipts"});
  FakeHandler handler;
  HttpDelivery http{consumer, handler, {"http://127.0.0.1:9/events", Millis(1000), "amqp://h/?queue=q"}};
};

TEST_F(Fixture, TheHandlerGetsTheMessageWithItsKeyAndTheDeliveryHeaders) {
  const auto d = delivery("evt-1");
  const auto disposition = http(d, DeliveryAttempt{2, ""});
  EXPECT_EQ(disposition.action, MessageDisposition::Action::ack);
  ASSERT_EQ(handler.requests.size(), 1u);
  const auto& r = handler.requests[0];
  EXPECT_EQ(r.method, "POST");
  EXPECT_EQ(r.url, "http://127.0.0.1:9/events");
  EXPECT_EQ(r.body, d.body);
  EXPECT_EQ(client::find_header(r.headers, "Idempotency-Key"), "evt-1");
  EXPECT_EQ(client::find_header(r.headers, "Content-Type"), "application/json");
  EXPECT_EQ(client::find_header(r.headers, "Idem-Source"), "amqp://h/?queue=q");
  EXPECT_EQ(client::find_header(r.headers, "Idem-Delivery-Attempt"), "2");
  EXPECT_EQ(client::find_header(r.headers, "Idem-Redelivered"), "true");
  EXPECT_EQ(client::find_header(r.headers, "Idem-Header-event-type"), "payment.succeeded");
  EXPECT_FALSE(client::find_header(r.headers, "Idem-Header-ok"));  // a value HTTP cannot carry
  EXPECT_FALSE(client::find_header(r.headers, "Idem-Ordering-Key"));  // the delivery has none
  EXPECT_EQ(r.headers.size(), 6u);
}

TEST_F(Fixture, TheOrderingKeyGoesWithTheDeliveryHeadersWhenThereIsOne) {
  auto d = delivery("evt-2");
  d.ordering_key = "pay_7";
  const auto r = http.request_for(d, DeliveryAttempt{1, ""});
  EXPECT_EQ(client::find_header(r.headers, "Idem-Ordering-Key"), "pay_7");
  ASSERT_EQ(r.headers.size(), 7u);
  // After the delivery's other facts, before the message's own headers.
  EXPECT_EQ(r.headers[4].name, "Idem-Redelivered");
  EXPECT_EQ(r.headers[5], (Header{"Idem-Ordering-Key", "pay_7"}));
  EXPECT_EQ(r.headers[6].name, "Idem-Header-event-type");
  EXPECT_EQ(http(d, DeliveryAttempt{1, ""}).action, MessageDisposition::Action::ack);
  ASSERT_EQ(handler.requests.size(), 1u);
  EXPECT_EQ(client::find_header(handler.requests[0].headers, "Idem-Ordering-Key"), "pay_7");

  d.ordering_key = "line\nbreak";  // no source hands this out; never sent as it is
  EXPECT_FALSE(client::find_header(http.request_for(d, DeliveryAttempt{1, ""}).headers, "Idem-Ordering-Key"));
}

TEST_F(Fixture, WithASignerEveryPostIsSignedPerStandardWebhooks) {
  // The Standard Webhooks specification's example secret and a second one (a rotation).
  const std::vector<std::string> secrets = {"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_MDEyMzQ1Njc4OWFiY2RlZg=="};
  auto signer = webhook::StandardSigner::from_secrets(secrets);
  ASSERT_TRUE(signer.has_value()) << signer.error();
  testing::ManualClock clock(from_epoch_ms(1614265330'000));
  HttpDeliveryOptions options{"http://127.0.0.1:9/events", Millis(1000), "amqp://h/?queue=q"};
  options.signer = std::make_shared<const webhook::StandardSigner>(std::move(*signer));
  options.clock = &clock;
  HttpDelivery signing{consumer, handler, options};
  auto d = delivery("msg_p5jXN8AQM9LWM0D4loKWxJek");
  d.body = R"({"test": 2432232314})";
  const auto r = signing.request_for(d, DeliveryAttempt{1, ""});
  EXPECT_EQ(client::find_header(r.headers, "Idempotency-Key"), "msg_p5jXN8AQM9LWM0D4loKWxJek");
  EXPECT_EQ(client::find_header(r.headers, "webhook-id"), "msg_p5jXN8AQM9LWM0D4loKWxJek");
  EXPECT_EQ(client::find_header(r.headers, "webhook-timestamp"), "1614265330");
  const auto signature = client::find_header(r.headers, "webhook-signature");
  ASSERT_TRUE(signature);
  // The specification's signature for its secret, then the second secret's.
  EXPECT_TRUE(signature->starts_with("v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE= v1,")) << *signature;
  // Every other header as without a signer, the signature's three last.
  EXPECT_EQ(r.headers.size(), 9u);
  EXPECT_EQ(r.headers[6].name, "webhook-id");
  // What is sent is what request_for makes: signed, at the clock's time.
  clock.advance(std::chrono::seconds(5));
  EXPECT_EQ(signing(d, DeliveryAttempt{1, ""}).action, MessageDisposition::Action::ack);
  ASSERT_EQ(handler.requests.size(), 1u);
  EXPECT_EQ(client::find_header(handler.requests[0].headers, "webhook-timestamp"), "1614265335");
  // Without a signer nothing is added (the fixture's delivery).
  EXPECT_FALSE(client::find_header(http.request_for(d, DeliveryAttempt{1, ""}).headers, "webhook-signature"));
}

TEST_F(Fixture, AProcessedMessageIsNeverPostedAgain) {
  EXPECT_EQ(http(delivery("evt-1"), {}).reason, "processed");
  EXPECT_EQ(http(delivery("evt-1"), {}).reason, "duplicate");
  EXPECT_EQ(handler.requests.size(), 1u);
}

TEST_F(Fixture, RetryableAnswersAreRetriedAndCountedOthersDeadLettered) {
  for (int status : {408, 409, 425, 429, 500, 502, 503}) {
    handler.response = {status, {{"Retry-After", "7"}}, "busy"};
    const auto d = http(delivery("retry-" + std::to_string(status)), {});
    EXPECT_EQ(d.action, MessageDisposition::Action::retry) << status;
    EXPECT_TRUE(d.counts_as_attempt);
    ASSERT_TRUE(d.retry_after) << status;
    EXPECT_EQ(*d.retry_after, Millis(7000));
    EXPECT_NE(d.detail.find("answered " + std::to_string(status) + ": busy"), std::string::npos) << d.detail;
  }
  for (int status : {400, 401, 404, 422, 301}) {
    handler.response = {status, {}, "{\"error\":\"bad amount\"}"};
    const auto d = http(delivery("reject-" + std::to_string(status)), {});
    EXPECT_EQ(d.action, MessageDisposition::Action::dead_letter) << status;
    EXPECT_EQ(d.reason, "rejected");
    EXPECT_NE(d.detail.find("bad amount"), std::string::npos);
  }
  handler.fail = true;
  const auto down = http(delivery("down"), {});
  EXPECT_EQ(down.action, MessageDisposition::Action::retry);
  EXPECT_NE(down.detail.find("did not answer"), std::string::npos);
  // None of them was recorded: once the handler takes it, it runs.
  handler.fail = false;
  handler.response = {201, {}, ""};
  EXPECT_EQ(http(delivery("retry-503"), {}).reason, "processed");
}

TEST_F(Fixture, TheEffectAloneSaysWhatEachAnswerMeansWithoutTouchingTheStore) {
  handler.response = {201, {}, "created"};
  auto ok = http.effect(delivery("e-1"), {});
  ASSERT_TRUE(ok);
  EXPECT_EQ(*ok, "HTTP 201");
  handler.response = {503, {{"Retry-After", "2"}}, "busy"};
  auto busy = http.effect(delivery("e-2"), {});
  ASSERT_FALSE(busy);
  EXPECT_EQ(busy.error().action, MessageDisposition::Action::retry);
  EXPECT_EQ(busy.error().reason, "handler_failed");
  EXPECT_TRUE(busy.error().counts_as_attempt);
  EXPECT_EQ(busy.error().retry_after, Millis(2000));
  handler.response = {422, {}, "no such account"};
  auto bad = http.effect(delivery("e-3"), {});
  ASSERT_FALSE(bad);
  EXPECT_EQ(bad.error().action, MessageDisposition::Action::dead_letter);
  EXPECT_EQ(bad.error().reason, "rejected");
  // The loop claims and records; the effect never does.
  for (const char* id : {"e-1", "e-2", "e-3"}) {
    auto record = BlockingStore(store).get({"consumer receipts", id});
    ASSERT_TRUE(record);
    EXPECT_FALSE(record->has_value()) << id;
  }
}

}  // namespace
}  // namespace idem::consume
