// The Kafka module against librdkafka's mock cluster (idem-kafka-mock, started by the test):
// records from a real producer (kcat), what is committed across consumer restarts, requeue in
// place, dead letters, a partition taken away by a rebalance, wake(), a publish that cannot
// reach its leader.

#include "idem/kafka_broker.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "consumer_conf.hpp"
#include "kafka_test_support.hpp"

namespace idem {
namespace {

using namespace std::chrono_literals;
using kafka_test::MockCluster;
using Steady = std::chrono::steady_clock;

// Short group timings: the mock's rebalances wait session.timeout.ms - 1 s.
constexpr const char* kFastGroup = "&session_timeout_ms=6000&heartbeat_interval_ms=500&commit_interval_ms=0";

struct Topic {
  MockCluster& cluster;
  std::string name;
  std::string group;

  explicit Topic(int partitions, MockCluster& c = MockCluster::shared())
      : cluster(c), name(kafka_test::unique_name("live")), group(kafka_test::unique_name("live-group")) {
    cluster.create_topic(name, partitions);
    cluster.create_topic(name + ".dead-letter", 1);
  }

  std::string source_url(const std::string& extra = "") const {
    return "kafka://" + cluster.bootstrap() + "/" + name + "?group=" + group + kFastGroup + extra;
  }
  std::string sink_url() const { return "kafka://" + cluster.bootstrap() + "/" + name; }

