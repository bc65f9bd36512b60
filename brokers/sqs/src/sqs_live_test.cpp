// The SQS module against fauxqs (testing/sqs_emulator, started by this test): the AWS SDK as a
// real producer, what a sink writes as other clients read it, visibility kept for a slow handler,
// requeue, dead letters, FIFO queues, a missing queue, and the endpoint going away and coming
// back.
//
// Wrong credentials cannot be tried here: fauxqs takes any signature. How SQS's refusals map is
// checked in idem_sqs_unit_test on AWS's own answers, and the signature itself there too, against
// one recomputed from AWS's definition.

#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <thread>

#include "idem/sqs_broker.hpp"
#include "sqs_test_support.hpp"

namespace idem {
namespace {

using namespace std::chrono_literals;
using sqs_test::Api;
using sqs_test::Emulator;
using Steady = std::chrono::steady_clock;

OutgoingMessage message(std::string id, std::string body, MessageHeaders headers = {}) {
  OutgoingMessage m;
  m.message_id = std::move(id);
  m.content_type = "application/json";
  m.body = std::move(body);
  m.headers = std::move(headers);
  return m;
}

SourceSettings settings() {
  SourceSettings s;
  s.prefetch = 32;
  s.connect_timeout = 2s;
  s.reconnect_min = 50ms;
  s.reconnect_max = 300ms;
  return s;
}

std::unique_ptr<MessageSource> open_source(const std::string& url, const SourceSettings& s = settings()) {
  auto source = open_sqs_source(url, s);
  if (!source) throw std::runtime_error("open source: " + source.error().message);
  return std::move(*source);
}

std::unique_ptr<MessageSink> open_sink(const std::string& url) {
  auto sink = open_sqs_sink(url, {});
  if (!sink) throw std::runtime_error("open sink: " + sink.error().message);
  return std::move(*sink);
}

void publish(MessageSink& sink, const std::vector<OutgoingMessage>& messages) {
  const auto results = sink.publish(messages);
  ASSERT_EQ(results.size(), messages.size());
  for (std::size_t i = 0; i < results.size(); ++i) ASSERT_TRUE(results[i]) << i << ": " << results[i].error().message;
}

// Receives until `count` deliveries came or `limit` passed.
std::vector<Delivery> receive(MessageSource& source, std::size_t count, Steady::duration limit = 10s) {
  std::vector<Delivery> out;
  const auto deadline = Steady::now() + limit;
  while (out.size() < count && Steady::now() < deadline) {
    auto got = source.receive(count - out.size(), 500ms);
    if (!got) {
      ADD_FAILURE() << got.error().message;
      return out;
    }
    for (auto& d : *got) out.push_back(std::move(d));
  }
  return out;
}

// A fresh queue and its default dead-letter queue.
std::string fresh_queue(Api& api, const std::string& prefix) {
  const std::string name = sqs_test::unique_name(prefix);
  api.create_queue(name);
  api.create_queue(name + "-dead-letter");
  return name;
}

TEST(SqsLive, MessagesFromTheAwsSdkAreConsumedWithTheirIds) {
  Api api(Emulator::shared());
  const std::string q = fresh_queue(api, "sdk");
  sqs_test::sdk_produce(api.queue_url(q), {
                                              {"{\"n\":1}", "sdk-1", "application/json", "", "", {{"trace", "t-1"}}},
                                              {"second", "sdk-2", "", "", "", {}},
                                              {"no id here", "", "", "", "", {}},
                                          });
  auto source = open_source(api.url(q));
  auto got = receive(*source, 3);
  ASSERT_EQ(got.size(), 3u);
  std::map<std::string, Delivery> by_body;
  for (auto& d : got) by_body[d.body] = d;
  const Delivery& first = by_body.at("{\"n\":1}");
  EXPECT_TRUE(first.has_message_id);
  EXPECT_EQ(first.message_id, "sdk-1");
  EXPECT_EQ(first.content_type, "application/json");
  EXPECT_EQ(first.headers, (MessageHeaders{{"trace", "t-1"}}));
  EXPECT_EQ(first.delivery_count, 1u);
  EXPECT_FALSE(first.redelivered);
  EXPECT_FALSE(first.broker_ref.empty());  // SQS's MessageId, for logs
  EXPECT_NE(first.message_id, first.broker_ref);
  EXPECT_EQ(by_body.at("second").message_id, "sdk-2");
  // No message_id attribute: no id, never SQS's MessageId in its place.
  EXPECT_FALSE(by_body.at("no id here").has_message_id);
  EXPECT_EQ(by_body.at("no id here").message_id, "");
  ASSERT_TRUE(source->ack(got));
  EXPECT_EQ(api.outstanding(q), 0u);
}

TEST(SqsLive, ASinkWritesWhatOtherClientsRead) {
  Api api(Emulator::shared());
  const std::string q = fresh_queue(api, "sink");
  auto sink = open_sink(api.url(q));
  std::vector<OutgoingMessage> messages;
  for (int i = 0; i < 24; ++i) messages.push_back(message("m-" + std::to_string(i), "{\"i\":" + std::to_string(i) + "}"));
  messages[3].headers = {{"trace", "abc"}, {"tenant.id", "acme"}};
  // Over SQS's 256 KiB batch: sent alone.
  messages.push_back(message("big", std::string(300 * 1024, 'b')));
  publish(*sink, messages);
  EXPECT_EQ(api.outstanding(q), messages.size());
  std::map<std::string, sqs_detail::ReceivedMessage> by_id;
  for (auto& m : api.take_all(q)) {
    ASSERT_TRUE(m.attributes.contains("message_id"));
    EXPECT_EQ(m.attributes.at("message_id").type, "String");
    EXPECT_EQ(m.attributes.at("content_type").value, "application/json");
    by_id[m.attributes.at("message_id").value] = m;
  }
  ASSERT_EQ(by_id.size(), messages.size());
  EXPECT_EQ(by_id.at("m-3").attributes.at("trace").value, "abc");
  EXPECT_EQ(by_id.at("m-3").attributes.at("tenant.id").value, "acme");
  EXPECT_EQ(by_id.at("m-7").body, "{\"i\":7}");
  EXPECT_EQ(by_id.at("big").body.size(), 300u * 1024u);
}

TEST(SqsLive, ADestinationIsAnotherQueueOfTheSameAccount) {
  Api api(Emulator::shared());
  const std::string q = fresh_queue(api, "routes");
  const std::string other = fresh_queue(api, "routed");
  const std::string fifo = sqs_test::unique_name("routed") + ".fifo";
  api.create_queue(fifo);
  auto sink = open_sink(api.url(q));
  OutgoingMessage to_other = message("r-1", "to the other");
  to_other.destination = other;
  OutgoingMessage to_fifo = message("r-2", "to the fifo");
  to_fifo.destination = fifo;
  OutgoingMessage to_nowhere = message("r-3", "lost");
  to_nowhere.destination = sqs_test::unique_name("nowhere");
  const auto results = sink->publish(std::vector<OutgoingMessage>{message("r-0", "default"), to_other, to_fifo, to_nowhere});
  ASSERT_EQ(results.size(), 4u);
  EXPECT_TRUE(results[0]) << results[0].error().message;
  EXPECT_TRUE(results[1]) << results[1].error().message;
  EXPECT_TRUE(results[2]) << results[2].error().message;
  ASSERT_FALSE(results[3]);
  EXPECT_EQ(results[3].error().code, BrokerErrc::refused) << results[3].error().message;
  EXPECT_NE(results[3].error().message.find("queue \"" + to_nowhere.destination + "\" does not exist"), std::string::npos)
      << results[3].error().message;
  EXPECT_EQ(api.take_all(q).at(0).body, "default");
  EXPECT_EQ(api.take_all(other).at(0).body, "to the other");
  const auto f = api.take_all(fifo);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].group_id, "r-2");
}

