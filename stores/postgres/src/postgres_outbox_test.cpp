#include "idem/postgres_outbox.hpp"

#include <gtest/gtest.h>
#include <libpq-fe.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "connection.hpp"
#include "idem/testing/manual_clock.hpp"
#include "schema.hpp"
#include "test_support.hpp"

namespace idem {
namespace {

using namespace std::chrono_literals;
using pgtest::fresh_schema;
using pgtest::options_for;
using pgtest::qualified;
using pgtest::RawConn;
using testing::ManualClock;

PostgresOutboxOptions reader_options(const std::string& schema, bool relay = true) {
  PostgresOutboxOptions o;
  o.conninfo = pgtest::server_url();
  o.schema = schema;
  o.relay = relay;
  o.connect_timeout = 15s;  // a shared 2-core machine; see options_for
  o.application_name = "idem-outbox-test";
  return o;
}

std::unique_ptr<PostgresOutbox> open_reader(const std::string& schema, bool relay = true) {
  auto reader = PostgresOutbox::open_reader(reader_options(schema, relay));
  if (!reader) throw std::runtime_error("open_reader: " + reader.error().message);
  return std::move(*reader);
}

OutboxMessage message(std::string id, std::string body = "{\"amount\":100}") {
  OutboxMessage m;
  m.message_id = std::move(id);
  m.body = std::move(body);
  return m;
}

class PostgresOutboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    schema = fresh_schema("idem_ob");
    store = pgtest::open_store(options_for(schema));
    raw.exec("CREATE TABLE " + qualified(schema, "payments") + " (id text PRIMARY KEY, amount integer NOT NULL)");
  }

  Fence claim_key(const std::string& key) {
    ClaimRequest r;
    r.id = RecordId{"t", key};
    r.request_hash = "h";
    r.token = new_fencing_token();
    r.now = clock.now();
    r.lease_expires = r.now + 60s;
    r.expires = r.now + 24h;
    auto c = BlockingStore(*store).claim(r);
    if (!c || c->status != ClaimStatus::claimed) throw std::runtime_error("claim failed");
    return Fence{r.id, c->record.fencing_token};
  }
  CompleteRequest completion(const Fence& fence) {
    return CompleteRequest{fence, StoredResponse{201, {}, "{\"ok\":true}"}, clock.now(), clock.now() + 24h};
  }
  RecordState state_of(const std::string& key) { return BlockingStore(*store).get(RecordId{"t", key}).value()->state; }
  std::string count(const std::string& table, const std::string& where = "true") {
    return raw.exec("SELECT count(*) FROM " + qualified(schema, table) + " WHERE " + where).value_or("?");
  }
  // Completes a fresh key with `work`, the way an application does.
  StoreResult<FenceStatus> complete_with(const std::string& key, PostgresWork work) {
    return store->complete_in_transaction(completion(claim_key(key)), std::move(work));
  }
  void enqueue_committed(const std::vector<std::string>& ids) {
    for (const auto& id : ids) {
      auto done = complete_with("key-" + id + "-0000000000", [&](PostgresTransaction& tx, std::string& error) {
        return PostgresOutbox::enqueue(tx, message(id), clock.now(), error);
      });
      if (!done || *done != FenceStatus::ok) throw std::runtime_error("enqueue " + id);
    }
  }
  OutboxClaim claim_of(std::size_t limit, const std::string& owner = "relay-a", Millis lease = 30s) {
    return OutboxClaim{limit, clock.now(), lease, owner};
  }

  std::string schema;
  std::unique_ptr<PostgresStore> store;
  RawConn raw;
  ManualClock clock;
};

// ---- enqueue in the business transaction --------------------------------------------------------

TEST_F(PostgresOutboxTest, EnqueueCommitsWithTheCompletionAndTheApplicationsRow) {
  OutboxMessage m = message("pay_1/payment.succeeded", std::string("\x00\x01\xff binary", 10));
  m.destination = "payments.succeeded";
  m.content_type = "application/octet-stream";
  m.headers = {{"X-Tenant", "acme"}, {"X-Quote", "say \"hi\"\\ \n caf\xc3\xa9"}};
  auto done = complete_with("key-outbox-commit-01", [&](PostgresTransaction& tx, std::string& error) {
    auto r = tx.exec("INSERT INTO " + qualified(tx.schema(), "payments") + " VALUES ($1, $2)", {"pay_1", "100"});
    if (!r) {
      error = r.error().message;
      return false;
    }
    return PostgresOutbox::enqueue(tx, m, clock.now(), error);
  });
  ASSERT_TRUE(done) << done.error().message;
  EXPECT_EQ(*done, FenceStatus::ok);
  EXPECT_EQ(state_of("key-outbox-commit-01"), RecordState::completed);
  EXPECT_EQ(count("payments"), "1");
  auto reader = open_reader(schema);
  auto rows = reader->list(OutboxQuery{}).value();
  ASSERT_EQ(rows.size(), 1u);
  const OutboxRow& row = rows.front();
  EXPECT_EQ(row.message.message_id, m.message_id);
  EXPECT_EQ(row.message.destination, m.destination);
  EXPECT_EQ(row.message.content_type, m.content_type);
  // jsonb keeps one value per name and its own order: compare as sets.
  std::map<std::string, std::string> got(row.message.headers.begin(), row.message.headers.end());
  std::map<std::string, std::string> want(m.headers.begin(), m.headers.end());
  EXPECT_EQ(got, want);
  EXPECT_EQ(row.message.body, m.body);
  EXPECT_EQ(row.state, OutboxState::pending);
  EXPECT_EQ(row.created, clock.now());
}