  std::unique_ptr<MessageSource> source(const std::string& extra = "") const {
    auto s = open_kafka_source(source_url(extra));
    EXPECT_TRUE(s) << s.error().message;
    return s ? std::move(*s) : nullptr;
  }
  std::unique_ptr<MessageSink> sink() const {
    auto s = open_kafka_sink(sink_url());
    EXPECT_TRUE(s) << s.error().message;
    return s ? std::move(*s) : nullptr;
  }
  std::size_t uncommitted() const { return kafka_test::uncommitted(cluster.bootstrap(), name, group); }
};

OutgoingMessage message(std::string id, std::string body = "x", MessageHeaders headers = {}) {
  OutgoingMessage m;
  m.message_id = std::move(id);
  m.content_type = "application/json";
  m.body = std::move(body);
  m.headers = std::move(headers);
  return m;
}

void publish(MessageSink& sink, const std::vector<OutgoingMessage>& messages) {
  const auto results = sink.publish(messages);
  ASSERT_EQ(results.size(), messages.size());
  for (const auto& r : results) ASSERT_TRUE(r) << r.error().message;
}

// Receives until `n` deliveries came (or `limit` passed).
std::vector<Delivery> receive_n(MessageSource& source, std::size_t n, Steady::duration limit = 30s) {
  std::vector<Delivery> out;
  const auto deadline = Steady::now() + limit;
  while (out.size() < n && Steady::now() < deadline) {
    auto got = source.receive(n - out.size(), 200ms);
    EXPECT_TRUE(got) << got.error().message;
    if (!got) break;
    for (auto& d : *got) out.push_back(std::move(d));
  }
  return out;
}

std::set<std::string> ids_of(const std::vector<Delivery>& deliveries) {
  std::set<std::string> ids;
  for (const auto& d : deliveries) ids.insert(d.message_id);
  return ids;
}

// Nothing more arrives for a while.
void expect_nothing_more(MessageSource& source, Steady::duration quiet = 1500ms) {
  const auto deadline = Steady::now() + quiet;
  while (Steady::now() < deadline) {
    auto got = source.receive(10, 100ms);
    ASSERT_TRUE(got) << got.error().message;
    for (const auto& d : *got) ADD_FAILURE() << "unexpected delivery " << d.broker_ref << " id " << d.message_id;
  }
}

TEST(KafkaLive, RecordsFromKcatAreConsumedWithTheirIdHeadersAndKey) {
  Topic topic(1);
  const std::string& bootstrap = topic.cluster.bootstrap();
  kafka_test::kcat_produce(bootstrap, topic.name, R"({"n":1})",
                           {{"message_id", "kc-1"}, {"content_type", "application/json"}, {"tenant", "acme"}});
  kafka_test::kcat_produce(bootstrap, topic.name, "no id header", {{"tenant", "globex"}}, std::string("kc-key-2"));

  auto by_header = topic.source();
  ASSERT_TRUE(by_header);
  auto got = receive_n(*by_header, 2);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(got[0].has_message_id);
  EXPECT_EQ(got[0].message_id, "kc-1");
  EXPECT_EQ(got[0].content_type, "application/json");
  EXPECT_EQ(got[0].body, R"({"n":1})");
  EXPECT_EQ(got[0].headers, (MessageHeaders{{"tenant", "acme"}}));
  EXPECT_EQ(got[0].delivery_count, 1u);
  EXPECT_FALSE(got[0].redelivered);
  EXPECT_EQ(got[0].broker_ref, topic.name + "/0/0");
  EXPECT_EQ(got[0].ordering_key, "");  // no key, no ordering_key header
  EXPECT_FALSE(got[1].has_message_id);  // kcat gave it a key, not the header
  EXPECT_EQ(got[1].body, "no id header");
  EXPECT_EQ(got[1].ordering_key, "kc-key-2");  // a keyed record without the header: the key orders
  ASSERT_TRUE(by_header->ack(got));
  by_header.reset();
  EXPECT_EQ(topic.uncommitted(), 0u);

  // The same records read with id_from=key, by another group: the key is the id.
  auto by_key = open_kafka_source("kafka://" + bootstrap + "/" + topic.name + "?group=" + kafka_test::unique_name("keys") +
                                  kFastGroup + "&id_from=key");
  ASSERT_TRUE(by_key) << by_key.error().message;
  auto keyed = receive_n(**by_key, 2);
  ASSERT_EQ(keyed.size(), 2u);
  EXPECT_FALSE(keyed[0].has_message_id);
  EXPECT_EQ(keyed[0].headers, (MessageHeaders{{"message_id", "kc-1"}, {"tenant", "acme"}}));
  EXPECT_TRUE(keyed[1].has_message_id);
  EXPECT_EQ(keyed[1].message_id, "kc-key-2");
  EXPECT_EQ(keyed[1].ordering_key, "") << "with id_from=key the key is the id, not an ordering key";
}

TEST(KafkaLive, TheOrderingKeyTravelsAsTheRecordKeyAndAHeader) {
  Topic topic(3);
  auto sink = topic.sink();
  ASSERT_TRUE(sink);
  OutgoingMessage keyed = message("evt-1", R"({"a":1})", {{"ordering_key", "a user's"}, {"tenant", "acme"}});
  keyed.ordering_key = "pay_7";
  OutgoingMessage second = message("evt-2", R"({"a":2})");
  second.ordering_key = "pay_7";
  publish(*sink, {keyed, message("evt-3"), second});

  // As other clients read them: the ordering key is the key (one partition for the key) and the
  // header, once; without one, the id is the key and there is no header.
  const auto records = kafka_test::read_topic(topic.cluster.bootstrap(), topic.name);
  ASSERT_EQ(records.size(), 3u);
  std::map<std::string, kafka_test::RawRecord> by_id;
  for (const auto& r : records) by_id[r.headers.at("message_id")] = r;
  EXPECT_EQ(by_id.at("evt-1").key, "pay_7");
  EXPECT_EQ(by_id.at("evt-1").headers, (std::map<std::string, std::string>{{"message_id", "evt-1"},
                                                                            {"content_type", "application/json"},
                                                                            {"ordering_key", "pay_7"},
                                                                            {"tenant", "acme"}}));
  EXPECT_EQ(by_id.at("evt-2").key, "pay_7");
  EXPECT_EQ(by_id.at("evt-2").partition, by_id.at("evt-1").partition);
  EXPECT_LT(by_id.at("evt-1").offset, by_id.at("evt-2").offset);
  EXPECT_EQ(by_id.at("evt-3").key, "evt-3");
  EXPECT_FALSE(by_id.at("evt-3").headers.contains("ordering_key"));

  // A record of a foreign producer with both: the header is the ordering key.
  kafka_test::kcat_produce(topic.cluster.bootstrap(), topic.name, "foreign", {{"message_id", "evt-4"}, {"ordering_key", "acct_1"}},
                           std::string("some-key"));

  auto source = topic.source();
  ASSERT_TRUE(source);
  auto got = receive_n(*source, 4);
  ASSERT_EQ(got.size(), 4u);
  std::map<std::string, Delivery> delivered;
  for (auto& d : got) delivered[d.message_id] = d;
  EXPECT_EQ(delivered.at("evt-1").ordering_key, "pay_7");
  EXPECT_EQ(delivered.at("evt-1").headers, (MessageHeaders{{"tenant", "acme"}})) << "the header is the delivery's ordering key";
  EXPECT_EQ(delivered.at("evt-2").ordering_key, "pay_7");
  EXPECT_EQ(delivered.at("evt-3").ordering_key, "") << "a message published without an ordering key has none";
  EXPECT_EQ(delivered.at("evt-4").ordering_key, "acct_1");
  EXPECT_TRUE(delivered.at("evt-4").headers.empty());

  // The dead-letter copy keeps it (its key stays the message id, as before).
  ASSERT_TRUE(source->dead_letter(delivered.at("evt-1"), DeadLetterReason{"poison", "failed", "", 3}));
  ASSERT_TRUE(source->ack(std::vector<Delivery>{delivered.at("evt-2"), delivered.at("evt-3"), delivered.at("evt-4")}));
  source.reset();
  const auto dead = kafka_test::read_topic(topic.cluster.bootstrap(), topic.name + ".dead-letter");
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].key, "evt-1");
  EXPECT_EQ(dead[0].headers.at("ordering_key"), "pay_7");
}