TEST(SqsLive, ASinkRejectsWhatSqsNeverTakesAndSendsTheRest) {
  Api api(Emulator::shared());
  const std::string q = fresh_queue(api, "reject");
  auto sink = open_sink(api.url(q));
  std::vector<OutgoingMessage> messages = {message("ok-1", "fine"), message("empty", ""), message("binary", "\xff\xfe"),
                                           message("ok-2", "fine too")};
  MessageHeaders many;
  for (int i = 0; i < 9; ++i) many.emplace_back("h" + std::to_string(i), "v");
  messages.push_back(message("crowded", "x", many));
  const auto results = sink->publish(messages);
  ASSERT_EQ(results.size(), 5u);
  EXPECT_TRUE(results[0]);
  EXPECT_TRUE(results[3]);
  for (const std::size_t i : {1u, 2u, 4u}) {
    ASSERT_FALSE(results[i]) << i;
    EXPECT_EQ(results[i].error().code, BrokerErrc::rejected) << results[i].error().message;
    EXPECT_FALSE(results[i].error().retryable());
    EXPECT_FALSE(results[i].error().in_doubt);
    EXPECT_NE(results[i].error().message.find("message \"" + messages[i].message_id + "\""), std::string::npos)
        << results[i].error().message;
  }
  EXPECT_EQ(api.outstanding(q), 2u);
}

