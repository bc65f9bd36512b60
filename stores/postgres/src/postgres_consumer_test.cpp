// Message consumers on PostgreSQL (SPEC §10): the consumer's writes and the processed record in
// one transaction, against the real server, with replicas racing on the same messages.
#include "idem/postgres_consumer.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <map>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "idem/testing/consumer_batches.hpp"
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

// ---- a batch of messages in one transaction, a savepoint each (process_batch_in_transaction) ----

class PostgresBatchConsumer : public PostgresConsumer {
 protected:
  // The batch's effect: a ledger row for messages[index], then the batch's `fails` decides; the
  // ids of the works that ran are counted in `ran`.
  PostgresBatchWork post_batch(const testing::MessageBatch& batch, std::map<std::string, int>* ran = nullptr) {
    return [this, &batch, ran](std::size_t index, PostgresTransaction& tx, std::string& error) {
      if (ran) ++(*ran)[batch.ids[index]];
      auto r = tx.exec("INSERT INTO " + ledger() + " (message_id, amount) VALUES ($1, 100)", {batch.ids[index]});
      if (!r) {
        error = r.error().message;
        return false;
      }
      if (batch.fails[index]) error = "account frozen";
      return !batch.fails[index];
    };
  }
  long records(const std::string& id, const std::string& state = "completed") {
    RawConn raw;
    return std::stol(raw.exec("SELECT count(*) FROM " + qualified(schema_, "idempotency_keys") +
                              " WHERE tenant_id = 'consumer ledger' AND key = '" + id + "' AND state = '" + state + "'")
                         .value_or("0"));
  }
  Consumer consumer_with(PostgresStore& store, const Clock& clock) {
    ConsumerOptions options;
    options.name = "ledger";
    options.lease = 30s;
    options.clock = &clock;
    auto c = Consumer::create(store, std::move(options));
    if (!c) throw std::runtime_error(c.error());
    return std::move(*c);
  }
  static std::vector<MessageStatus> statuses(const std::vector<StoreResult<MessageOutcome>>& outcomes) {
    std::vector<MessageStatus> out;
    for (const auto& o : outcomes) {
      EXPECT_TRUE(o) << o.error().message;
      out.push_back(o ? o->status : MessageStatus::invalid_id);
    }
    return out;
  }
};

// Fifty new messages in one transaction; the 8th declines and the 32nd's statement fails after a
// write and the 33rd's work throws: they alone roll back, leaving no row and no record, and their
// next delivery runs them.
TEST_F(PostgresBatchConsumer, FiftyMessagesCommitTogetherButTheOnesThatFail) {
  auto consumer = consumer_on(*store_);
  testing::MessageBatch batch;
  for (int i = 0; i < 50; ++i) batch.add(std::string("batch-") + std::to_string(100 + i), "p", i == 7);
  PostgresBatchWork post = post_batch(batch);
  auto outcomes = process_batch_in_transaction(
      consumer, *store_, batch.messages(), [&](std::size_t index, PostgresTransaction& tx, std::string& error) -> bool {
        if (index == 31) {
          (void)tx.exec("INSERT INTO " + ledger() + " (message_id, amount) VALUES ('batch-131', 1)");
          auto r = tx.exec("INSERT INTO no_such_table VALUES (1)");
          if (!r) error = r.error().message;
          return r.has_value();
        }
        if (index == 32) {
          (void)tx.exec("INSERT INTO " + ledger() + " (message_id, amount) VALUES ('batch-132', 1)");
          throw std::runtime_error("bug in the consumer");
        }
        return post(index, tx, error);
      });
  ASSERT_EQ(outcomes.size(), 50u);
  RawConn raw;
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    ASSERT_TRUE(outcomes[i]) << outcomes[i].error().message;
    const std::string where = "message_id = '" + batch.ids[i] + "'";
    if (i == 7 || i == 31 || i == 32) {
      EXPECT_EQ(outcomes[i]->status, MessageStatus::handler_failed) << i;
      EXPECT_EQ(rows(where), 0) << i;
      EXPECT_EQ(raw.exec("SELECT count(*) FROM " + qualified(schema_, "idempotency_keys") + " WHERE key = '" +
                         batch.ids[i] + "'"),
                "0")
          << i;
    } else {
      EXPECT_EQ(outcomes[i]->status, MessageStatus::processed) << i;
      EXPECT_EQ(rows(where), 1) << i;
      EXPECT_EQ(records(batch.ids[i]), 1) << i;
    }
  }
  EXPECT_NE(outcomes[7]->detail.find("account frozen"), std::string::npos) << outcomes[7]->detail;
  EXPECT_NE(outcomes[31]->detail.find("no_such_table"), std::string::npos) << outcomes[31]->detail;
  EXPECT_NE(outcomes[32]->detail.find("bug in the consumer"), std::string::npos) << outcomes[32]->detail;

  batch.fails[7] = false;
  std::map<std::string, int> ran;
  auto again = process_batch_in_transaction(consumer, *store_, batch.messages(), post_batch(batch, &ran));
  for (std::size_t i = 0; i < again.size(); ++i) {
    ASSERT_TRUE(again[i]) << again[i].error().message;
    EXPECT_EQ(again[i]->status, i == 7 || i == 31 || i == 32 ? MessageStatus::processed : MessageStatus::duplicate) << i;
  }
  EXPECT_EQ(ran, (std::map<std::string, int>{{"batch-107", 1}, {"batch-131", 1}, {"batch-132", 1}}));
  EXPECT_EQ(rows(), 50);
  EXPECT_EQ(raw.exec("SELECT count(DISTINCT message_id) FROM " + ledger()), "50");
}