TEST_F(PostgresOutboxTest, AWorkThatFailsAfterEnqueueLeavesNoRowAndTheKeyNotCompleted) {
  auto done = complete_with("key-outbox-fails-001", [&](PostgresTransaction& tx, std::string& error) {
    if (!PostgresOutbox::enqueue(tx, message("pay_2/payment.succeeded"), clock.now(), error)) return false;
    error = "card declined";
    return false;
  });
  ASSERT_FALSE(done);
  EXPECT_NE(done.error().message.find("card declined"), std::string::npos) << done.error().message;
  EXPECT_EQ(count("idem_outbox"), "0");
  EXPECT_EQ(state_of("key-outbox-fails-001"), RecordState::in_progress);
}

TEST_F(PostgresOutboxTest, ADuplicateMessageIdFailsTheWholeTransaction) {
  enqueue_committed({"pay_0/payment.succeeded"});
  int n = 0;
  for (const char* again : {"pay_3/payment.succeeded", "pay_0/payment.succeeded"}) {
    const std::string key = "key-outbox-dup-0000" + std::to_string(n++);
    std::string seen;
    auto done = complete_with(key, [&](PostgresTransaction& tx, std::string& error) {
      tx.exec("INSERT INTO " + qualified(tx.schema(), "payments") + " VALUES ('pay_3', 1)");
      if (!PostgresOutbox::enqueue(tx, message("pay_3/payment.succeeded"), clock.now(), error)) return false;
      const bool ok = PostgresOutbox::enqueue(tx, message(again), clock.now(), error);
      seen = error;
      return ok;
    });
    ASSERT_FALSE(done) << again;
    EXPECT_EQ(seen, std::string("message id ") + again + " is already in the outbox");
    EXPECT_EQ(count("idem_outbox"), "1") << again;
    EXPECT_EQ(count("payments"), "0") << again;
    EXPECT_EQ(state_of(key), RecordState::in_progress) << again;
  }
}

TEST_F(PostgresOutboxTest, EnqueueRefusesWhatCouldNotBePublished) {
  OutboxMessage twice = message("ok-id-1");
  twice.headers = {{"X-A", "1"}, {"X-A", "2"}};
  OutboxMessage nul = message("ok-id-2");
  nul.destination = std::string("a\0b", 3);
  int n = 0;
  for (const OutboxMessage& m : {message("has a space"), twice, nul}) {
    std::string seen;
    auto done = complete_with("key-outbox-bad-" + std::to_string(n++) + "-000000",
                              [&](PostgresTransaction& tx, std::string& error) {
                                const bool ok = PostgresOutbox::enqueue(tx, m, clock.now(), error);
                                seen = error;
                                return ok;
                              });
    ASSERT_FALSE(done);
    EXPECT_NE(seen.find("cannot enqueue the message"), std::string::npos) << seen;
  }
  EXPECT_EQ(count("idem_outbox"), "0");
}

// ---- claim and settle ---------------------------------------------------------------------------