TEST(SqsLive, ASlowHandlerKeepsItsMessagePastTheVisibilityTimeout) {
  Api api(Emulator::shared());
  const std::string q = fresh_queue(api, "slow");
  publish(*open_sink(api.url(q)), {message("slow-1", "x")});
  // Two seconds of visibility, held for five: the source extends it every second.
  const std::string url = api.url(q, "&visibility_timeout=2&wait_seconds=1");
  auto holder = open_source(url);
  auto held = receive(*holder, 1);
  ASSERT_EQ(held.size(), 1u);
  auto other = open_source(url);
  const auto until = Steady::now() + 5s;
  while (Steady::now() < until) {
    auto got = other->receive(10, 500ms);
    ASSERT_TRUE(got) << got.error().message;
    ASSERT_TRUE(got->empty()) << "the held message went to another consumer: " << got->front().message_id;
  }
  ASSERT_TRUE(holder->ack(held));
  EXPECT_EQ(api.outstanding(q), 0u);
}

TEST(SqsLive, ARequeuedMessageComesBackWithItsReceiveCount) {
  Api api(Emulator::shared());
  const std::string q = fresh_queue(api, "requeue");
  publish(*open_sink(api.url(q)), {message("again-1", "x")});
  auto source = open_source(api.url(q, "&visibility_timeout=30"));
  auto first = receive(*source, 1);
  ASSERT_EQ(first.size(), 1u);
  EXPECT_EQ(first[0].delivery_count, 1u);
  ASSERT_TRUE(source->requeue(first[0]));
  // Back at once, not after the 30 s of visibility.
  auto second = receive(*source, 1, 3s);
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].message_id, "again-1");
  EXPECT_EQ(second[0].delivery_count, 2u);
  EXPECT_TRUE(second[0].redelivered);
  // The first delivery is settled: acting on it again is stale.
  auto stale = source->requeue(first[0]);
  ASSERT_FALSE(stale);
  EXPECT_EQ(stale.error().code, BrokerErrc::stale);
  ASSERT_TRUE(source->ack(second));
  EXPECT_EQ(api.outstanding(q), 0u);
}

TEST(SqsLive, ADeadLetterCarriesWhyAsAttributesAndTheOriginalIsGone) {
  Api api(Emulator::shared());
  const std::string q = fresh_queue(api, "dead");
  publish(*open_sink(api.url(q)), {message("dead-1", "{\"n\":1}", {{"trace", "t-9"}})});
  auto source = open_source(api.url(q));
  auto got = receive(*source, 1);
  ASSERT_EQ(got.size(), 1u);
  ASSERT_TRUE(source->dead_letter(got[0], DeadLetterReason{"poison", "failed 3 times", "boom: the last one", 3}));
  EXPECT_EQ(api.outstanding(q), 0u);
  const auto dead = api.take_all(q + "-dead-letter");
  ASSERT_EQ(dead.size(), 1u);
  const auto& a = dead[0].attributes;
  EXPECT_EQ(dead[0].body, "{\"n\":1}");
  EXPECT_EQ(a.at("message_id").value, "dead-1");
  EXPECT_EQ(a.at("content_type").value, "application/json");
  EXPECT_EQ(a.at("trace").value, "t-9");
  EXPECT_EQ(a.at("x-idem-reason").value, "poison");
  EXPECT_EQ(a.at("x-idem-detail").value, "failed 3 times");
  EXPECT_EQ(a.at("x-idem-last-error").value, "boom: the last one");
  EXPECT_EQ(a.at("x-idem-attempts").type, "Number");
  EXPECT_EQ(a.at("x-idem-attempts").value, "3");
  EXPECT_EQ(a.at("x-idem-source").value, q);
  // Dead-lettered: no longer held.
  auto again = source->ack(got);
  ASSERT_FALSE(again);
  EXPECT_EQ(again.error().code, BrokerErrc::stale);
}