TEST_F(PostgresBatchConsumer, DuplicatesWithinABatchAndOfEarlierBatchesRunOnce) {
  auto consumer = consumer_on(*store_);
  testing::MessageBatch first;
  first.add("dup-a");
  first.add("dup-b");
  first.add("dup-a");
  first.add("bad id");
  std::map<std::string, int> ran;
  EXPECT_EQ(statuses(process_batch_in_transaction(consumer, *store_, first.messages(), post_batch(first, &ran))),
            (std::vector{MessageStatus::processed, MessageStatus::processed, MessageStatus::in_progress,
                         MessageStatus::invalid_id}));
  testing::MessageBatch second;
  second.add("dup-b");
  second.add("dup-c");
  second.add("dup-c");
  second.add("dup-a");
  second.add("dup-a", "another payload");
  EXPECT_EQ(statuses(process_batch_in_transaction(consumer, *store_, second.messages(), post_batch(second, &ran))),
            (std::vector{MessageStatus::duplicate, MessageStatus::processed, MessageStatus::in_progress,
                         MessageStatus::duplicate, MessageStatus::conflict}));
  EXPECT_EQ(ran, (std::map<std::string, int>{{"dup-a", 1}, {"dup-b", 1}, {"dup-c", 1}}));
  EXPECT_EQ(rows(), 3);
}

// Between the batch's claims and its transaction, its lease runs out and another replica takes
// one message over and processes it: that message alone is lost, its work not run.
TEST_F(PostgresBatchConsumer, ALeaseTakenOverIsLostForThatMessageOnly) {
  testing::HookClock hooked(clock_);
  auto consumer = consumer_with(*store_, hooked);
  auto replica = open_store(options_for(schema_));
  auto other = consumer_on(*replica);
  testing::MessageBatch batch;
  for (int i = 0; i < 5; ++i) batch.add(std::string("lease-") + std::to_string(i));
  hooked.arm(6, [&] {
    clock_.advance(31s);
    auto taken = process_once_in_transaction(other, *replica, "lease-2", "p", post("lease-2"));
    ASSERT_TRUE(taken && taken->status == MessageStatus::processed);
  });
  std::map<std::string, int> ran;
  auto outcomes = process_batch_in_transaction(consumer, *store_, batch.messages(), post_batch(batch, &ran));
  EXPECT_EQ(statuses(outcomes), (std::vector{MessageStatus::processed, MessageStatus::processed, MessageStatus::lost,
                                             MessageStatus::processed, MessageStatus::processed}));
  EXPECT_EQ(ran.count("lease-2"), 0u);
  for (const auto& id : batch.ids) {
    EXPECT_EQ(rows("message_id = '" + id + "'"), 1) << id;  // lease-2's row is the other replica's
    EXPECT_EQ(records(id), 1) << id;
  }
}

// The COMMIT itself fails (a deferred foreign key, checked only then): no message commits, each
// fails with the server's error, not in doubt; their claims are forgotten, so the next delivery
// runs them all.
TEST_F(PostgresBatchConsumer, ACommitThatFailsLeavesNothingAndTheNextDeliveryRunsThem) {
  auto consumer = consumer_on(*store_);
  RawConn raw;
  raw.exec("CREATE TABLE " + qualified(schema_, "parents") + " (id integer PRIMARY KEY); CREATE TABLE " +
           qualified(schema_, "children") + " (parent integer REFERENCES " + qualified(schema_, "parents") +
           " (id) DEFERRABLE INITIALLY DEFERRED)");
  testing::MessageBatch batch;
  for (int i = 0; i < 10; ++i) batch.add(std::string("commit-") + std::to_string(i));
  PostgresBatchWork post = post_batch(batch);
  auto outcomes = process_batch_in_transaction(
      consumer, *store_, batch.messages(), [&](std::size_t index, PostgresTransaction& tx, std::string& error) {
        if (index == 9 && !tx.exec("INSERT INTO " + qualified(schema_, "children") + " VALUES (42)")) return false;
        return post(index, tx, error);
      });
  ASSERT_EQ(outcomes.size(), 10u);
  for (const auto& o : outcomes) {
    ASSERT_FALSE(o);
    EXPECT_FALSE(o.error().in_doubt) << o.error().message;
  }
  EXPECT_EQ(rows(), 0);
  EXPECT_EQ(raw.exec("SELECT count(*) FROM " + qualified(schema_, "idempotency_keys")), "0");
  auto again = process_batch_in_transaction(consumer, *store_, batch.messages(), post_batch(batch));
  EXPECT_EQ(statuses(again), std::vector<MessageStatus>(10, MessageStatus::processed));
  EXPECT_EQ(rows(), 10);
}