TEST_F(PostgresOutboxTest, ClaimOrderDueTimesLimitAndEachSettleKind) {
  enqueue_committed({"m-1", "m-2", "m-3", "m-4", "m-5"});
  auto reader = open_reader(schema);
  auto first = reader->claim(claim_of(4)).value();
  ASSERT_EQ(first.size(), 4u);
  for (std::size_t i = 0; i < first.size(); ++i) EXPECT_EQ(first[i].message.message_id, "m-" + std::to_string(i + 1));
  EXPECT_EQ(raw.exec("SELECT lease_owner FROM " + qualified(schema, "idem_outbox") + " WHERE message_id = 'm-1'"),
            "relay-a");
  const TimePoint later = clock.now() + 10s;
  ASSERT_TRUE(reader->settle({{first[0].id, OutboxResult::Kind::sent, "", {}},
                              {first[1].id, OutboxResult::Kind::retry, "timeout", later},
                              {first[2].id, OutboxResult::Kind::postpone, "behind m-2", later},
                              {first[3].id, OutboxResult::Kind::dead, "refused: too large", {}}},
                             clock.now(), "relay-a"));
  auto sent = reader->get(first[0].id).value().value();
  EXPECT_EQ(sent.state, OutboxState::sent);
  EXPECT_EQ(sent.sent, clock.now());
  auto retry = reader->get(first[1].id).value().value();
  EXPECT_EQ(retry.state, OutboxState::pending);
  EXPECT_EQ(retry.attempts, 1u);
  EXPECT_EQ(retry.next_attempt, later);
  EXPECT_EQ(retry.last_error, "timeout");
  auto postponed = reader->get(first[2].id).value().value();
  EXPECT_EQ(postponed.attempts, 0u);
  EXPECT_EQ(postponed.next_attempt, later);
  EXPECT_EQ(postponed.last_error, "behind m-2");
  auto dead = reader->get(first[3].id).value().value();
  EXPECT_EQ(dead.state, OutboxState::dead);
  EXPECT_EQ(dead.attempts, 1u);
  EXPECT_EQ(dead.last_error, "refused: too large");
  EXPECT_EQ(count("idem_outbox", "lease_owner IS NOT NULL AND state <> 'pending'"), "0");

  // Only m-5 is due now; m-2 and m-3 come back after 10 s, in id order.
  auto second = reader->claim(claim_of(10)).value();
  ASSERT_EQ(second.size(), 1u);
  EXPECT_EQ(second[0].message.message_id, "m-5");
  clock.advance(10s);
  auto third = reader->claim(claim_of(10)).value();
  ASSERT_EQ(third.size(), 2u);
  EXPECT_EQ(third[0].message.message_id, "m-2");
  EXPECT_EQ(third[1].message.message_id, "m-3");
  EXPECT_TRUE(reader->claim(claim_of(0)).value().empty());
}

TEST_F(PostgresOutboxTest, ARowFailingEveryTimeEndsDeadAndPurgeCountListRetryDropWork) {
  enqueue_committed({"poison-1", "ok-1", "ok-2"});
  auto reader = open_reader(schema);
  const TimePoint created = clock.now();
  for (std::uint32_t attempt = 1; attempt <= 3; ++attempt) {
    auto rows = reader->claim(claim_of(1)).value();
    ASSERT_EQ(rows.size(), 1u);
    ASSERT_EQ(rows[0].message.message_id, "poison-1");
    ASSERT_EQ(rows[0].attempts, attempt - 1);
    ASSERT_TRUE(reader->settle({{rows[0].id, attempt == 3 ? OutboxResult::Kind::dead : OutboxResult::Kind::retry,
                                 "publish " + std::to_string(attempt) + " failed", clock.now() + 1s}},
                               clock.now(), "relay-a"));
    clock.advance(1s);
  }
  auto rest = reader->claim(claim_of(10)).value();
  ASSERT_EQ(rest.size(), 2u);
  ASSERT_TRUE(reader->settle({{rest[0].id, OutboxResult::Kind::sent, "", {}}}, clock.now(), "relay-a"));
  auto counts = reader->count().value();
  EXPECT_EQ(counts.pending, 1u);
  EXPECT_EQ(counts.sent, 1u);
  EXPECT_EQ(counts.dead, 1u);
  EXPECT_EQ(counts.oldest_pending, created);

  auto op = open_reader(schema, /*relay=*/false);
  auto dead = op->list(OutboxQuery{OutboxState::dead, 0, 10}).value();
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].attempts, 3u);
  EXPECT_EQ(dead[0].last_error, "publish 3 failed");
  auto page = op->list(OutboxQuery{std::nullopt, dead[0].id, 1}).value();
  ASSERT_EQ(page.size(), 1u);
  EXPECT_EQ(page[0].message.message_id, "ok-1");
  EXPECT_EQ(op->get(99999).value(), std::nullopt);
  EXPECT_FALSE(op->retry_dead(rest[0].id, clock.now()).value());
  EXPECT_FALSE(op->drop_dead(rest[0].id).value());
  EXPECT_TRUE(op->retry_dead(dead[0].id, clock.now()).value());
  auto retried = op->get(dead[0].id).value().value();
  EXPECT_EQ(retried.state, OutboxState::pending);
  EXPECT_EQ(retried.attempts, 0u);
  EXPECT_EQ(retried.next_attempt, clock.now());
  ASSERT_TRUE(reader->settle({{rest[1].id, OutboxResult::Kind::dead, "no", {}}}, clock.now(), "relay-a"));
  EXPECT_TRUE(op->drop_dead(rest[1].id).value());
  EXPECT_FALSE(op->claim(claim_of(10)));  // an operator's reader does not claim

  EXPECT_EQ(reader->purge_sent(clock.now() - 1h, 100), 0u);
  EXPECT_EQ(reader->purge_sent(clock.now() + 1ms, 100), 1u);
  EXPECT_EQ(reader->count().value().sent, 0u);
  EXPECT_TRUE(reader->ping());
}