TEST(KafkaLive, AMessageWithAnInvalidOrderingKeyIsRejectedAndTheOthersGo) {
  Topic topic(1);
  auto sink = topic.sink();
  ASSERT_TRUE(sink);
  OutgoingMessage bad = message("bad-1");
  bad.ordering_key = "has a space";
  OutgoingMessage too_long = message("bad-2");
  too_long.ordering_key = std::string(kMaxOrderingKey + 1, 'k');
  OutgoingMessage longest = message("ok-2");
  longest.ordering_key = std::string(kMaxOrderingKey, 'k');
  const auto results = sink->publish(std::vector<OutgoingMessage>{message("ok-1"), bad, too_long, longest});
  ASSERT_EQ(results.size(), 4u);
  EXPECT_TRUE(results[0]);
  ASSERT_FALSE(results[1]);
  EXPECT_EQ(results[1].error().code, BrokerErrc::rejected);
  EXPECT_FALSE(results[1].error().in_doubt);
  EXPECT_NE(results[1].error().message.find("ordering key"), std::string::npos) << results[1].error().message;
  ASSERT_FALSE(results[2]);
  EXPECT_EQ(results[2].error().code, BrokerErrc::rejected);
  EXPECT_TRUE(results[3]) << results[3].error().message;
  const auto records = kafka_test::read_topic(topic.cluster.bootstrap(), topic.name);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].key, "ok-1");
  EXPECT_EQ(records[1].key, std::string(kMaxOrderingKey, 'k'));
}

TEST(KafkaLive, ASinkWritesTheIdAsKeyAndHeaderForOtherClients) {
  Topic topic(2);
  auto sink = topic.sink();
  ASSERT_TRUE(sink);
  publish(*sink, {message("pay-1", R"({"a":1})", {{"tenant", "acme"}})});
  const auto records = kafka_test::read_topic(topic.cluster.bootstrap(), topic.name);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0].key, "pay-1");
  EXPECT_EQ(records[0].value, R"({"a":1})");
  EXPECT_EQ(records[0].headers, (std::map<std::string, std::string>{
                                    {"message_id", "pay-1"}, {"content_type", "application/json"}, {"tenant", "acme"}}));
}

TEST(KafkaLive, AnUnackedRecordComesBackAfterTheConsumerClosesAndDoneOnesBeforeItDoNot) {
  Topic topic(1);
  auto sink = topic.sink();
  ASSERT_TRUE(sink);
  publish(*sink, {message("a"), message("b"), message("c")});
  {
    auto first = topic.source();
    ASSERT_TRUE(first);
    auto got = receive_n(*first, 3);
    ASSERT_EQ(got.size(), 3u);
    // a and c are done, b is not: the commit stops at b.
    ASSERT_TRUE(first->ack(std::vector<Delivery>{got[0], got[2]}));
  }  // closed without acking b
  EXPECT_EQ(kafka_test::committed_offsets(topic.cluster.bootstrap(), topic.name, topic.group)[0], 1);
  EXPECT_EQ(topic.uncommitted(), 2u);

  auto second = topic.source();
  ASSERT_TRUE(second);
  auto again = receive_n(*second, 2);
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[0].message_id, "b");  // never acked: delivered again
  EXPECT_EQ(again[1].message_id, "c");  // done, but after b: delivered again (a duplicate to the store)
  EXPECT_EQ(again[0].delivery_count, 1u);  // Kafka keeps no count; this source counts its own
  ASSERT_TRUE(second->ack(again));
  expect_nothing_more(*second, 1s);  // a never comes back
  second.reset();
  EXPECT_EQ(topic.uncommitted(), 0u);
}