TEST(SqsLive, FifoQueuesGroupAndDeduplicateByTheMessageId) {
  Api api(Emulator::shared());
  const std::string q = sqs_test::unique_name("fifo") + ".fifo";
  const std::string base = q.substr(0, q.size() - 5);
  api.create_queue(q);
  api.create_queue(base + "-dead-letter.fifo");
  auto sink = open_sink(api.url(q));
  const std::string long_id(200, 'k');
  publish(*sink, {message("order-1", "a"), message("order-1", "a"), message("order-2", "b"), message(long_id, "c")});
  // The second order-1 was dropped by SQS's deduplication.
  EXPECT_EQ(api.outstanding(q), 3u);
  std::map<std::string, sqs_detail::ReceivedMessage> by_body;
  for (auto& m : api.peek(q)) by_body[m.body] = m;
  ASSERT_EQ(by_body.size(), 3u);
  EXPECT_EQ(by_body.at("a").group_id, "order-1");
  EXPECT_EQ(by_body.at("a").deduplication_id, "order-1");
  EXPECT_EQ(by_body.at("b").group_id, "order-2");
  // An id SQS would refuse as a group or deduplication id: its SHA-256.
  EXPECT_EQ(by_body.at("c").deduplication_id->rfind("sha256-", 0), 0u);
  EXPECT_EQ(by_body.at("c").group_id, by_body.at("c").deduplication_id);
  EXPECT_EQ(by_body.at("c").attributes.at("message_id").value, long_id);

  // A FIFO message from another producer without the id attribute: its deduplication id is the id.
  sqs_test::sdk_produce(api.queue_url(q), {{"d", "", "", "g-sdk", "sdk-dedup-1", {}}});
  auto source = open_source(api.url(q));
  auto got = receive(*source, 4);
  ASSERT_EQ(got.size(), 4u);
  std::map<std::string, std::string> id_by_body;
  for (const auto& d : got) {
    EXPECT_TRUE(d.has_message_id) << d.body;
    id_by_body[d.body] = d.message_id;
  }
  EXPECT_EQ(id_by_body.at("a"), "order-1");
  EXPECT_EQ(id_by_body.at("c"), long_id);
  EXPECT_EQ(id_by_body.at("d"), "sdk-dedup-1");
  ASSERT_TRUE(source->ack(got));
  EXPECT_EQ(api.outstanding(q), 0u);
}

TEST(SqsLive, TheOrderingKeyTravelsAsAnAttribute) {
  Api api(Emulator::shared());
  const std::string q = fresh_queue(api, "ordering");
  OutgoingMessage keyed = message("k-1", "keyed", {{"ordering_key", "a user's"}, {"trace", "t-1"}});
  keyed.ordering_key = "pay_7";
  OutgoingMessage bad = message("k-bad", "bad");
  bad.ordering_key = "has a space";
  auto sink = open_sink(api.url(q));
  const auto results = sink->publish(std::vector<OutgoingMessage>{keyed, message("k-2", "plain"), bad});
  ASSERT_EQ(results.size(), 3u);
  EXPECT_TRUE(results[0]) << results[0].error().message;
  EXPECT_TRUE(results[1]) << results[1].error().message;
  ASSERT_FALSE(results[2]);
  EXPECT_EQ(results[2].error().code, BrokerErrc::rejected);
  EXPECT_NE(results[2].error().message.find("ordering key"), std::string::npos) << results[2].error().message;
  EXPECT_EQ(api.outstanding(q), 2u);

  // As other clients read it: one String attribute.
  std::map<std::string, sqs_detail::ReceivedMessage> peeked;
  for (auto& m : api.peek(q)) peeked[m.body] = m;
  ASSERT_EQ(peeked.size(), 2u);
  EXPECT_EQ(peeked.at("keyed").attributes.at("ordering_key").type, "String");
  EXPECT_EQ(peeked.at("keyed").attributes.at("ordering_key").value, "pay_7");
  EXPECT_FALSE(peeked.at("plain").attributes.contains("ordering_key"));

  auto source = open_source(api.url(q));
  auto got = receive(*source, 2);
  ASSERT_EQ(got.size(), 2u);
  std::map<std::string, Delivery> by_id;
  for (auto& d : got) by_id[d.message_id] = d;
  EXPECT_EQ(by_id.at("k-1").ordering_key, "pay_7");
  EXPECT_EQ(by_id.at("k-1").headers, (MessageHeaders{{"trace", "t-1"}})) << "the attribute is the delivery's ordering key";
  EXPECT_EQ(by_id.at("k-2").ordering_key, "") << "published without one";

  // The dead-letter copy keeps it.
  ASSERT_TRUE(source->dead_letter(by_id.at("k-1"), DeadLetterReason{"poison", "failed", "", 3}));
  ASSERT_TRUE(source->ack(std::vector<Delivery>{by_id.at("k-2")}));
  const auto dead = api.take_all(q + "-dead-letter");
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].attributes.at("ordering_key").value, "pay_7");
}