// The connection dies in the middle of the batch's transaction: no message commits, none is in
// doubt (no COMMIT was sent), and the next delivery runs them all.
TEST_F(PostgresBatchConsumer, AConnectionKilledInTheMiddleLeavesNothing) {
  pgtest::Proxy proxy("127.0.0.1", pgtest::port_of(pgtest::server_url()));
  auto via_proxy = open_store(options_for(schema_, proxy.url_via(pgtest::server_url())));
  auto consumer = consumer_on(*via_proxy);
  testing::MessageBatch batch;
  for (int i = 0; i < 10; ++i) batch.add(std::string("cut-") + std::to_string(i));
  PostgresBatchWork post = post_batch(batch);
  auto outcomes = process_batch_in_transaction(
      consumer, *via_proxy, batch.messages(), [&](std::size_t index, PostgresTransaction& tx, std::string& error) {
        if (index == 5) proxy.cut();
        return post(index, tx, error);
      });
  ASSERT_EQ(outcomes.size(), 10u);
  for (const auto& o : outcomes) {
    ASSERT_FALSE(o);
    EXPECT_FALSE(o.error().in_doubt) << o.error().message;
  }
  EXPECT_EQ(rows(), 0);
  auto again = process_batch_in_transaction(consumer, *via_proxy, batch.messages(), post_batch(batch));
  EXPECT_EQ(statuses(again), std::vector<MessageStatus>(10, MessageStatus::processed));
  EXPECT_EQ(rows(), 10);
}

// The same random batches applied with the batch form to one schema and one message at a time
// with process_once_in_transaction to another give the same outcomes, rows and records.
TEST_F(PostgresBatchConsumer, TheBatchFormAndTheSingleFormAgree) {
  const std::string single_schema = fresh_schema();
  auto single_store = open_store(options_for(single_schema));
  RawConn raw;
  raw.exec("CREATE TABLE " + qualified(single_schema, "ledger") + " (message_id text NOT NULL, amount integer NOT NULL)");
  auto batched = consumer_on(*store_);
  auto single = consumer_on(*single_store);
  const auto batches = testing::random_batches(20261206, 8, 24, 60);
  std::map<MessageStatus, int> seen;
  for (std::size_t round = 0; round < batches.size(); ++round) {
    const testing::MessageBatch& batch = batches[round];
    auto outcomes = statuses(process_batch_in_transaction(batched, *store_, batch.messages(), post_batch(batch)));
    for (MessageStatus status : outcomes) ++seen[status];
    for (std::size_t i = 0; i < batch.ids.size(); ++i) {
      const std::string id = batch.ids[i];
      auto one = process_once_in_transaction(
          single, *single_store, id, batch.payloads[i],
          [&, id, fail = bool(batch.fails[i])](PostgresTransaction& tx, std::string& error) {
            auto r = tx.exec("INSERT INTO " + qualified(single_schema, "ledger") + " (message_id, amount) VALUES ($1, 100)", {id});
            if (!r) {
              error = r.error().message;
              return false;
            }
            if (fail) error = "account frozen";
            return !fail;
          });
      ASSERT_TRUE(one) << one.error().message;
      EXPECT_EQ(one->status, outcomes[i]) << "round " << round << " message " << id;
    }
  }
  for (const char* query : {"SELECT string_agg(message_id || ':' || n, ',' ORDER BY message_id) FROM "
                            "(SELECT message_id, count(*) AS n FROM @S.ledger GROUP BY message_id) r",
                            "SELECT string_agg(key || ':' || state, ',' ORDER BY key) FROM @S.idempotency_keys"}) {
    auto in = [&](const std::string& schema) {
      std::string sql = query;
      sql.replace(sql.find("@S"), 2, "\"" + schema + "\"");
      return raw.exec(sql).value_or("");
    };
    EXPECT_EQ(in(schema_), in(single_schema)) << query;
  }
  for (MessageStatus status : {MessageStatus::processed, MessageStatus::duplicate, MessageStatus::conflict,
                               MessageStatus::handler_failed, MessageStatus::invalid_id}) {
    EXPECT_GT(seen[status], 0) << to_string(status);
  }
}

}  // namespace
}  // namespace idem