TEST(KafkaLive, CommitsSurviveAConsumerRestart) {
  Topic topic(3);
  auto sink = topic.sink();
  ASSERT_TRUE(sink);
  std::vector<OutgoingMessage> first_batch;
  for (int i = 0; i < 20; ++i) first_batch.push_back(message("first-" + std::to_string(i)));
  publish(*sink, first_batch);
  {
    auto source = topic.source();
    ASSERT_TRUE(source);
    auto got = receive_n(*source, 20);
    ASSERT_EQ(got.size(), 20u);
    ASSERT_TRUE(source->ack(got));
  }
  EXPECT_EQ(topic.uncommitted(), 0u);

  publish(*sink, {message("second-0"), message("second-1")});
  auto restarted = topic.source();
  ASSERT_TRUE(restarted);
  auto got = receive_n(*restarted, 2);
  EXPECT_EQ(ids_of(got), (std::set<std::string>{"second-0", "second-1"}));
  ASSERT_TRUE(restarted->ack(got));
  expect_nothing_more(*restarted);
}

TEST(KafkaLive, ARequeuedRecordIsDeliveredAgainWhileLaterOnesGoOn) {
  Topic topic(1);
  auto sink = topic.sink();
  ASSERT_TRUE(sink);
  publish(*sink, {message("r0"), message("r1")});
  auto source = topic.source("&requeue_delay_ms=300");
  ASSERT_TRUE(source);
  auto got = receive_n(*source, 2);
  ASSERT_EQ(got.size(), 2u);
  ASSERT_TRUE(source->requeue(got[0]));
  ASSERT_TRUE(source->ack(std::vector<Delivery>{got[1]}));
  // r1 is done, but r0 waits for its retry: the commit stays before r0.
  auto empty = source->receive(10, 0ms);
  ASSERT_TRUE(empty);
  EXPECT_TRUE(empty->empty());
  EXPECT_EQ(topic.uncommitted(), 2u);

  auto again = receive_n(*source, 1, 5s);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0].message_id, "r0");
  EXPECT_TRUE(again[0].redelivered);
  EXPECT_EQ(again[0].delivery_count, 2u);
  ASSERT_TRUE(source->ack(again));
  (void)source->receive(0, 0ms);
  source.reset();
  EXPECT_EQ(topic.uncommitted(), 0u);
}

TEST(KafkaLive, ADeadLetterIsACopyWithWhyAndTheOriginalCountsAsDone) {
  Topic topic(1);
  auto sink = topic.sink();
  ASSERT_TRUE(sink);
  publish(*sink, {message("dl-1", R"({"bad":true})", {{"tenant", "acme"}, {"x-idem-reason", "an old one"}}), message("ok-1")});
  auto source = topic.source();
  ASSERT_TRUE(source);
  auto got = receive_n(*source, 2);
  ASSERT_EQ(got.size(), 2u);
  ASSERT_TRUE(source->dead_letter(got[0], DeadLetterReason{"poison", "failed 3 times", "handler said no", 3}));
  ASSERT_TRUE(source->ack(std::vector<Delivery>{got[1]}));
  EXPECT_TRUE(source->ack(std::vector<Delivery>{got[0]}));  // acking a dead-lettered one again is harmless
  source.reset();
  EXPECT_EQ(topic.uncommitted(), 0u);

  const auto dead = kafka_test::read_topic(topic.cluster.bootstrap(), topic.name + ".dead-letter");
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].key, "dl-1");
  EXPECT_EQ(dead[0].value, R"({"bad":true})");
  auto h = dead[0].headers;
  EXPECT_EQ(h["message_id"], "dl-1");
  EXPECT_EQ(h["content_type"], "application/json");
  EXPECT_EQ(h["tenant"], "acme");
  EXPECT_EQ(h["x-idem-reason"], "poison");
  EXPECT_EQ(h["x-idem-detail"], "failed 3 times");
  EXPECT_EQ(h["x-idem-last-error"], "handler said no");
  EXPECT_EQ(h["x-idem-attempts"], "3");
  EXPECT_EQ(h["x-idem-source"], topic.name);
  EXPECT_EQ(h["x-idem-partition"], "0");
  EXPECT_EQ(h["x-idem-offset"], "0");
}