TEST_F(PostgresOutboxTest, ARelayThatNeverSettlesLosesItsRowsAfterTheLeaseAndCannotSettleThemLate) {
  enqueue_committed({"l-1", "l-2", "l-3"});
  auto a = open_reader(schema);
  auto b = open_reader(schema);
  auto held = a->claim(claim_of(10, "relay-a", 30s)).value();
  ASSERT_EQ(held.size(), 3u);
  EXPECT_TRUE(b->claim(claim_of(10, "relay-b", 30s)).value().empty());  // leased to relay-a
  clock.advance(29s);
  EXPECT_TRUE(b->claim(claim_of(10, "relay-b", 30s)).value().empty());
  clock.advance(1s);  // relay-a's lease ran out: it is presumed dead
  auto taken = b->claim(claim_of(10, "relay-b", 30s)).value();
  ASSERT_EQ(taken.size(), 3u);
  EXPECT_EQ(taken[0].id, held[0].id);

  // relay-a comes back and settles what it held: nothing changes, the rows are relay-b's.
  ASSERT_TRUE(a->settle({{held[0].id, OutboxResult::Kind::sent, "", {}},
                         {held[1].id, OutboxResult::Kind::dead, "late", {}},
                         {held[2].id, OutboxResult::Kind::retry, "late", clock.now() + 1h}},
                        clock.now(), "relay-a"));
  EXPECT_EQ(count("idem_outbox", "state = 'pending' AND lease_owner = 'relay-b' AND attempts = 0"), "3");
  ASSERT_TRUE(b->settle({{taken[0].id, OutboxResult::Kind::sent, "", {}},
                         {taken[1].id, OutboxResult::Kind::sent, "", {}},
                         {taken[2].id, OutboxResult::Kind::sent, "", {}}},
                        clock.now(), "relay-b"));
  EXPECT_EQ(count("idem_outbox", "state = 'sent'"), "3");
}