TEST(SqsLive, OnAFifoQueueTheOrderingKeyIsTheMessageGroup) {
  Api api(Emulator::shared());
  const std::string q = sqs_test::unique_name("fifo-ordering") + ".fifo";
  const std::string base = q.substr(0, q.size() - 5);
  api.create_queue(q);
  api.create_queue(base + "-dead-letter.fifo");
  auto sink = open_sink(api.url(q));
  OutgoingMessage first = message("o-1", "first");
  first.ordering_key = "acct_1";
  OutgoingMessage second = message("o-2", "second");
  second.ordering_key = "acct_1";
  publish(*sink, {first, second, message("o-3", "no key")});
  std::map<std::string, sqs_detail::ReceivedMessage> peeked;
  for (auto& m : api.peek(q)) peeked[m.body] = m;
  ASSERT_EQ(peeked.count("first"), 1u);
  EXPECT_EQ(peeked.at("first").group_id, "acct_1");
  EXPECT_EQ(peeked.at("first").deduplication_id, "o-1");
  EXPECT_EQ(peeked.at("first").attributes.at("ordering_key").value, "acct_1");
  // A FIFO group hands out one message at a time: "second" waits behind "first"; "no key" is in
  // a group of its own id, as before.
  ASSERT_EQ(peeked.count("no key"), 1u);
  EXPECT_EQ(peeked.at("no key").group_id, "o-3");

  // Another producer's FIFO message with a group and no attribute: the group is the ordering key.
  sqs_test::sdk_produce(api.queue_url(q), {{"foreign", "o-4", "", "order-42", "", {}}});
  auto source = open_source(api.url(q));
  std::map<std::string, Delivery> by_body;
  const auto deadline = Steady::now() + 20s;
  while (by_body.size() < 4 && Steady::now() < deadline) {
    auto got = receive(*source, 1, 2s);
    for (auto& d : got) {
      ASSERT_TRUE(source->ack(std::vector<Delivery>{d}));  // lets the next of its group come
      by_body[d.body] = d;
    }
  }
  ASSERT_EQ(by_body.size(), 4u);
  EXPECT_EQ(by_body.at("first").ordering_key, "acct_1");
  EXPECT_EQ(by_body.at("second").ordering_key, "acct_1");
  EXPECT_TRUE(by_body.at("first").headers.empty());
  EXPECT_EQ(by_body.at("no key").ordering_key, "") << "the group idem gives a message without one orders nothing";
  EXPECT_EQ(by_body.at("foreign").ordering_key, "order-42");
  EXPECT_EQ(api.outstanding(q), 0u);
}

TEST(SqsLive, AMissingQueueIsOneClearRefusal) {
  Api api(Emulator::shared());
  const std::string missing = sqs_test::unique_name("missing");
  auto check = [&](const BrokerError& e, const std::string& name) {
    EXPECT_EQ(e.code, BrokerErrc::refused) << e.message;
    EXPECT_FALSE(e.retryable());
    EXPECT_NE(e.message.find("queue \"" + name + "\" does not exist"), std::string::npos) << e.message;
    EXPECT_EQ(e.message.find('\n'), std::string::npos) << e.message;
    EXPECT_EQ(e.message.find(sqs_test::kSecret), std::string::npos) << e.message;
  };
  auto source = open_sqs_source(api.url(missing), settings());
  ASSERT_FALSE(source);
  check(source.error(), missing);
  auto sink = open_sqs_sink(api.url(missing), {});
  ASSERT_FALSE(sink);
  check(sink.error(), missing);
  // The queue is there, its dead-letter queue is not.
  const std::string lonely = sqs_test::unique_name("lonely");
  api.create_queue(lonely);
  auto no_dead_letters = open_sqs_source(api.url(lonely), settings());
  ASSERT_FALSE(no_dead_letters);
  check(no_dead_letters.error(), lonely + "-dead-letter");
}

