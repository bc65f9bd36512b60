// Message consumers on PostgreSQL (SPEC §10): the consumer's writes and the processed record in
// one transaction, against the real server, with replicas racing on the same messages.
#include "idem/postgres_consumer.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "idem/testing/manual_clock.hpp"
#include "idem/testing/redeliveries.hpp"
#include "test_support.hpp"

namespace idem {
namespace {

using namespace std::chrono_literals;
using pgtest::fresh_schema;
using pgtest::open_store;
using pgtest::options_for;
using pgtest::qualified;
using pgtest::RawConn;
using testing::ManualClock;

class PostgresConsumer : public ::testing::Test {
 protected:
  void SetUp() override {
    schema_ = fresh_schema();
    store_ = open_store(options_for(schema_));
    RawConn raw;
    // No unique constraint: a message applied twice would show as two rows.
    raw.exec("CREATE TABLE " + ledger() + " (message_id text NOT NULL, amount integer NOT NULL)");
  }
  std::string ledger() const { return qualified(schema_, "ledger"); }
  Consumer consumer_on(PostgresStore& store) {
    ConsumerOptions options;
    options.name = "ledger";
    options.lease = 30s;
    options.clock = &clock_;
    auto c = Consumer::create(store, std::move(options));
    if (!c) throw std::runtime_error(c.error());
    return std::move(*c);
  }
  PostgresWork post(std::string id, bool succeed = true, std::atomic<int>* ran = nullptr) {
    return [this, id = std::move(id), succeed, ran](PostgresTransaction& tx, std::string& error) {
      if (ran) ++*ran;
      auto r = tx.exec("INSERT INTO " + ledger() + " (message_id, amount) VALUES ($1, 100)", {id});
      if (!r) {
        error = r.error().message;
        return false;
      }
      if (!succeed) error = "account frozen";
      return succeed;
    };
  }
  long rows(const std::string& where = "true") {
    RawConn raw;
    return std::stol(raw.exec("SELECT count(*) FROM " + ledger() + " WHERE " + where).value_or("0"));
  }

  std::string schema_;
  std::unique_ptr<PostgresStore> store_;
  ManualClock clock_;
};

TEST_F(PostgresConsumer, TheEffectAndTheProcessedRecordCommitTogether) {
  auto consumer = consumer_on(*store_);
  auto first = process_once_in_transaction(consumer, *store_, "msg-1", "p", post("msg-1"));
  ASSERT_TRUE(first) << first.error().message;
  EXPECT_EQ(first->status, MessageStatus::processed);
  std::atomic<int> ran{0};
  auto again = process_once_in_transaction(consumer, *store_, "msg-1", "p", post("msg-1", true, &ran));
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(again->status, MessageStatus::duplicate);
  EXPECT_EQ(ran.load(), 0);
  EXPECT_EQ(rows("message_id = 'msg-1'"), 1);
  auto record = BlockingStore(*store_).get(RecordId{"consumer ledger", "msg-1"});
  ASSERT_TRUE(record && *record);
  EXPECT_EQ((*record)->state, RecordState::completed);
}

TEST_F(PostgresConsumer, DeclinedWorkOrAFailedStatementRollsBackAndTheNextDeliveryApplies) {
  auto consumer = consumer_on(*store_);
  auto declined = process_once_in_transaction(consumer, *store_, "msg-2", "p", post("msg-2", false));
  ASSERT_TRUE(declined) << declined.error().message;
  EXPECT_EQ(declined->status, MessageStatus::handler_failed);
  EXPECT_NE(declined->detail.find("account frozen"), std::string::npos) << declined->detail;
  EXPECT_EQ(rows("message_id = 'msg-2'"), 0);

  auto failed = process_once_in_transaction(consumer, *store_, "msg-2", "p", [&](PostgresTransaction& tx, std::string& error) {
    (void)tx.exec("INSERT INTO " + ledger() + " (message_id, amount) VALUES ('msg-2', 1)");
    auto r = tx.exec("INSERT INTO no_such_table VALUES (1)");
    if (!r) error = r.error().message;
    return r.has_value();
  });
  ASSERT_TRUE(failed) << failed.error().message;
  EXPECT_EQ(failed->status, MessageStatus::handler_failed);
  EXPECT_NE(failed->detail.find("no_such_table"), std::string::npos) << failed->detail;
  EXPECT_EQ(rows("message_id = 'msg-2'"), 0);

  auto applied = process_once_in_transaction(consumer, *store_, "msg-2", "p", post("msg-2"));
  ASSERT_TRUE(applied) << applied.error().message;
  EXPECT_EQ(applied->status, MessageStatus::processed);
  EXPECT_EQ(rows("message_id = 'msg-2'"), 1);
}

TEST_F(PostgresConsumer, AHolderWhoseLeaseWasTakenOverCommitsNothing) {
  auto consumer = consumer_on(*store_);
  auto stalled = consumer.claim("msg-3", "p");
  ASSERT_TRUE(stalled && std::holds_alternative<Consumer::Held>(*stalled));
  clock_.advance(31s);
  auto taker = process_once_in_transaction(consumer, *store_, "msg-3", "p", post("msg-3"));
  ASSERT_TRUE(taker) << taker.error().message;
  EXPECT_EQ(taker->status, MessageStatus::processed);
  std::atomic<int> ran{0};
  auto late = store_->complete_in_transaction(consumer.completion(std::get<Consumer::Held>(*stalled), ""),
                                              post("msg-3", true, &ran));
  ASSERT_TRUE(late) << late.error().message;
  EXPECT_EQ(*late, FenceStatus::lost);
  EXPECT_EQ(ran.load(), 0);
  EXPECT_EQ(rows("message_id = 'msg-3'"), 1);
}

// Three replicas (three stores with their own connections over one table) and twelve threads
// deliver every message several times: each message's row is written exactly once.
TEST_F(PostgresConsumer, ConcurrentRedeliveriesAcrossReplicasApplyEachEffectExactlyOnce) {
  std::vector<std::unique_ptr<PostgresStore>> replicas;
  replicas.push_back(std::move(store_));
  replicas.push_back(open_store(options_for(schema_)));
  replicas.push_back(open_store(options_for(schema_)));
  std::vector<Consumer> consumers;
  for (auto& r : replicas) consumers.push_back(consumer_on(*r));
  constexpr int kMessages = 40, kThreads = 12, kDeliveries = 2;
  auto tally = testing::redeliver_concurrently(kThreads, kMessages, kDeliveries, [&](int thread, const std::string& id) {
    return process_once_in_transaction(consumers[thread % 3], *replicas[thread % 3], id, "p", post(id));
  });
  testing::expect_each_processed_once(tally, kMessages, kThreads * kDeliveries);
  EXPECT_EQ(rows(), kMessages);
  RawConn raw;
  EXPECT_EQ(raw.exec("SELECT count(*) FROM (SELECT message_id FROM " + ledger() +
                     " GROUP BY message_id HAVING count(*) > 1) d"),
            "0");
}

}  // namespace
}  // namespace idem