TEST(KafkaLive, APartitionMovedByARebalanceMakesItsHeldDeliveriesStale) {
  Topic topic(2);
  auto sink = topic.sink();
  ASSERT_TRUE(sink);
  std::vector<OutgoingMessage> messages;
  for (int i = 0; i < 16; ++i) messages.push_back(message("move-" + std::to_string(i)));
  publish(*sink, messages);

  std::vector<std::string> warnings;
  auto a = open_kafka_source(topic.source_url("&revoke_timeout_ms=500"), {},
                             KafkaEvents{[&](std::string_view line) { warnings.emplace_back(line); }});
  ASSERT_TRUE(a) << a.error().message;
  auto held = receive_n(**a, 16);
  ASSERT_EQ(held.size(), 16u);
  std::set<std::string> partitions;
  for (const auto& d : held) partitions.insert(d.broker_ref.substr(0, d.broker_ref.rfind('/')));
  ASSERT_EQ(partitions.size(), 2u) << "the keys all landed in one partition";

  // b joins; a holds everything unacked through the rebalance and past revoke_timeout.
  auto b = topic.source("&revoke_timeout_ms=500");
  ASSERT_TRUE(b);
  std::vector<Delivery> moved;
  const auto deadline = Steady::now() + 60s;
  while (moved.empty() && Steady::now() < deadline) {
    ASSERT_TRUE((*a)->receive(0, 0ms));
    auto got = b->receive(16, 100ms);
    ASSERT_TRUE(got) << got.error().message;
    for (auto& d : *got) moved.push_back(std::move(d));
  }
  ASSERT_FALSE(moved.empty()) << "the rebalance never gave b a partition";
  // The rest of the moved partition's records (it has fewer than 16: this waits out the 3 s).
  for (auto& d : receive_n(*b, 16 - moved.size(), 3s)) moved.push_back(std::move(d));

  std::size_t stale = 0, acked = 0;
  std::set<std::string> stale_ids;
  for (const auto& d : held) {
    auto r = (*a)->ack(std::vector<Delivery>{d});
    if (r) {
      ++acked;
    } else {
      EXPECT_EQ(r.error().code, BrokerErrc::stale) << r.error().message;
      ++stale;
      stale_ids.insert(d.message_id);
    }
  }
  // The range assignor is eager: the rebalance revoked both of a's partitions (a got one back,
  // as a new assignment), so everything a held went stale; b got the other partition's records.
  EXPECT_EQ(stale, held.size());
  EXPECT_EQ(acked, 0u);
  const auto moved_ids = ids_of(moved);
  EXPECT_LT(moved_ids.size(), held.size());
  for (const auto& id : moved_ids) EXPECT_TRUE(stale_ids.contains(id)) << id << " went to b but a never held it";
  bool told = false;
  for (const auto& w : warnings) told = told || w.find("revoked with") != std::string::npos;
  EXPECT_TRUE(told) << "a revocation that ran out of time is told to on_warning";
}

TEST(KafkaLive, WakeEndsAWaitingReceive) {
  Topic topic(1);
  auto source = topic.source();
  ASSERT_TRUE(source);
  std::thread waker([&] {
    std::this_thread::sleep_for(300ms);
    source->wake();
  });
  const auto start = Steady::now();
  auto got = source->receive(10, 20s);
  const auto took = Steady::now() - start;
  waker.join();
  ASSERT_TRUE(got) << got.error().message;
  EXPECT_LT(took, 5s);
}