TEST(SqsLive, WakeEndsAWaitingReceive) {
  Api api(Emulator::shared());
  const std::string q = fresh_queue(api, "wake");
  auto source = open_source(api.url(q));
  std::thread waker([&] {
    std::this_thread::sleep_for(200ms);
    source->wake();
  });
  const auto t0 = Steady::now();
  auto got = source->receive(10, 10s);
  waker.join();
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_TRUE(got->empty());
  EXPECT_LT(Steady::now() - t0, 3s);
  // The long poll outlived that receive: a message sent now is handed out by the next one.
  publish(*open_sink(api.url(q)), {message("after-wake", "x")});
  auto next = receive(*source, 1, 5s);
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].message_id, "after-wake");
  ASSERT_TRUE(source->ack(next));
}

TEST(SqsLive, ClosingHandsHeldMessagesBackAtOnce) {
  Api api(Emulator::shared());
  const std::string q = fresh_queue(api, "close");
  publish(*open_sink(api.url(q)), {message("c-1", "x"), message("c-2", "y"), message("c-3", "z")});
  const std::string url = api.url(q, "&visibility_timeout=60");
  {
    auto first = open_source(url);
    EXPECT_EQ(receive(*first, 3).size(), 3u);
  }
  // Not after the 60 s of visibility: at once.
  auto second = open_source(url);
  auto got = receive(*second, 3, 3s);
  ASSERT_EQ(got.size(), 3u);
  for (const auto& d : got) EXPECT_EQ(d.delivery_count, 2u) << d.message_id;
  ASSERT_TRUE(second->ack(got));
}

TEST(SqsLive, TheEndpointGoingAwayIsRetryableAndTheSourceRecovers) {
  Emulator emulator;  // its own: this test kills it
  Api api(emulator);
  const std::string q = fresh_queue(api, "outage");
  auto sink = open_sink(api.url(q));
  auto source = open_source(api.url(q, "&wait_seconds=1"));
  publish(*sink, {message("before", "x")});
  auto before = receive(*source, 1);
  ASSERT_EQ(before.size(), 1u);
  ASSERT_TRUE(source->ack(before));

  emulator.kill();
  auto failed = source->receive(10, 2s);
  ASSERT_FALSE(failed);
  EXPECT_EQ(failed.error().code, BrokerErrc::unavailable) << failed.error().message;
  EXPECT_NE(failed.error().message.find("cannot reach the SQS endpoint"), std::string::npos) << failed.error().message;
  const auto results = sink->publish(std::vector<OutgoingMessage>{message("during", "x")});
  ASSERT_FALSE(results[0]);
  EXPECT_TRUE(results[0].error().retryable()) << results[0].error().message;
  EXPECT_FALSE(results[0].error().in_doubt);  // nothing could be sent
  EXPECT_FALSE(source->ping());
  EXPECT_FALSE(sink->ping());

  // fauxqs keeps nothing: the queues are made again, and the same source and sink go on.
  emulator.start_again();
  Api again(emulator);
  again.create_queue(q);
  again.create_queue(q + "-dead-letter");
  publish(*sink, {message("after", "y")});
  std::vector<Delivery> after;
  const auto deadline = Steady::now() + 10s;
  while (after.empty() && Steady::now() < deadline) {
    auto got = source->receive(10, 500ms);
    if (got) after = std::move(*got);  // errors until the backoff lets it try again
  }
  ASSERT_EQ(after.size(), 1u);
  EXPECT_EQ(after[0].message_id, "after");
  EXPECT_GE(source->reconnects(), 1u);
  ASSERT_TRUE(source->ack(after));
  EXPECT_TRUE(source->ping());
  EXPECT_EQ(again.outstanding(q), 0u);
}

}  // namespace
}  // namespace idem