TEST_F(PostgresOutboxTest, FourRelaysClaimFiveThousandRowsEachExactlyOnce) {
  constexpr int kRows = 5000, kRelays = 4;
  raw.exec("INSERT INTO " + qualified(schema, "idem_outbox") +
           " (message_id, body) SELECT 'row-' || g, 'x' FROM generate_series(1, " + std::to_string(kRows) + ") g");
  std::vector<std::vector<std::int64_t>> claimed(kRelays);
  std::vector<std::string> errors(kRelays);
  std::barrier start(kRelays);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRelays; ++i) {
    threads.emplace_back([&, i] {
      try {
        auto reader = open_reader(schema);  // its own connection
        const std::string owner = "relay-" + std::to_string(i);
        start.arrive_and_wait();
        for (;;) {
          // A lease far longer than the test: no row may come back while it holds.
          auto rows = reader->claim(OutboxClaim{37, SystemClock::instance().now(), 10min, owner});
          if (!rows) throw std::runtime_error(rows.error().message);
          if (rows->empty()) break;
          std::vector<OutboxResult> results;
          for (const OutboxRow& row : *rows) {
            claimed[i].push_back(row.id);
            results.push_back({row.id, OutboxResult::Kind::sent, "", {}});
          }
          if (auto settled = reader->settle(results, SystemClock::instance().now(), owner); !settled) {
            throw std::runtime_error(settled.error().message);
          }
        }
      } catch (const std::exception& e) {
        errors[i] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  std::set<std::int64_t> unique;
  std::size_t total = 0;
  for (int i = 0; i < kRelays; ++i) {
    EXPECT_EQ(errors[i], "") << "relay " << i;
    EXPECT_FALSE(claimed[i].empty()) << "relay " << i << " claimed nothing";
    total += claimed[i].size();
    unique.insert(claimed[i].begin(), claimed[i].end());
  }
  EXPECT_EQ(total, static_cast<std::size_t>(kRows));  // nobody claimed a row twice
  EXPECT_EQ(unique.size(), static_cast<std::size_t>(kRows));
  EXPECT_EQ(count("idem_outbox", "state = 'sent' AND lease_owner IS NULL"), std::to_string(kRows));
}

// ---- order per ordering key ----------------------------------------------------------------------

std::vector<std::string> ids_of(const std::vector<OutboxRow>& rows) {
  std::vector<std::string> ids;
  for (const auto& r : rows) ids.push_back(r.message.message_id);
  return ids;
}

TEST_F(PostgresOutboxTest, AKeysRowsGoInCommitOrderEvenWhenTheLaterCommitHoldsTheLowerId) {
  const std::string t = qualified(schema, "idem_outbox");
  // B takes an id first (as an INSERT does before it waits), A inserts and commits, then B's row
  // goes in with its lower id: A's row is the key's first.
  RawConn b;
  const std::string lower = b.exec("SELECT nextval(pg_get_serial_sequence('" + t + "', 'id'))").value();
  raw.exec("INSERT INTO " + t + " (message_id, body, ordering_key) VALUES ('a-first', 'x', 'pay_1')");
  b.exec("INSERT INTO " + t + " (id, message_id, body, ordering_key) OVERRIDING SYSTEM VALUE VALUES (" + lower +
         ", 'b-second', 'x', 'pay_1')");
  EXPECT_EQ(raw.exec("SELECT key_seq FROM " + t + " WHERE message_id = 'a-first'"), "1");
  EXPECT_EQ(raw.exec("SELECT key_seq FROM " + t + " WHERE message_id = 'b-second'"), "2");
  auto reader = open_reader(schema);
  auto first = reader->claim(claim_of(10)).value();
  ASSERT_EQ(ids_of(first), (std::vector<std::string>{"a-first"}));
  EXPECT_EQ(first[0].key_seq, 1);
  EXPECT_EQ(first[0].message.ordering_key, "pay_1");
  // In flight on this relay: another relay gets nothing of the key.
  EXPECT_TRUE(reader->claim(claim_of(10, "relay-b")).value().empty());
  ASSERT_TRUE(reader->settle({{first[0].id, OutboxResult::Kind::sent, "", {}}}, clock.now(), "relay-a"));
  EXPECT_EQ(ids_of(reader->claim(claim_of(10, "relay-b")).value()), (std::vector<std::string>{"b-second"}));
}

TEST_F(PostgresOutboxTest, TransactionsEnqueuingForOneKeyTakeTurnsUntilCommitAndARollbackGivesItsNumberBack) {
  const std::string t = qualified(schema, "idem_outbox");
  RawConn holder;
  holder.exec("BEGIN; INSERT INTO " + t + " (message_id, body, ordering_key) VALUES ('r-1', 'x', 'pay_9')");
  holder.exec("ROLLBACK");
  holder.exec("BEGIN; INSERT INTO " + t + " (message_id, body, ordering_key) VALUES ('h-1', 'x', 'pay_9')");
  std::atomic<bool> done{false};
  std::thread waiter([&] {
    RawConn other;
    other.exec("INSERT INTO " + t + " (message_id, body, ordering_key) VALUES ('w-2', 'x', 'pay_9')");
    done.store(true);
  });
  // Another key is not held up meanwhile.
  raw.exec("INSERT INTO " + t + " (message_id, body, ordering_key) VALUES ('o-1', 'x', 'pay_other')");
  std::this_thread::sleep_for(300ms);
  EXPECT_FALSE(done.load()) << "the second transaction of the key did not wait for the first";
  holder.exec("COMMIT");
  waiter.join();
  EXPECT_EQ(raw.exec("SELECT string_agg(message_id || '=' || key_seq, ',' ORDER BY key_seq) FROM " + t +
                     " WHERE ordering_key = 'pay_9'"),
            "h-1=1,w-2=2");
  EXPECT_EQ(raw.exec("SELECT key_seq FROM " + t + " WHERE message_id = 'o-1'"), "1");
}

TEST_F(PostgresOutboxTest, OnlyAReadCommittedTransactionMayInsertARowWithAKey) {
  // A REPEATABLE READ transaction's snapshot would miss an earlier commit of its key, and number
  // its row below it once the row holding that number is purged (proof/outbox_order.pml).
  const std::string t = qualified(schema, "idem_outbox");
  RawConn rr;
  rr.exec("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM " + t);  // its snapshot, now
  raw.exec("INSERT INTO " + t + " (message_id, body, ordering_key) VALUES ('first', 'x', 'pay_rr')");
  std::string error;
  try {
    rr.exec("INSERT INTO " + t + " (message_id, body, ordering_key) VALUES ('second', 'x', 'pay_rr')");
  } catch (const std::runtime_error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("must be inserted by a READ COMMITTED transaction (this one is repeatable read)"),
            std::string::npos)
      << error;
  rr.exec("ROLLBACK");
  // A row without a key is not numbered: any isolation level.
  rr.exec("BEGIN ISOLATION LEVEL SERIALIZABLE; INSERT INTO " + t + " (message_id, body) VALUES ('keyless', 'x'); COMMIT");
  EXPECT_EQ(raw.exec("SELECT count(*) FROM " + t + " WHERE ordering_key = 'pay_rr'"), "1");
  EXPECT_EQ(raw.exec("SELECT count(*) FROM " + t + " WHERE message_id = 'keyless'"), "1");
}

TEST_F(PostgresOutboxTest, ADeadRowHoldsOnlyItsKeyAndPassesWhereItsDestinationSaysSo) {
  const std::string t = qualified(schema, "idem_outbox");
  raw.exec("INSERT INTO " + t + " (message_id, body, ordering_key, destination) VALUES "
           "('a-1', 'x', 'pay_a', 'payments'), ('a-2', 'x', 'pay_a', 'payments'), ('b-1', 'x', 'pay_b', 'payments'), "
           "('b-2', 'x', 'pay_b', 'payments'), ('free', 'x', NULL, 'payments')");
  auto reader = open_reader(schema);
  auto first = reader->claim(claim_of(10)).value();
  ASSERT_EQ(ids_of(first), (std::vector<std::string>{"a-1", "b-1", "free"}));
  ASSERT_TRUE(reader->settle({{first[0].id, OutboxResult::Kind::dead, "refused", {}},
                              {first[1].id, OutboxResult::Kind::sent, "", {}},
                              {first[2].id, OutboxResult::Kind::sent, "", {}}},
                             clock.now(), "relay-a"));
  auto counts = reader->count().value();
  EXPECT_EQ(counts.held_keys, 1u);
  EXPECT_TRUE(counts.oldest_held.has_value());
  auto second = reader->claim(claim_of(10)).value();
  ASSERT_EQ(ids_of(second), (std::vector<std::string>{"b-2"}));
  ASSERT_TRUE(reader->settle({{second[0].id, OutboxResult::Kind::sent, "", {}}}, clock.now(), "relay-a"));
  OutboxClaim elsewhere = claim_of(10);
  elsewhere.dead_rows_pass = {"refunds", "with \"quotes\" and \\"};
  EXPECT_TRUE(reader->claim(elsewhere).value().empty());
  OutboxClaim here = claim_of(10);
  here.dead_rows_pass = {"payments"};
  EXPECT_EQ(ids_of(reader->claim(here).value()), (std::vector<std::string>{"a-2"}));
}

TEST_F(PostgresOutboxTest, FourRelaysKeepEachKeysOrderWithOneRowOfAKeyInFlightAtATime) {
  // 40 keys x 25 rows, each written by its own transaction from 4 writer threads at once (so
  // commits of a key's rows interleave with other keys' and ids say little); 4 relays claim,
  // "publish" and settle concurrently, failing a row now and then.
  constexpr int kKeys = 40, kPerKey = 25, kWriters = 4, kRelays = 4;
  const std::string t = qualified(schema, "idem_outbox");
  {
    std::vector<std::thread> writers;
    for (int w = 0; w < kWriters; ++w) {
      writers.emplace_back([&, w] {
        RawConn conn;
        for (int seq = 0; seq < kPerKey; ++seq) {
          for (int k = w; k < kKeys; k += kWriters) {
            conn.exec("INSERT INTO " + t + " (message_id, body, ordering_key) VALUES ('k" + std::to_string(k) + "-" +
                      std::to_string(seq) + "', '" + std::to_string(seq) + "', 'k" + std::to_string(k) + "')");
          }
        }
      });
    }
    for (auto& w : writers) w.join();
  }
  std::mutex mutex;
  std::map<std::string, std::int64_t> next_seq;  // key -> key_seq it must publish next
  std::vector<std::string> errors;
  std::atomic<int> published{0};
  std::barrier start(kRelays);
  std::vector<std::thread> relays;
  for (int i = 0; i < kRelays; ++i) {
    relays.emplace_back([&, i] {
      try {
        auto reader = open_reader(schema);
        RawConn check;  // what the database says right after a claim
        const std::string owner = "relay-" + std::to_string(i);
        start.arrive_and_wait();
        int idle = 0, round = 0;
        while (published.load() < kKeys * kPerKey && idle < 200) {
          ++round;
          auto rows = reader->claim(OutboxClaim{7, SystemClock::instance().now(), 10min, owner});
          if (!rows) throw std::runtime_error(rows.error().message);
          if (rows->empty()) {
            ++idle;
            std::this_thread::sleep_for(5ms);
            continue;
          }
          idle = 0;
          // One row of a key at a time: every earlier row of each claimed row's key was sent
          // before the claim (a row once sent stays sent, so looking after the claim can miss a
          // violation but never make one up).
          for (const OutboxRow& row : *rows) {
            const std::string earlier = check.exec("SELECT count(*) FROM " + t + " WHERE ordering_key = '" +
                                                   row.message.ordering_key + "' AND key_seq < " +
                                                   std::to_string(row.key_seq) + " AND state <> 'sent'")
                                            .value_or("?");
            if (earlier != "0") {
              const std::lock_guard lock(mutex);
              errors.push_back(row.message.message_id + " claimed while " + earlier + " earlier rows of its key were not sent");
            }
          }
          std::vector<OutboxResult> results;
          {
            const std::lock_guard lock(mutex);
            for (const OutboxRow& row : *rows) {
              const std::string& key = row.message.ordering_key;
              auto& next = next_seq.try_emplace(key, 1).first->second;
              if (row.key_seq != next) {
                errors.push_back(key + ": got key_seq " + std::to_string(row.key_seq) + ", expected " + std::to_string(next));
              }
              // The body is the writer's sequence: key_seq is commit order, and one writer
              // committed a key's rows in sequence.
              if (row.message.body != std::to_string(row.key_seq - 1)) errors.push_back(key + ": body " + row.message.body);
            }
          }
          std::this_thread::sleep_for(1ms);  // the publish
          {
            const std::lock_guard lock(mutex);
            for (const OutboxRow& row : *rows) {
              const bool fail = (row.id + round) % 6 == 0;
              if (!fail) {
                ++next_seq[row.message.ordering_key];
                ++published;
              }
              results.push_back(fail ? OutboxResult{row.id, OutboxResult::Kind::retry, "flaky", SystemClock::instance().now()}
                                     : OutboxResult{row.id, OutboxResult::Kind::sent, "", {}});
            }
          }
          if (auto settled = reader->settle(results, SystemClock::instance().now(), owner); !settled) {
            throw std::runtime_error(settled.error().message);
          }
        }
      } catch (const std::exception& e) {
        const std::lock_guard lock(mutex);
        errors.push_back(std::string("relay ") + std::to_string(i) + ": " + e.what());
      }
    });
  }
  for (auto& r : relays) r.join();
  for (const auto& e : errors) ADD_FAILURE() << e;
  EXPECT_EQ(published.load(), kKeys * kPerKey);
  EXPECT_EQ(count("idem_outbox", "state = 'sent'"), std::to_string(kKeys * kPerKey));
}

// ---- rows written by a service in another language ----------------------------------------------

TEST_F(PostgresOutboxTest, AForeignInsertWithOnlyMessageIdAndBodyGetsTheDefaults) {
  const auto wall = SystemClock::instance().now();
  const std::string t = qualified(schema, "idem_outbox");
  raw.exec("INSERT INTO " + t + " (message_id, body) VALUES ('ext-1', '\\x7b7d')");
  raw.exec("INSERT INTO " + t + " (message_id, destination, headers, body) VALUES ('ext-2', 'orders', "
           "'{\"X-A\": \"caf\\u00e9 \\ud83d\\ude00\", \"X-B\": \"q\\\"\\\\\"}', convert_to('text body', 'UTF8'))");
  auto reader = open_reader(schema);
  auto rows = reader->claim(OutboxClaim{10, wall + 1s, 30s, "relay-a"}).value();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].message.message_id, "ext-1");
  EXPECT_EQ(rows[0].message.body, "{}");
  EXPECT_EQ(rows[0].message.destination, "");
  EXPECT_EQ(rows[0].message.content_type, "application/json");
  EXPECT_TRUE(rows[0].message.headers.empty());
  EXPECT_EQ(rows[0].attempts, 0u);
  EXPECT_LE(std::chrono::abs(rows[0].created - wall), Millis(60'000));  // SQL's now(), in epoch ms
  std::map<std::string, std::string> got(rows[1].message.headers.begin(), rows[1].message.headers.end());
  EXPECT_EQ(got, (std::map<std::string, std::string>{{"X-A", "caf\xc3\xa9 \xf0\x9f\x98\x80"}, {"X-B", "q\"\\"}}));
  EXPECT_EQ(rows[1].message.body, "text body");

  for (const std::string bad : {"(message_id) VALUES ('has space')", "(message_id) VALUES ('')",
                                "(message_id, headers) VALUES ('h-1', '{\"n\": 1}')",
                                "(message_id, headers) VALUES ('h-2', '[]')",
                                "(message_id, state) VALUES ('h-3', 'published')",
                                "(id, message_id) VALUES (7, 'h-4')"}) {
    EXPECT_THROW(raw.exec("INSERT INTO " + t + " " + bad), std::runtime_error) << bad;
  }
}

// ---- where the table comes from, and connections ------------------------------------------------

TEST(PostgresOutboxSchema, ASchemaAtTheVersionBeforeOpensAndGainsTheOutbox) {
  const std::string schema = fresh_schema("idem_ob_v1");
  RawConn raw;
  ASSERT_TRUE(postgres_detail::migrate(raw.get(), schema, true, 10s, /*target=*/1));
  EXPECT_EQ(raw.exec("SELECT version FROM " + qualified(schema, "idem_schema_version")), "1");
  EXPECT_EQ(raw.exec("SELECT to_regclass('" + schema + ".idem_outbox') IS NULL"), "t");
  auto store = pgtest::open_store(options_for(schema));
  EXPECT_GE(PostgresStore::schema_version(), 2);
  EXPECT_EQ(raw.exec("SELECT version FROM " + qualified(schema, "idem_schema_version")),
            std::to_string(PostgresStore::schema_version()));
  for (const char* name : {"idem_outbox", "idem_outbox_pending", "idem_outbox_sent", "idem_outbox_dead"}) {
    EXPECT_EQ(raw.exec("SELECT to_regclass('" + schema + "." + name + "') IS NOT NULL"), "t") << name;
  }
}

TEST(PostgresOutboxSchema, RelaysStartingAtOnceCreateTheTableInASchemaWithoutAStore) {
  const std::string schema = fresh_schema("idem_ob_svc");
  auto op = PostgresOutbox::open_reader(reader_options(schema, /*relay=*/false));
  ASSERT_FALSE(op);  // an operator's tool changes no schema
  EXPECT_NE(op.error().message.find("has no idem_outbox table"), std::string::npos) << op.error().message;

  constexpr int kRelays = 4;
  std::barrier start(kRelays);
  std::vector<std::string> errors(kRelays);
  std::vector<std::thread> threads;
  for (int i = 0; i < kRelays; ++i) {
    threads.emplace_back([&, i] {
      start.arrive_and_wait();
      auto reader = PostgresOutbox::open_reader(reader_options(schema));
      if (!reader) errors[i] = reader.error().message;
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) EXPECT_EQ(e, "");
  RawConn raw;
  EXPECT_EQ(raw.exec("SELECT to_regclass('" + schema + ".idem_outbox') IS NOT NULL"), "t");
  EXPECT_EQ(raw.exec("SELECT to_regclass('" + schema + ".idempotency_keys') IS NULL"), "t");
  // A store opened there later migrates around the table it finds.
  auto store = pgtest::open_store(options_for(schema));
  EXPECT_TRUE(open_reader(schema, /*relay=*/false)->ping());
}

TEST(PostgresOutboxSchema, ARelayNewerThanTheStoreAddsOrderingKeysAndTheStoresMigrationFindsThemThere) {
  const std::string schema = fresh_schema("idem_ob_v3");
  RawConn raw;
  ASSERT_TRUE(postgres_detail::migrate(raw.get(), schema, true, 10s, /*target=*/3));
  raw.exec("INSERT INTO " + qualified(schema, "idem_outbox") + " (message_id, body) VALUES ('old-1', 'x')");
  auto op = PostgresOutbox::open_reader(reader_options(schema, /*relay=*/false));
  ASSERT_FALSE(op);  // an operator's tool changes no schema, and says what to do
  EXPECT_NE(op.error().message.find("predates ordering keys"), std::string::npos) << op.error().message;
  auto relay = open_reader(schema);
  raw.exec("INSERT INTO " + qualified(schema, "idem_outbox") + " (message_id, body, ordering_key) VALUES ('new-1', 'x', 'k')");
  EXPECT_EQ(raw.exec("SELECT key_seq FROM " + qualified(schema, "idem_outbox") + " WHERE message_id = 'new-1'"), "1");
  auto store = pgtest::open_store(options_for(schema));
  EXPECT_EQ(raw.exec("SELECT version FROM " + qualified(schema, "idem_schema_version")),
            std::to_string(PostgresStore::schema_version()));
  EXPECT_EQ(ids_of(relay->claim(OutboxClaim{10, SystemClock::instance().now(), 30s, "r"}).value()),
            (std::vector<std::string>{"old-1", "new-1"}));
}

TEST(PostgresOutboxSchema, AnIdemSchemaNewerThanThisBuildIsRefused) {
  const std::string schema = fresh_schema("idem_ob_new");
  pgtest::open_store(options_for(schema)).reset();
  RawConn raw;
  raw.exec("UPDATE " + qualified(schema, "idem_schema_version") + " SET version = 99");
  auto reader = PostgresOutbox::open_reader(reader_options(schema));
  ASSERT_FALSE(reader);
  EXPECT_EQ(reader.error().code, StoreErrc::corrupt) << reader.error().message;
}

TEST(PostgresOutboxConnection, ATerminatedBackendIsReplacedBeforeTheNextCall) {
  const std::string schema = fresh_schema("idem_ob_conn");
  // An application name of its own: ctest runs other outbox tests at the same time, and
  // terminating their backends would fail them (it did, in CI).
  auto options = reader_options(schema);
  options.application_name = "idem-outbox-test-" + schema;
  auto opened = PostgresOutbox::open_reader(options);
  ASSERT_TRUE(opened) << opened.error().message;
  auto reader = std::move(*opened);
  ASSERT_TRUE(reader->ping());
  RawConn raw;
  EXPECT_EQ(raw.exec("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = '" +
                     options.application_name + "'"),
            "1");
  // Once the server has closed it (its FATAL and EOF are on the socket), the reader notices
  // before sending and reconnects: nothing was in flight, so nothing may fail.
  std::this_thread::sleep_for(200ms);
  auto counts = reader->count();
  EXPECT_TRUE(counts) << counts.error().message;
}

TEST(PostgresOutboxConnection, AnUnreachableServerIsUnavailableAndThePasswordIsNeverShown) {
  PostgresOutboxOptions o;
  o.conninfo = "postgres://idem:s3cretpw@127.0.0.1:1/idem";
  o.connect_timeout = 2s;
  auto reader = PostgresOutbox::open_reader(o);
  ASSERT_FALSE(reader);
  EXPECT_EQ(reader.error().code, StoreErrc::unavailable);
  EXPECT_EQ(reader.error().message.find("s3cretpw"), std::string::npos) << reader.error().message;
  o.conninfo = "postgres://idem:s3cretpw@[bad";
  auto malformed = PostgresOutbox::open_reader(o);
  ASSERT_FALSE(malformed);
  EXPECT_EQ(malformed.error().message.find("s3cretpw"), std::string::npos) << malformed.error().message;
  EXPECT_FALSE(PostgresOutbox::open_reader(PostgresOutboxOptions{}));
}

}  // namespace
}  // namespace idem