// The source takes records out of librdkafka only when it has room for them, from one queue
// that every assigned partition's queue is forwarded to (source.cpp). What bounds memory then
// is librdkafka's fetch decision, which must look at the forwarded queue: with a consumer
// configured like the source's, records are fetched ahead up to kFetchAheadKbytes (plus one
// fetch response per partition), not the whole topic. (The mock keeps about 5 MiB a partition,
// hence 8 partitions of 4 MiB; kFetchAheadRecords, 100,000, is out of its reach.)
TEST(KafkaLive, WhatTheSourcesConsumerFetchesAheadIsBounded) {
  constexpr int kPartitions = 8;
  constexpr std::size_t kBodyBytes = 4096;
  constexpr std::size_t kRecords = kPartitions * 1024;  // 32 MiB in all
  Topic topic(kPartitions);
  {
    auto sink = topic.sink();
    ASSERT_TRUE(sink);
    std::vector<OutgoingMessage> batch;
    for (std::size_t i = 0; i < kRecords; ++i) {
      batch.push_back(message("m" + std::to_string(i), std::string(kBodyBytes, 'x')));
      if (batch.size() == 256) {
        publish(*sink, batch);
        batch.clear();
      }
    }
  }

  auto url = parse_kafka_url(topic.source_url() + "&start=earliest", KafkaUrlRole::source);
  ASSERT_TRUE(url) << url.error().message;
  kafka_detail::ClientEvents events;
  auto conf = kafka_detail::consumer_conf(*url, "fetch-ahead-test", 5000ms, 100ms, 1000ms, events);
  ASSERT_TRUE(conf) << conf.error().message;
  auto rk = kafka_detail::create(RD_KAFKA_CONSUMER, std::move(*conf), "test");
  ASSERT_TRUE(rk) << rk.error().message;
  rd_kafka_poll_set_consumer(rk->get());
  rd_kafka_queue_t* records = rd_kafka_queue_new(rk->get());
  rd_kafka_topic_partition_list_t* all = rd_kafka_topic_partition_list_new(kPartitions);
  for (int p = 0; p < kPartitions; ++p) rd_kafka_topic_partition_list_add(all, topic.name.c_str(), p)->offset = 0;
  ASSERT_EQ(rd_kafka_assign(rk->get(), all), RD_KAFKA_RESP_ERR_NO_ERROR);
  rd_kafka_topic_partition_list_destroy(all);
  for (int p = 0; p < kPartitions; ++p) {
    rd_kafka_queue_t* q = rd_kafka_queue_get_partition(rk->get(), topic.name.c_str(), p);
    ASSERT_NE(q, nullptr);
    rd_kafka_queue_forward(q, records);
    rd_kafka_queue_destroy(q);
  }

  // Events served, records left alone: what librdkafka fetches meanwhile piles up in `records`.
  std::size_t most = 0;
  const auto until = Steady::now() + 4s;
  while (Steady::now() < until) {
    if (rd_kafka_message_t* m = rd_kafka_consumer_poll(rk->get(), 100)) rd_kafka_message_destroy(m);
    most = std::max(most, rd_kafka_queue_length(records));
  }
  const std::size_t bound_bytes = kafka_detail::kFetchAheadKbytes * 1024 + kPartitions * 1024 * 1024;
  EXPECT_LE(most * kBodyBytes, bound_bytes) << most << " records fetched ahead: past librdkafka's bound";
  EXPECT_GE(most * kBodyBytes, kafka_detail::kFetchAheadKbytes * 1024 / 2) << most << " records fetched ahead";
  EXPECT_LT(most, kRecords);

  // Taking records makes room, and every record comes.
  std::size_t taken = 0;
  std::array<rd_kafka_message_t*, 256> batch{};
  const auto deadline = Steady::now() + 30s;
  while (taken < kRecords && Steady::now() < deadline) {
    const ssize_t n = rd_kafka_consume_batch_queue(records, 200, batch.data(), batch.size());
    for (ssize_t i = 0; i < n; ++i) {
      if (batch[static_cast<std::size_t>(i)]->err == RD_KAFKA_RESP_ERR_NO_ERROR) ++taken;
      rd_kafka_message_destroy(batch[static_cast<std::size_t>(i)]);
    }
    if (rd_kafka_message_t* m = rd_kafka_consumer_poll(rk->get(), 0)) rd_kafka_message_destroy(m);
  }
  EXPECT_EQ(taken, kRecords);
  rd_kafka_queue_destroy(records);
  rd_kafka_consumer_close(rk->get());
}

TEST(KafkaLive, AMissingTopicIsRefusedAtOpenWithItsName) {
  // The mock creates any topic a metadata request names: "no such topic" is played with the
  // error it then answers for that topic.
  MockCluster& cluster = MockCluster::shared();
  const std::string missing = kafka_test::unique_name("missing");
  ASSERT_EQ(cluster.command("topic-error " + missing + " 3"), "ok");  // UNKNOWN_TOPIC_OR_PART
  auto source = open_kafka_source("kafka://" + cluster.bootstrap() + "/" + missing + "?group=g");
  ASSERT_FALSE(source);
  EXPECT_EQ(source.error().code, BrokerErrc::refused) << source.error().message;
  EXPECT_NE(source.error().message.find("topic \"" + missing + "\" does not exist"), std::string::npos)
      << source.error().message;
  auto sink = open_kafka_sink("kafka://" + cluster.bootstrap() + "/" + missing);
  ASSERT_FALSE(sink);
  EXPECT_EQ(sink.error().code, BrokerErrc::refused) << sink.error().message;

  Topic topic(1);  // there, but its dead-letter topic is not
  const std::string absent = kafka_test::unique_name("absent");
  ASSERT_EQ(cluster.command("topic-error " + absent + " 3"), "ok");
  auto no_dlt = open_kafka_source("kafka://" + cluster.bootstrap() + "/" + topic.name + "?group=g&dead_letter_topic=" + absent);
  ASSERT_FALSE(no_dlt);
  EXPECT_EQ(no_dlt.error().code, BrokerErrc::refused) << no_dlt.error().message;
  EXPECT_NE(no_dlt.error().message.find("dead-letter topic"), std::string::npos) << no_dlt.error().message;

  const std::string forbidden = kafka_test::unique_name("forbidden");
  ASSERT_EQ(cluster.command("topic-error " + forbidden + " 29"), "ok");  // TOPIC_AUTHORIZATION_FAILED
  auto denied = open_kafka_source("kafka://" + cluster.bootstrap() + "/" + forbidden + "?group=g");
  ASSERT_FALSE(denied);
  EXPECT_EQ(denied.error().code, BrokerErrc::refused) << denied.error().message;
  EXPECT_NE(denied.error().message.find("no access to topic"), std::string::npos) << denied.error().message;
}

TEST(KafkaLive, NothingListeningIsUnavailableAtOnce) {
  SourceSettings settings;
  settings.connect_timeout = 500ms;
  const auto start = Steady::now();
  auto source = open_kafka_source("kafka://127.0.0.1:1/t?group=g", settings);
  ASSERT_FALSE(source);
  EXPECT_EQ(source.error().code, BrokerErrc::unavailable) << source.error().message;
  EXPECT_LT(Steady::now() - start, 5s);
}

TEST(KafkaLive, APublishThatCannotReachItsLeaderTimesOutAndWorksOnceItIsBack) {
  MockCluster lonely(1);
  Topic topic(1, lonely);
  SinkSettings settings;
  settings.confirm_timeout = 1500ms;
  auto sink = open_kafka_sink(topic.sink_url(), settings);
  ASSERT_TRUE(sink) << sink.error().message;
  publish(**sink, {message("before")});

  ASSERT_EQ(lonely.command("broker-down 1"), "ok");
  const auto start = Steady::now();
  auto down = (*sink)->publish(std::vector<OutgoingMessage>{message("during")});
  ASSERT_EQ(down.size(), 1u);
  ASSERT_FALSE(down[0]);
  EXPECT_EQ(down[0].error().code, BrokerErrc::timeout) << down[0].error().message;
  EXPECT_TRUE(down[0].error().retryable());
  EXPECT_LT(Steady::now() - start, 5s);

  ASSERT_EQ(lonely.command("broker-up 1"), "ok");
  bool ok = false;
  for (int i = 0; i < 20 && !ok; ++i) {
    auto up = (*sink)->publish(std::vector<OutgoingMessage>{message("after")});
    ok = up[0].has_value();
  }
  EXPECT_TRUE(ok) << "publishing never worked again after broker-up";
}

TEST(KafkaLive, TheMockAnswersBadCommandsWithAnError) {
  MockCluster& cluster = MockCluster::shared();
  EXPECT_EQ(cluster.command("broker-down 99").rfind("error:", 0), 0u);
  EXPECT_EQ(cluster.command("fly away").rfind("error:", 0), 0u);
  EXPECT_EQ(cluster.command("leader nope 0 1"), "ok");  // the mock creates the topic to move its leader
}

}  // namespace
}  // namespace idem
