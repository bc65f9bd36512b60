#include "idem/sqlite_outbox.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "idem/sqlite_store.hpp"
#include "idem/testing/manual_clock.hpp"
#include "schema.hpp"

namespace idem {
namespace {

using namespace std::chrono_literals;
using testing::ManualClock;

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "idem-outbox-test-XXXXXX").string();
    if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// A connection of the test's own: the service's (or another language's) view of the file.
class RawDb {
 public:
  explicit RawDb(const std::string& path, int busy_timeout_ms = 5000) {
    if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK) throw std::runtime_error("open " + path);
    sqlite3_busy_timeout(db_, busy_timeout_ms);
  }
  ~RawDb() { sqlite3_close_v2(db_); }
  RawDb(const RawDb&) = delete;
  RawDb& operator=(const RawDb&) = delete;

  // Runs SQL; the error message, or "" when it worked.
  std::string try_exec(const std::string& sql) {
    char* error = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error) == SQLITE_OK) return "";
    std::string message = error ? error : "?";
    sqlite3_free(error);
    return message;
  }
  void exec(const std::string& sql) {
    if (auto error = try_exec(sql); !error.empty()) throw std::runtime_error(sql + ": " + error);
  }
  std::int64_t scalar(const std::string& sql) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
      throw std::runtime_error(sql + ": " + sqlite3_errmsg(db_));
    }
    std::int64_t value = 0;
    if (sqlite3_step(stmt) == SQLITE_ROW) value = sqlite3_column_int64(stmt, 0);
    sqlite3_finalize(stmt);
    return value;
  }
  std::string text(const std::string& sql) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) {
      throw std::runtime_error(sql + ": " + sqlite3_errmsg(db_));
    }
    std::string value;
    if (sqlite3_step(stmt) == SQLITE_ROW && sqlite3_column_text(stmt, 0)) {
      value = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
    }
    sqlite3_finalize(stmt);
    return value;
  }
  sqlite3* get() { return db_; }

 private:
  sqlite3* db_ = nullptr;
};

OutboxMessage message(std::string id, std::string body = "{\"amount\":100}") {
  OutboxMessage m;
  m.message_id = std::move(id);
  m.body = std::move(body);
  return m;
}

OutboxMessage keyed(std::string id, std::string key, std::string destination = "") {
  OutboxMessage m = message(std::move(id));
  m.ordering_key = std::move(key);
  m.destination = std::move(destination);
  return m;
}

std::vector<std::string> ids_of(const std::vector<OutboxRow>& rows) {
  std::vector<std::string> ids;
  for (const auto& r : rows) ids.push_back(r.message.message_id);
  return ids;
}

std::unique_ptr<SqliteOutbox> open_reader(const std::string& path, bool relay = true) {
  SqliteOutboxOptions options;
  options.path = path;
  options.relay = relay;
  auto reader = SqliteOutbox::open_reader(options);
  if (!reader) throw std::runtime_error("open_reader: " + reader.error().message);
  return std::move(*reader);
}

class SqliteOutboxTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SqliteOptions options;
    options.path = path;
    auto opened = SqliteStore::open(options);
    ASSERT_TRUE(opened) << opened.error().message;
    store = std::move(*opened);
    raw = std::make_unique<RawDb>(path);
    raw->exec("CREATE TABLE payments (id TEXT PRIMARY KEY, amount INTEGER NOT NULL)");
  }

  Fence claim_key(const std::string& key) {
    ClaimRequest r;
    r.id = RecordId{"t", key};
    r.request_hash = "h";
    r.token = next_token++;
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
  RecordState state_of(const std::string& key) {
    auto r = BlockingStore(*store).get(RecordId{"t", key});
    if (!r || !*r) throw std::runtime_error("no record " + key);
    return (*r)->state;
  }
  // Enqueues messages in one transaction of the application's own (a raw BEGIN .. COMMIT).
  void enqueue_all(const std::vector<OutboxMessage>& messages) {
    raw->exec("BEGIN");
    for (const auto& m : messages) {
      std::string error;
      if (!SqliteOutbox::enqueue(raw->get(), m, clock.now(), error)) {
        raw->exec("ROLLBACK");
        throw std::runtime_error("enqueue: " + error);
      }
    }
    raw->exec("COMMIT");
  }
  std::int64_t outbox_rows() { return raw->scalar("SELECT count(*) FROM idem_outbox"); }

  OutboxClaim claim_of(std::size_t limit, const std::string& owner = "relay-a") {
    return OutboxClaim{limit, clock.now(), 30s, owner};
  }

  TempDir dir;
  std::string path = dir.file("service.db");
  ManualClock clock;
  std::uint64_t next_token = 1;
  std::unique_ptr<SqliteStore> store;
  std::unique_ptr<RawDb> raw;
};

// ---- enqueue in the business transaction --------------------------------------------------------

TEST_F(SqliteOutboxTest, EnqueueCommitsWithTheCompletionAndTheApplicationsRow) {
  const Fence fence = claim_key("key-outbox-commit-01");
  OutboxMessage m = message("pay_1/payment.succeeded", std::string("\x00\x01\xff binary", 10));
  m.destination = "payments.succeeded";
  m.content_type = "application/octet-stream";
  m.headers = {{"X-Tenant", "acme"}, {"X-Quote", "say \"hi\"\\ \n\x01 caf\xc3\xa9"}};
  auto done = store->complete_in_transaction(completion(fence), [&](sqlite3* db, std::string& error) {
    if (sqlite3_exec(db, "INSERT INTO payments VALUES ('pay_1', 100)", nullptr, nullptr, nullptr) != SQLITE_OK) {
      error = sqlite3_errmsg(db);
      return false;
    }
    return SqliteOutbox::enqueue(db, m, clock.now(), error);
  });
  ASSERT_TRUE(done) << done.error().message;
  EXPECT_EQ(*done, FenceStatus::ok);
  EXPECT_EQ(state_of("key-outbox-commit-01"), RecordState::completed);
  EXPECT_EQ(raw->scalar("SELECT count(*) FROM payments"), 1);

  auto reader = open_reader(path);
  auto rows = reader->list(OutboxQuery{});
  ASSERT_TRUE(rows) << rows.error().message;
  ASSERT_EQ(rows->size(), 1u);
  const OutboxRow& row = rows->front();
  EXPECT_EQ(row.message.message_id, m.message_id);
  EXPECT_EQ(row.message.destination, m.destination);
  EXPECT_EQ(row.message.content_type, m.content_type);
  EXPECT_EQ(row.message.headers, m.headers);
  EXPECT_EQ(row.message.body, m.body);
  EXPECT_EQ(row.state, OutboxState::pending);
  EXPECT_EQ(row.created, clock.now());
  EXPECT_EQ(row.attempts, 0u);
  EXPECT_FALSE(row.sent);
}

TEST_F(SqliteOutboxTest, AWorkThatFailsAfterEnqueueLeavesNoRowAndTheKeyNotCompleted) {
  const Fence fence = claim_key("key-outbox-fails-001");
  auto done = store->complete_in_transaction(completion(fence), [&](sqlite3* db, std::string& error) {
    sqlite3_exec(db, "INSERT INTO payments VALUES ('pay_2', 100)", nullptr, nullptr, nullptr);
    if (!SqliteOutbox::enqueue(db, message("pay_2/payment.succeeded"), clock.now(), error)) return false;
    error = "card declined";
    return false;
  });
  ASSERT_FALSE(done);
  EXPECT_NE(done.error().message.find("card declined"), std::string::npos) << done.error().message;
  EXPECT_EQ(outbox_rows(), 0);
  EXPECT_EQ(raw->scalar("SELECT count(*) FROM payments"), 0);
  EXPECT_EQ(state_of("key-outbox-fails-001"), RecordState::in_progress);
}

TEST_F(SqliteOutboxTest, ADuplicateMessageIdFailsTheWholeTransaction) {
  enqueue_all({message("pay_0/payment.succeeded")});  // committed before
  // Twice in the one transaction, then once more than the row committed before.
  int n = 0;
  for (const char* again : {"pay_3/payment.succeeded", "pay_0/payment.succeeded"}) {
    const Fence fence = claim_key("key-outbox-dup-0000" + std::to_string(n++));
    std::string seen;
    auto done = store->complete_in_transaction(completion(fence), [&](sqlite3* db, std::string& error) {
      sqlite3_exec(db, "INSERT INTO payments VALUES ('pay_3', 100)", nullptr, nullptr, nullptr);
      if (!SqliteOutbox::enqueue(db, message("pay_3/payment.succeeded"), clock.now(), error)) return false;
      const bool ok = SqliteOutbox::enqueue(db, message(again), clock.now(), error);
      seen = error;
      return ok;
    });
    ASSERT_FALSE(done) << again;
    EXPECT_EQ(seen, std::string("message id ") + again + " is already in the outbox");
    EXPECT_NE(done.error().message.find("is already in the outbox"), std::string::npos) << done.error().message;
    EXPECT_EQ(outbox_rows(), 1) << again;  // only the one committed before
    EXPECT_EQ(raw->scalar("SELECT count(*) FROM payments"), 0) << again;
    EXPECT_EQ(state_of(fence.id.key), RecordState::in_progress) << again;
  }
}

// On the store's writer connection enqueue keeps its INSERT prepared between transactions
// (writer_transaction.hpp): each use must start from fresh bindings and leave no lock behind,
// a failed use included, and another connection inside the work must not get that statement.
TEST_F(SqliteOutboxTest, TheWritersPreparedInsertCarriesNothingFromOneTransactionToTheNext) {
  for (int i = 0; i < 40; ++i) {
    const Fence fence = claim_key("key-outbox-reuse-" + std::to_string(1000 + i));
    const bool fail = i % 7 == 3;
    auto done = store->complete_in_transaction(completion(fence), [&, i](sqlite3* db, std::string& error) {
      // Short-lived strings: a binding that outlived this call would point at freed memory.
      OutboxMessage m = message("pay_r" + std::to_string(i) + "/payment.succeeded", "body-" + std::to_string(i));
      if (i % 2 == 0) m.headers = {{"n", std::to_string(i)}};
      if (!SqliteOutbox::enqueue(db, m, clock.now(), error)) return false;
      if (fail) return SqliteOutbox::enqueue(db, m, clock.now(), error);  // a duplicate: the step fails
      std::string other;
      EXPECT_FALSE(SqliteOutbox::enqueue(raw->get(), m, clock.now(), other));  // not the writer's
      EXPECT_NE(other.find("inside the transaction"), std::string::npos) << other;
      return true;
    });
    ASSERT_EQ(done.has_value(), !fail) << i;
    // Nothing is left holding a lock: another connection takes the write lock at once.
    EXPECT_EQ(raw->try_exec("BEGIN IMMEDIATE; COMMIT"), "") << i;
  }
  EXPECT_EQ(outbox_rows(), 40 - 6);
  auto reader = open_reader(path);
  auto rows = reader->list(OutboxQuery{});
  ASSERT_TRUE(rows) << rows.error().message;
  for (const OutboxRow& row : *rows) {
    const std::string n = row.message.message_id.substr(5, row.message.message_id.find('/') - 5);
    EXPECT_EQ(row.message.body, "body-" + n);
    if (std::stoi(n) % 2 == 0) {
      EXPECT_EQ(row.message.headers, (MessageHeaders{{"n", n}}));
    } else {
      EXPECT_TRUE(row.message.headers.empty()) << n;
    }
  }
}

TEST_F(SqliteOutboxTest, EnqueueRefusesWhatCouldNotBePublishedWithTheReason) {
  struct Case {
    OutboxMessage m;
    std::string says;
  };
  std::vector<Case> cases;
  cases.push_back({message("has a space"), "visible ASCII"});
  cases.push_back({message(""), "empty"});
  cases.push_back({message(std::string(257, 'x')), "longer than 256"});
  OutboxMessage long_destination = message("ok-id-1");
  long_destination.destination = std::string(257, 'd');
  cases.push_back({long_destination, "destination"});
  OutboxMessage twice = message("ok-id-2");
  twice.headers = {{"X-A", "1"}, {"X-A", "2"}};
  cases.push_back({twice, "appears twice"});
  OutboxMessage bad_utf8 = message("ok-id-3");
  bad_utf8.headers = {{"X-A", "\xc3"}};
  cases.push_back({bad_utf8, "UTF-8"});
  OutboxMessage nul = message("ok-id-4");
  nul.content_type = std::string("text/plain\0x", 12);
  cases.push_back({nul, "NUL"});
  OutboxMessage unnamed = message("ok-id-5");
  unnamed.headers = {{"", "v"}};
  cases.push_back({unnamed, "empty name"});
  raw->exec("BEGIN");
  for (const auto& c : cases) {
    std::string error;
    EXPECT_FALSE(SqliteOutbox::enqueue(raw->get(), c.m, clock.now(), error)) << c.says;
    EXPECT_NE(error.find(c.says), std::string::npos) << error;
    // Checked ahead of the transaction, the same message is refused with the same sentence.
    auto checked = CheckedOutboxMessage::check(c.m);
    ASSERT_FALSE(checked) << c.says;
    EXPECT_NE(checked.error().find(c.says), std::string::npos) << checked.error();
  }
  raw->exec("COMMIT");
  EXPECT_EQ(outbox_rows(), 0);

  // Outside a transaction a row would commit on its own: refused.
  std::string error;
  EXPECT_FALSE(SqliteOutbox::enqueue(raw->get(), message("ok-id-6"), clock.now(), error));
  EXPECT_NE(error.find("inside the transaction"), std::string::npos) << error;
  EXPECT_FALSE(SqliteOutbox::enqueue(nullptr, message("ok-id-7"), clock.now(), error));
  EXPECT_EQ(outbox_rows(), 0);
}

TEST_F(SqliteOutboxTest, ACheckedMessageIsTheRowTheUncheckedOneMakes) {
  OutboxMessage m = message("c-1", "{\"n\":1}");
  m.destination = "ex/rk";
  m.content_type = "application/vnd.test+json";
  m.headers = {{"X-B", "two \"quoted\""}, {"X-A", "\xc3\xa9"}};
  auto checked = CheckedOutboxMessage::check(m);
  ASSERT_TRUE(checked) << checked.error();
  EXPECT_EQ(checked->headers_json(), outbox_headers_to_json(m.headers));
  OutboxMessage same = m;
  same.message_id = "c-2";
  raw->exec("BEGIN");
  std::string error;
  ASSERT_TRUE(SqliteOutbox::enqueue(raw->get(), *checked, clock.now(), error)) << error;
  ASSERT_TRUE(SqliteOutbox::enqueue(raw->get(), same, clock.now(), error)) << error;
  // A checked message is still one message id: a second enqueue of it is refused.
  EXPECT_FALSE(SqliteOutbox::enqueue(raw->get(), *checked, clock.now(), error));
  EXPECT_NE(error.find("already in the outbox"), std::string::npos) << error;
  raw->exec("COMMIT");
  EXPECT_EQ(raw->text("SELECT group_concat(destination || '|' || content_type || '|' || headers || '|' || body, ' ') "
                      "FROM (SELECT * FROM idem_outbox ORDER BY id)"),
            "ex/rk|application/vnd.test+json|{\"X-B\":\"two \\\"quoted\\\"\",\"X-A\":\"\xc3\xa9\"}|{\"n\":1} "
            "ex/rk|application/vnd.test+json|{\"X-B\":\"two \\\"quoted\\\"\",\"X-A\":\"\xc3\xa9\"}|{\"n\":1}");
  // Outside a transaction it is refused as an unchecked one is.
  EXPECT_FALSE(SqliteOutbox::enqueue(raw->get(), *CheckedOutboxMessage::check(message("c-3")), clock.now(), error));
  EXPECT_NE(error.find("inside the transaction"), std::string::npos) << error;
}

// ---- claim and settle ---------------------------------------------------------------------------

TEST_F(SqliteOutboxTest, ClaimTakesDueRowsInIdOrderUpToTheLimit) {
  enqueue_all({message("m-1"), message("m-2"), message("m-3"), message("m-4"), message("m-5")});
  auto reader = open_reader(path);
  auto first = reader->claim(claim_of(3));
  ASSERT_TRUE(first) << first.error().message;
  ASSERT_EQ(first->size(), 3u);
  EXPECT_EQ((*first)[0].message.message_id, "m-1");
  EXPECT_EQ((*first)[1].message.message_id, "m-2");
  EXPECT_EQ((*first)[2].message.message_id, "m-3");
  EXPECT_LT((*first)[0].id, (*first)[1].id);
  EXPECT_EQ(raw->text("SELECT lease_owner FROM idem_outbox WHERE message_id = 'm-1'"), "relay-a");
  EXPECT_EQ(raw->scalar("SELECT lease_expires_ms FROM idem_outbox WHERE message_id = 'm-1'"),
            to_epoch_ms(clock.now() + 30s));
  EXPECT_EQ(raw->scalar("SELECT lease_owner IS NULL FROM idem_outbox WHERE message_id = 'm-4'"), 1);

  // m-1 goes again in 10 s, m-2 and m-3 are sent: m-4 and m-5 are what is due.
  std::vector<OutboxResult> results{{(*first)[0].id, OutboxResult::Kind::retry, "broker away", clock.now() + 10s},
                                    {(*first)[1].id, OutboxResult::Kind::sent, "", {}},
                                    {(*first)[2].id, OutboxResult::Kind::sent, "", {}}};
  ASSERT_TRUE(reader->settle(results, clock.now(), "relay-a"));
  auto second = reader->claim(claim_of(10));
  ASSERT_TRUE(second);
  ASSERT_EQ(second->size(), 2u);
  EXPECT_EQ((*second)[0].message.message_id, "m-4");
  EXPECT_EQ((*second)[1].message.message_id, "m-5");
  ASSERT_TRUE(reader->settle({{(*second)[0].id, OutboxResult::Kind::sent, "", {}},
                              {(*second)[1].id, OutboxResult::Kind::sent, "", {}}},
                             clock.now(), "relay-a"));
  EXPECT_TRUE(reader->claim(claim_of(10))->empty());
  clock.advance(10s);
  auto third = reader->claim(claim_of(10));
  ASSERT_EQ(third->size(), 1u);
  EXPECT_EQ((*third)[0].message.message_id, "m-1");
  EXPECT_EQ((*third)[0].attempts, 1u);
  EXPECT_EQ((*third)[0].last_error, "broker away");
  EXPECT_TRUE(reader->claim(claim_of(0))->empty());
}

// ---- order per ordering key ------------------------------------------------------------------

TEST_F(SqliteOutboxTest, AKeysRowsAreClaimedOneAtATimeEachAfterThePreviousIsSent) {
  enqueue_all({keyed("a-1", "pay_a"), keyed("b-1", "pay_b"), keyed("a-2", "pay_a"), message("free-1"),
               keyed("a-3", "pay_a"), keyed("b-2", "pay_b")});
  auto reader = open_reader(path);
  auto first = reader->claim(claim_of(10)).value();
  // One row of each key, and every row without a key.
  EXPECT_EQ(ids_of(first), (std::vector<std::string>{"a-1", "b-1", "free-1"}));
  EXPECT_EQ(first[0].message.ordering_key, "pay_a");
  EXPECT_EQ(first[0].key_seq, first[0].id);
  EXPECT_EQ(first[2].message.ordering_key, "");
  EXPECT_EQ(first[2].key_seq, 0);
  // One relay per file: a claim takes again what the last one left unsettled (the relay died
  // with it), and still no later row of a key.
  EXPECT_EQ(ids_of(reader->claim(claim_of(10)).value()), (std::vector<std::string>{"a-1", "b-1", "free-1"}));
  // b-1 fails and goes again in 5 s: b-2 waits behind it; a-1 is sent: a-2 comes.
  ASSERT_TRUE(reader->settle({{first[0].id, OutboxResult::Kind::sent, "", {}},
                              {first[1].id, OutboxResult::Kind::retry, "broker away", clock.now() + 5s},
                              {first[2].id, OutboxResult::Kind::sent, "", {}}},
                             clock.now(), "relay-a"));
  auto second = reader->claim(claim_of(10)).value();
  EXPECT_EQ(ids_of(second), (std::vector<std::string>{"a-2"}));
  ASSERT_TRUE(reader->settle({{second[0].id, OutboxResult::Kind::sent, "", {}}}, clock.now(), "relay-a"));
  clock.advance(5s);
  auto third = reader->claim(claim_of(10)).value();
  EXPECT_EQ(ids_of(third), (std::vector<std::string>{"b-1", "a-3"}));
  ASSERT_TRUE(reader->settle({{third[0].id, OutboxResult::Kind::sent, "", {}}, {third[1].id, OutboxResult::Kind::sent, "", {}}},
                             clock.now(), "relay-a"));
  EXPECT_EQ(ids_of(reader->claim(claim_of(10)).value()), (std::vector<std::string>{"b-2"}));
}

TEST_F(SqliteOutboxTest, ADeadRowHoldsItsKeyOnlyUntilAnOperatorRetriesOrDropsIt) {
  enqueue_all({keyed("a-1", "pay_a", "payments"), keyed("a-2", "pay_a", "payments"), keyed("a-3", "pay_a", "payments"),
               keyed("b-1", "pay_b", "payments"), keyed("b-2", "pay_b", "payments")});
  auto reader = open_reader(path);
  auto first = reader->claim(claim_of(10)).value();
  ASSERT_EQ(ids_of(first), (std::vector<std::string>{"a-1", "b-1"}));
  ASSERT_TRUE(reader->settle({{first[0].id, OutboxResult::Kind::dead, "refused: too large", {}},
                              {first[1].id, OutboxResult::Kind::sent, "", {}}},
                             clock.now(), "relay-a"));
  // pay_a is held: its later rows wait; pay_b goes on.
  auto b2 = reader->claim(claim_of(10)).value();
  ASSERT_EQ(ids_of(b2), (std::vector<std::string>{"b-2"}));
  ASSERT_TRUE(reader->settle({{b2[0].id, OutboxResult::Kind::sent, "", {}}}, clock.now(), "relay-a"));
  auto counts = reader->count().value();
  EXPECT_EQ(counts.held_keys, 1u);
  ASSERT_TRUE(counts.oldest_held);
  EXPECT_EQ(*counts.oldest_held, clock.now());
  EXPECT_TRUE(reader->claim(claim_of(10)).value().empty());
  // A destination whose dead rows pass (or "*") lets a-2 go; another destination's does not.
  OutboxClaim other = claim_of(10);
  other.dead_rows_pass = {"refunds"};
  EXPECT_TRUE(reader->claim(other).value().empty());
  // The operator retries a-1: it goes first, then a-2.
  ASSERT_TRUE(reader->retry_dead(first[0].id, clock.now()).value());
  EXPECT_EQ(reader->count().value().held_keys, 0u);
  auto retried = reader->claim(claim_of(10)).value();
  EXPECT_EQ(ids_of(retried), (std::vector<std::string>{"a-1"}));
  ASSERT_TRUE(reader->settle({{retried[0].id, OutboxResult::Kind::dead, "refused again", {}}}, clock.now(), "relay-a"));
  OutboxClaim passing = claim_of(10);
  passing.dead_rows_pass = {"refunds", "payments"};
  auto passed = reader->claim(passing).value();
  EXPECT_EQ(ids_of(passed), (std::vector<std::string>{"a-2"}));
  ASSERT_TRUE(reader->settle({{passed[0].id, OutboxResult::Kind::sent, "", {}}}, clock.now(), "relay-a"));
  // Dropping the dead row lets the key go on under the default (hold) too.
  ASSERT_TRUE(reader->drop_dead(first[0].id).value());
  EXPECT_EQ(ids_of(reader->claim(claim_of(10)).value()), (std::vector<std::string>{"a-3"}));
}

TEST_F(SqliteOutboxTest, EveryDestinationPassingLetsAKeyGoOnPastItsDeadRow) {
  enqueue_all({keyed("a-1", "pay_a", "x"), keyed("a-2", "pay_a", "y")});
  auto reader = open_reader(path);
  auto first = reader->claim(claim_of(10)).value();
  ASSERT_TRUE(reader->settle({{first[0].id, OutboxResult::Kind::dead, "refused", {}}}, clock.now(), "relay-a"));
  OutboxClaim all = claim_of(10);
  all.dead_rows_pass = {"*"};
  EXPECT_EQ(ids_of(reader->claim(all).value()), (std::vector<std::string>{"a-2"}));
}

TEST_F(SqliteOutboxTest, AnOrderingKeyIsCheckedAtEnqueueAndReadBack) {
  auto reader = open_reader(path);
  std::string error;
  raw->exec("BEGIN");
  for (const std::string& bad : {std::string("has space"), std::string(129, 'k'), std::string("caf\xc3\xa9")}) {
    EXPECT_FALSE(SqliteOutbox::enqueue(raw->get(), keyed("bad", bad), clock.now(), error)) << bad;
    EXPECT_NE(error.find("ordering key"), std::string::npos) << error;
  }
  ASSERT_TRUE(SqliteOutbox::enqueue(raw->get(), keyed("good", std::string(128, 'k')), clock.now(), error)) << error;
  raw->exec("COMMIT");
  auto rows = reader->list(OutboxQuery{}).value();
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].message.ordering_key, std::string(128, 'k'));
  // A foreign writer's key breaking the length rule is refused by the table.
  EXPECT_FALSE(raw->try_exec("INSERT INTO idem_outbox (message_id, ordering_key) VALUES ('f', '')").empty());
}

TEST_F(SqliteOutboxTest, ManyKeysUnderARelayLoopKeepEachKeysOrder) {
  // 20 keys x 10 rows enqueued in interleaved transactions; a relay that claims in batches of 7
  // and fails a row now and then: each key's rows leave in enqueue order, one at a time.
  std::vector<OutboxMessage> all;
  for (int i = 0; i < 10; ++i) {
    for (int k = 0; k < 20; ++k) all.push_back(keyed("k" + std::to_string(k) + "-" + std::to_string(i), "k" + std::to_string(k)));
  }
  for (std::size_t i = 0; i < all.size(); i += 13) {
    enqueue_all(std::vector<OutboxMessage>(all.begin() + static_cast<std::ptrdiff_t>(i),
                                           all.begin() + static_cast<std::ptrdiff_t>(std::min(all.size(), i + 13))));
  }
  auto reader = open_reader(path);
  std::map<std::string, int> next;  // key -> the sequence number it must publish next
  std::size_t published = 0, round = 0;
  while (published < all.size() && round < 1000) {
    ++round;
    auto rows = reader->claim(claim_of(7)).value();
    std::set<std::string> keys;
    std::vector<OutboxResult> results;
    for (const auto& r : rows) {
      EXPECT_TRUE(keys.insert(r.message.ordering_key).second) << "two rows of " << r.message.ordering_key << " at once";
      const auto dash = r.message.message_id.find('-');
      const int seq = std::stoi(r.message.message_id.substr(dash + 1));
      if ((round + static_cast<std::size_t>(seq)) % 5 == 0) {
        results.push_back({r.id, OutboxResult::Kind::retry, "flaky", clock.now()});
        continue;
      }
      EXPECT_EQ(seq, next[r.message.ordering_key]) << r.message.message_id;
      next[r.message.ordering_key] = seq + 1;
      results.push_back({r.id, OutboxResult::Kind::sent, "", {}});
      ++published;
    }
    ASSERT_TRUE(reader->settle(results, clock.now(), "relay-a"));
  }
  EXPECT_EQ(published, all.size());
}

TEST_F(SqliteOutboxTest, EachSettleKindRecordsWhatHappened) {
  enqueue_all({message("s-sent"), message("s-retry"), message("s-postpone"), message("s-dead")});
  auto reader = open_reader(path);
  auto rows = reader->claim(claim_of(10));
  ASSERT_TRUE(rows);
  ASSERT_EQ(rows->size(), 4u);
  const TimePoint later = clock.now() + 5s;
  ASSERT_TRUE(reader->settle({{(*rows)[0].id, OutboxResult::Kind::sent, "", {}},
                              {(*rows)[1].id, OutboxResult::Kind::retry, "timeout", later},
                              {(*rows)[2].id, OutboxResult::Kind::postpone, "behind row 2", later},
                              {(*rows)[3].id, OutboxResult::Kind::dead, "refused: too large", {}}},
                             clock.now(), "relay-a"));
  auto sent = reader->get((*rows)[0].id).value().value();
  EXPECT_EQ(sent.state, OutboxState::sent);
  EXPECT_EQ(sent.sent, clock.now());
  EXPECT_EQ(sent.attempts, 0u);
  auto retry = reader->get((*rows)[1].id).value().value();
  EXPECT_EQ(retry.state, OutboxState::pending);
  EXPECT_EQ(retry.attempts, 1u);
  EXPECT_EQ(retry.next_attempt, later);
  EXPECT_EQ(retry.last_error, "timeout");
  auto postponed = reader->get((*rows)[2].id).value().value();
  EXPECT_EQ(postponed.state, OutboxState::pending);
  EXPECT_EQ(postponed.attempts, 0u);
  EXPECT_EQ(postponed.next_attempt, later);
  EXPECT_EQ(postponed.last_error, "behind row 2");
  auto dead = reader->get((*rows)[3].id).value().value();
  EXPECT_EQ(dead.state, OutboxState::dead);
  EXPECT_EQ(dead.attempts, 1u);
  EXPECT_EQ(dead.last_error, "refused: too large");
  // Settled rows hold no lease.
  EXPECT_EQ(raw->scalar("SELECT count(*) FROM idem_outbox WHERE lease_owner IS NOT NULL"), 0);
  EXPECT_EQ(raw->scalar("SELECT count(*) FROM idem_outbox WHERE lease_expires_ms IS NOT NULL"), 0);
}

TEST_F(SqliteOutboxTest, ASettleByAnotherOwnerChangesNothing) {
  enqueue_all({message("o-1")});
  auto reader = open_reader(path);
  auto rows = reader->claim(claim_of(10, "relay-a"));
  ASSERT_EQ(rows->size(), 1u);
  ASSERT_TRUE(reader->settle({{(*rows)[0].id, OutboxResult::Kind::sent, "", {}}}, clock.now(), "relay-b"));
  auto row = reader->get((*rows)[0].id).value().value();
  EXPECT_EQ(row.state, OutboxState::pending);
  EXPECT_EQ(raw->text("SELECT lease_owner FROM idem_outbox"), "relay-a");
  // An id that does not exist is no error either: there is nothing to record.
  EXPECT_TRUE(reader->settle({{424242, OutboxResult::Kind::dead, "x", {}}}, clock.now(), "relay-a"));
}

TEST_F(SqliteOutboxTest, ARowFailingEveryTimeEndsDeadWithItsAttemptsAndLastError) {
  enqueue_all({message("poison-1")});
  auto reader = open_reader(path);
  constexpr std::uint32_t kMaxAttempts = 3;
  for (std::uint32_t attempt = 1;; ++attempt) {
    auto rows = reader->claim(claim_of(10));
    ASSERT_TRUE(rows);
    ASSERT_EQ(rows->size(), 1u) << "attempt " << attempt;
    ASSERT_EQ((*rows)[0].attempts, attempt - 1);
    const bool last = attempt == kMaxAttempts;
    OutboxResult r{(*rows)[0].id, last ? OutboxResult::Kind::dead : OutboxResult::Kind::retry,
                   "publish " + std::to_string(attempt) + " failed", clock.now() + 1s};
    ASSERT_TRUE(reader->settle({r}, clock.now(), "relay-a"));
    clock.advance(1s);
    if (last) break;
  }
  EXPECT_TRUE(reader->claim(claim_of(10))->empty());
  auto rows = reader->list(OutboxQuery{OutboxState::dead, 0, 10});
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].attempts, kMaxAttempts);
  EXPECT_EQ((*rows)[0].last_error, "publish 3 failed");
}

TEST_F(SqliteOutboxTest, PurgeDeletesSentRowsSentBeforeTheTimeUpToTheLimit) {
  enqueue_all({message("p-1"), message("p-2"), message("p-3"), message("p-4")});
  auto reader = open_reader(path);
  auto rows = reader->claim(claim_of(3)).value();
  ASSERT_TRUE(reader->settle({{rows[0].id, OutboxResult::Kind::sent, "", {}},
                              {rows[1].id, OutboxResult::Kind::sent, "", {}},
                              {rows[2].id, OutboxResult::Kind::dead, "no", {}}},
                             clock.now(), "relay-a"));
  const TimePoint sent_at = clock.now();
  EXPECT_EQ(reader->purge_sent(sent_at, 100), 0u);  // sent at, not before
  EXPECT_EQ(reader->purge_sent(sent_at + 1ms, 1), 1u);
  EXPECT_EQ(reader->purge_sent(sent_at + 1ms, 0), 0u);
  EXPECT_EQ(reader->purge_sent(sent_at + 1ms, 100), 1u);
  EXPECT_EQ(reader->purge_sent(sent_at + 1ms, 100), 0u);
  auto counts = reader->count().value();
  EXPECT_EQ(counts.sent, 0u);
  EXPECT_EQ(counts.dead, 1u);  // dead and pending rows are never purged
  EXPECT_EQ(counts.pending, 1u);
  // Ids are never reused after a purge: a new row comes after every row there ever was.
  enqueue_all({message("p-5")});
  EXPECT_GT(raw->scalar("SELECT id FROM idem_outbox WHERE message_id = 'p-5'"), rows[2].id + 1);
}

TEST_F(SqliteOutboxTest, PurgeKeepsTheNewestRowSoThatNoIdIsGivenAgain) {
  enqueue_all({message("n-1"), message("n-2")});
  auto reader = open_reader(path);
  auto rows = reader->claim(claim_of(10)).value();
  ASSERT_EQ(rows.size(), 2u);
  ASSERT_TRUE(reader->settle({{rows[0].id, OutboxResult::Kind::sent, "", {}}, {rows[1].id, OutboxResult::Kind::sent, "", {}}},
                             clock.now(), "relay-a"));
  EXPECT_EQ(reader->purge_sent(clock.now() + 1h, 100), 1u);  // n-2 stays, however old
  EXPECT_EQ(reader->purge_sent(clock.now() + 1h, 100), 0u);
  EXPECT_EQ(raw->text("SELECT group_concat(message_id) FROM idem_outbox"), "n-2");
  enqueue_all({message("n-3")});
  EXPECT_EQ(raw->scalar("SELECT id FROM idem_outbox WHERE message_id = 'n-3'"), rows[1].id + 1);
  EXPECT_EQ(reader->purge_sent(clock.now() + 1h, 100), 1u);  // n-2 goes once it is no longer the newest
  EXPECT_EQ(reader->count().value().sent, 0u);
}

TEST_F(SqliteOutboxTest, CountsByStateAndTheOldestPendingRow) {
  auto reader = open_reader(path);
  auto empty = reader->count().value();
  EXPECT_EQ(empty.pending + empty.sent + empty.dead, 0u);
  EXPECT_FALSE(empty.oldest_pending);
  const TimePoint first = clock.now();
  enqueue_all({message("c-1"), message("c-2")});
  clock.advance(1min);
  enqueue_all({message("c-3"), message("c-4")});
  auto rows = reader->claim(claim_of(2)).value();
  ASSERT_TRUE(reader->settle({{rows[0].id, OutboxResult::Kind::sent, "", {}},
                              {rows[1].id, OutboxResult::Kind::dead, "x", {}}},
                             clock.now(), "relay-a"));
  auto counts = reader->count().value();
  EXPECT_EQ(counts.pending, 2u);
  EXPECT_EQ(counts.sent, 1u);
  EXPECT_EQ(counts.dead, 1u);
  EXPECT_EQ(counts.oldest_pending, first + 1min);  // c-1 is sent, c-2 dead: c-3 is the oldest
  EXPECT_TRUE(reader->ping());
}

TEST_F(SqliteOutboxTest, OperatorsListGetRetryAndDropDeadRows) {
  enqueue_all({message("l-1"), message("l-2"), message("l-3"), message("l-4")});
  auto relay = open_reader(path);
  auto rows = relay->claim(claim_of(3)).value();
  ASSERT_TRUE(relay->settle({{rows[0].id, OutboxResult::Kind::dead, "refused", {}},
                             {rows[1].id, OutboxResult::Kind::sent, "", {}},
                             {rows[2].id, OutboxResult::Kind::dead, "refused", {}}},
                            clock.now(), "relay-a"));
  auto op = open_reader(path, /*relay=*/false);  // while the relay holds its lock

  auto all = op->list(OutboxQuery{}).value();
  ASSERT_EQ(all.size(), 4u);
  auto page = op->list(OutboxQuery{std::nullopt, all[1].id, 2}).value();
  ASSERT_EQ(page.size(), 2u);
  EXPECT_EQ(page[0].message.message_id, "l-3");
  EXPECT_EQ(page[1].message.message_id, "l-4");
  auto dead = op->list(OutboxQuery{OutboxState::dead, 0, 100}).value();
  ASSERT_EQ(dead.size(), 2u);
  EXPECT_EQ(dead[0].message.message_id, "l-1");
  EXPECT_EQ(dead[1].message.message_id, "l-3");
  EXPECT_EQ(op->list(OutboxQuery{OutboxState::pending, 0, 100}).value().size(), 1u);
  EXPECT_EQ(op->list(OutboxQuery{OutboxState::sent, 0, 100}).value().size(), 1u);
  EXPECT_TRUE(op->list(OutboxQuery{std::nullopt, 0, 0}).value().empty());
  EXPECT_EQ(op->get(987654).value(), std::nullopt);

  // Only dead rows are retried or dropped.
  EXPECT_FALSE(op->retry_dead(rows[1].id, clock.now()).value());  // sent
  EXPECT_FALSE(op->retry_dead(all[3].id, clock.now()).value());   // pending
  EXPECT_FALSE(op->drop_dead(rows[1].id).value());
  EXPECT_FALSE(op->drop_dead(987654).value());
  clock.advance(1h);
  EXPECT_TRUE(op->retry_dead(rows[0].id, clock.now()).value());
  auto retried = op->get(rows[0].id).value().value();
  EXPECT_EQ(retried.state, OutboxState::pending);
  EXPECT_EQ(retried.attempts, 0u);
  EXPECT_EQ(retried.next_attempt, clock.now());
  EXPECT_TRUE(op->drop_dead(rows[2].id).value());
  EXPECT_EQ(op->get(rows[2].id).value(), std::nullopt);
  EXPECT_FALSE(op->retry_dead(rows[2].id, clock.now()).value());

  // The relay publishes the retried row again, in id order.
  auto again = relay->claim(claim_of(10)).value();
  ASSERT_EQ(again.size(), 2u);
  EXPECT_EQ(again[0].message.message_id, "l-1");
  EXPECT_EQ(again[1].message.message_id, "l-4");

  // An operator's reader cannot claim or settle; purging is maintenance, which it may do.
  auto refused = op->claim(claim_of(10));
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("relay = false"), std::string::npos) << refused.error().message;
  EXPECT_FALSE(op->settle({{again[0].id, OutboxResult::Kind::sent, "", {}}}, clock.now(), "relay-a"));
  EXPECT_TRUE(op->purge_sent(clock.now(), 10));
}

// The relay finds pending rows by id from a low-water mark (schema.cpp, migration 7): every row
// below idem_outbox_scan.from_id is sent or dead.
TEST_F(SqliteOutboxTest, TheScanMarkFollowsSettledRowsAndMovesBackForAnOperatorsChanges) {
  auto from_id = [&] { return raw->scalar("SELECT from_id FROM idem_outbox_scan"); };
  EXPECT_EQ(from_id(), 0);
  enqueue_all({message("k-1"), message("k-2"), message("k-3"), message("k-4")});
  auto relay = open_reader(path);
  auto rows = relay->claim(claim_of(3)).value();
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(from_id(), rows[0].id);  // up to the first pending row: claimed rows are still pending
  ASSERT_TRUE(relay->settle({{rows[0].id, OutboxResult::Kind::sent, "", {}},
                             {rows[1].id, OutboxResult::Kind::retry, "away", clock.now() + 5s},
                             {rows[2].id, OutboxResult::Kind::sent, "", {}}},
                            clock.now(), "relay-a"));
  EXPECT_EQ(from_id(), rows[1].id);  // the first row still pending
  EXPECT_EQ(relay->count().value().pending, 2u);
  auto next = relay->claim(claim_of(10)).value();  // k-2 is not due: k-4, past it
  ASSERT_EQ(next.size(), 1u);
  EXPECT_EQ(next[0].message.message_id, "k-4");
  ASSERT_TRUE(relay->settle({{next[0].id, OutboxResult::Kind::dead, "refused", {}}}, clock.now(), "relay-a"));
  clock.advance(5s);
  auto due = relay->claim(claim_of(10)).value();
  ASSERT_EQ(due.size(), 1u);
  EXPECT_EQ(due[0].message.message_id, "k-2");
  ASSERT_TRUE(relay->settle({{due[0].id, OutboxResult::Kind::sent, "", {}}}, clock.now(), "relay-a"));
  EXPECT_EQ(from_id(), next[0].id + 1);  // nothing pending: past the newest row
  // An idle relay's claims write nothing (no WAL frame, no fsync): another connection sees no
  // change to the file.
  const std::int64_t version = raw->scalar("PRAGMA data_version");
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(relay->claim(claim_of(10)).value().empty());
  EXPECT_EQ(raw->scalar("PRAGMA data_version"), version);
  EXPECT_EQ(relay->count().value().pending, 0u);
  EXPECT_TRUE(relay->list(OutboxQuery{OutboxState::pending, 0, 10}).value().empty());

  // The newest row (k-4, dead) dropped: its id is the next row's, and the mark comes back to it.
  auto op = open_reader(path, /*relay=*/false);
  ASSERT_TRUE(op->drop_dead(next[0].id).value());
  EXPECT_EQ(from_id(), next[0].id);
  enqueue_all({message("k-5")});
  EXPECT_EQ(raw->scalar("SELECT id FROM idem_outbox WHERE message_id = 'k-5'"), next[0].id);
  auto reused = relay->claim(claim_of(10)).value();
  ASSERT_EQ(reused.size(), 1u);
  EXPECT_EQ(reused[0].message.message_id, "k-5");
  ASSERT_TRUE(relay->settle({{reused[0].id, OutboxResult::Kind::dead, "refused", {}}}, clock.now(), "relay-a"));

  // A dead row far below the mark made pending again is found, listed and counted.
  ASSERT_TRUE(op->drop_dead(reused[0].id).value());  // so that k-1's id is the only way back
  ASSERT_TRUE(relay->settle({}, clock.now(), "relay-a"));
  enqueue_all({message("k-6")});
  auto k6 = relay->claim(claim_of(10)).value();
  ASSERT_EQ(k6.size(), 1u);
  ASSERT_TRUE(relay->settle({{k6[0].id, OutboxResult::Kind::sent, "", {}}}, clock.now(), "relay-a"));
  raw->exec("UPDATE idem_outbox SET state = 'dead', sent_ms = NULL WHERE message_id = 'k-1'");
  EXPECT_GT(from_id(), rows[0].id);
  ASSERT_TRUE(op->retry_dead(rows[0].id, clock.now()).value());
  EXPECT_EQ(from_id(), rows[0].id);
  EXPECT_EQ(op->count().value().pending, 1u);
  auto listed = op->list(OutboxQuery{OutboxState::pending, 0, 10}).value();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].message.message_id, "k-1");
  EXPECT_TRUE(op->list(OutboxQuery{OutboxState::pending, rows[0].id, 10}).value().empty());
  auto back = relay->claim(claim_of(10)).value();
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].message.message_id, "k-1");
}

// The service's writer enqueues while the relay claims and settles, some rows going again at
// once: every row is published and ends sent, none after it was sent, and the mark ends past the
// newest row.
TEST_F(SqliteOutboxTest, EveryRowEnqueuedWhileTheRelayRunsIsSentOnce) {
  constexpr int kTransactions = 300, kPerTransaction = 10, kRows = kTransactions * kPerTransaction;
  std::thread writer([&] {
    RawDb conn(path, 30'000);
    for (int t = 0; t < kTransactions; ++t) {
      conn.exec("BEGIN IMMEDIATE");
      for (int i = 0; i < kPerTransaction; ++i) {
        std::string error;
        if (!SqliteOutbox::enqueue(conn.get(), message("h-" + std::to_string(t * kPerTransaction + i)), clock.now(),
                                   error)) {
          ADD_FAILURE() << error;
        }
      }
      conn.exec("COMMIT");
    }
  });
  auto relay = open_reader(path);
  std::vector<int> sent(kRows, 0);
  int published = 0, rounds = 0;
  while (std::count(sent.begin(), sent.end(), 1) < kRows && ++rounds < 100'000) {
    auto rows = relay->claim(claim_of(64));
    ASSERT_TRUE(rows) << rows.error().message;
    std::vector<OutboxResult> results;
    for (std::size_t i = 0; i < rows->size(); ++i) {
      const OutboxRow& row = (*rows)[i];
      const int n = std::stoi(row.message.message_id.substr(2));
      EXPECT_EQ(sent[n], 0) << row.message.message_id << " claimed after it was sent";
      ++published;
      if (i == 0 && rounds % 5 == 0) {
        results.push_back({row.id, OutboxResult::Kind::retry, "again", clock.now()});  // due at once
      } else {
        results.push_back({row.id, OutboxResult::Kind::sent, "", {}});
        ++sent[n];
      }
    }
    ASSERT_TRUE(relay->settle(results, clock.now(), "relay-a"));
  }
  writer.join();
  EXPECT_EQ(std::count(sent.begin(), sent.end(), 1), kRows);
  EXPECT_GE(published, kRows);
  EXPECT_EQ(relay->count().value().pending, 0u);
  EXPECT_EQ(raw->scalar("SELECT count(*) FROM idem_outbox WHERE state = 'sent'"), kRows);
  EXPECT_EQ(raw->scalar("SELECT from_id FROM idem_outbox_scan"), raw->scalar("SELECT max(id) + 1 FROM idem_outbox"));
}

TEST_F(SqliteOutboxTest, ClaimRefusesAnUnnamedOwnerOrNoLease) {
  auto reader = open_reader(path);
  EXPECT_FALSE(reader->claim(OutboxClaim{10, clock.now(), 30s, ""}));
  EXPECT_FALSE(reader->claim(OutboxClaim{10, clock.now(), 0s, "relay-a"}));
}

// ---- rows written by a service in another language ----------------------------------------------

TEST_F(SqliteOutboxTest, AForeignInsertWithOnlyMessageIdAndBodyGetsTheDefaults) {
  const auto wall = SystemClock::instance().now();
  raw->exec("INSERT INTO idem_outbox (message_id, body) VALUES ('ext-1', x'7b7d')");
  raw->exec(R"(INSERT INTO idem_outbox (message_id, destination, headers, body)
               VALUES ('ext-2', 'orders', '{ "X-A" : "caf\u00e9 \ud83d\ude00", "X-B":"q\"\\/\n" }', 'text body'))");
  auto reader = open_reader(path);
  auto rows = reader->claim(OutboxClaim{10, wall + 1s, 30s, "relay-a"});
  ASSERT_TRUE(rows) << rows.error().message;
  ASSERT_EQ(rows->size(), 2u);
  const OutboxRow& plain = (*rows)[0];
  EXPECT_EQ(plain.message.message_id, "ext-1");
  EXPECT_EQ(plain.message.body, "{}");
  EXPECT_EQ(plain.message.destination, "");
  EXPECT_EQ(plain.message.content_type, "application/json");
  EXPECT_TRUE(plain.message.headers.empty());
  EXPECT_EQ(plain.state, OutboxState::pending);
  EXPECT_EQ(plain.attempts, 0u);
  EXPECT_LE(std::chrono::abs(plain.created - wall), Millis(60'000));  // SQL's "now", in epoch ms
  const OutboxRow& full = (*rows)[1];
  EXPECT_EQ(full.message.destination, "orders");
  EXPECT_EQ(full.message.body, "text body");
  const MessageHeaders want{{"X-A", "caf\xc3\xa9 \xf0\x9f\x98\x80"}, {"X-B", "q\"\\/\n"}};
  EXPECT_EQ(full.message.headers, want);
}

TEST_F(SqliteOutboxTest, TheTableRefusesForeignRowsOfTheWrongShape) {
  for (const char* bad : {
           "INSERT INTO idem_outbox (message_id) VALUES ('')",
           "INSERT INTO idem_outbox (message_id) VALUES (x'6869')",  // a blob, not text
           "INSERT INTO idem_outbox (message_id) VALUES (printf('%.257c', 'a'))",
           "INSERT INTO idem_outbox (message_id, destination) VALUES ('d-1', printf('%.257c', 'a'))",
           "INSERT INTO idem_outbox (message_id, state) VALUES ('h-4', 'published')",
       }) {
    EXPECT_FALSE(raw->try_exec(bad).empty()) << bad;
  }
  raw->exec("INSERT INTO idem_outbox (message_id) VALUES ('h-6')");
  EXPECT_FALSE(raw->try_exec("UPDATE idem_outbox SET state = 'lost'").empty());
  EXPECT_EQ(outbox_rows(), 1);
}

// What the table leaves to the relay (schema.cpp, migrations 5 and 6): an id breaking SPEC §2's
// rules, headers that are not a JSON object of strings. Such a row must not stop the ones behind it.
TEST_F(SqliteOutboxTest, AForeignRowTheRelayCannotPublishIsMadeDeadWithTheReasonAndOperatorsSeeIt) {
  raw->exec("INSERT INTO idem_outbox (message_id, headers) VALUES ('t-1', '{\"n\": 1}')");
  raw->exec("INSERT INTO idem_outbox (message_id) VALUES ('has space')");
  raw->exec("INSERT INTO idem_outbox (message_id) VALUES ('t-3')");
  raw->exec("INSERT INTO idem_outbox (message_id) VALUES (char(27) || '[2J')");  // a terminal escape
  auto reader = open_reader(path);
  auto rows = reader->claim(claim_of(10));
  ASSERT_TRUE(rows) << rows.error().message;
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].message.message_id, "t-3");
  EXPECT_TRUE((*rows)[0].unreadable.empty());
  EXPECT_EQ(raw->text("SELECT group_concat(id || ':' || state, ' ') FROM (SELECT * FROM idem_outbox ORDER BY id)"),
            "1:dead 2:dead 3:pending 4:dead");
  EXPECT_NE(raw->text("SELECT last_error FROM idem_outbox WHERE id = 1").find("the row cannot be read: the headers are "),
            std::string::npos);
  EXPECT_NE(raw->text("SELECT last_error FROM idem_outbox WHERE id = 1").find("\"n\" is not a string"),
            std::string::npos);
  EXPECT_NE(raw->text("SELECT last_error FROM idem_outbox WHERE id = 2").find("not visible ASCII"), std::string::npos);
  EXPECT_NE(raw->text("SELECT last_error FROM idem_outbox WHERE id = 4").find("not visible ASCII"), std::string::npos);
  EXPECT_EQ(raw->scalar("SELECT count(*) FROM idem_outbox WHERE lease_owner IS NOT NULL AND state = 'dead'"), 0);

  // Headers that are not JSON, or JSON but no object, are dead the same way.
  ASSERT_TRUE(reader->settle({{3, OutboxResult::Kind::sent, "", {}}}, clock.now(), "relay-a"));
  raw->exec("INSERT INTO idem_outbox (message_id, headers) VALUES ('t-5', 'not json'), ('t-6', '[\"a\"]')");
  raw->exec("INSERT INTO idem_outbox (message_id) VALUES ('t-7')");
  rows = reader->claim(claim_of(10));
  ASSERT_TRUE(rows) << rows.error().message;
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].message.message_id, "t-7");
  EXPECT_EQ(raw->text("SELECT group_concat(state, ' ') FROM (SELECT * FROM idem_outbox WHERE id > 4 ORDER BY id)"),
            "dead dead pending");
  for (const char* id : {"t-5", "t-6"}) {
    EXPECT_NE(raw->text(std::string("SELECT last_error FROM idem_outbox WHERE message_id = '") + id + "'")
                  .find("the row cannot be read: the headers are "),
              std::string::npos)
        << id;
  }
  ASSERT_TRUE(reader->settle({{7, OutboxResult::Kind::sent, "", {}}}, clock.now(), "relay-a"));
  EXPECT_TRUE(reader->drop_dead(5).value());
  EXPECT_TRUE(reader->drop_dead(6).value());

  // An operator lists them all, hears why each bad one is dead, and drops it.
  auto listed = reader->list(OutboxQuery{OutboxState::dead, 0, 10});
  ASSERT_TRUE(listed) << listed.error().message;
  ASSERT_EQ(listed->size(), 3u);
  EXPECT_EQ((*listed)[0].message.message_id, "t-1");
  EXPECT_TRUE((*listed)[0].message.headers.empty());
  EXPECT_NE((*listed)[0].unreadable.find("is not a string"), std::string::npos) << (*listed)[0].unreadable;
  EXPECT_EQ((*listed)[1].message.message_id, "has space");
  EXPECT_NE((*listed)[1].unreadable.find("not visible ASCII"), std::string::npos) << (*listed)[1].unreadable;
  auto shown = reader->get(4);
  ASSERT_TRUE(shown && *shown);
  EXPECT_NE((**shown).unreadable.find("not visible ASCII"), std::string::npos);
  EXPECT_TRUE(reader->drop_dead(1).value());
  EXPECT_TRUE(reader->drop_dead(2).value());
  // A dead row put back to pending is refused again at the next claim, not published.
  EXPECT_TRUE(reader->retry_dead(4, clock.now()).value());
  rows = reader->claim(claim_of(10));
  ASSERT_TRUE(rows) << rows.error().message;
  EXPECT_TRUE(rows->empty());
  EXPECT_EQ(raw->text("SELECT state FROM idem_outbox WHERE id = 4"), "dead");
}

// ---- one relay per file -------------------------------------------------------------------------

TEST_F(SqliteOutboxTest, ASecondRelayIsRefusedWithAClearErrorAndOperatorsStillRead) {
  auto first = open_reader(path);
  SqliteOutboxOptions options;
  options.path = path;
  auto second = SqliteOutbox::open_reader(options);
  ASSERT_FALSE(second);
  EXPECT_EQ(second.error().code, StoreErrc::unavailable);
  const std::string& why = second.error().message;
  EXPECT_NE(why.find("another idem-relay is relaying this outbox (" + path + "): one relay per SQLite file"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("by process " + std::to_string(::getpid())), std::string::npos) << why;
  EXPECT_TRUE(std::filesystem::exists(SqliteOutbox::lock_path(path)));
  auto op = open_reader(path, /*relay=*/false);
  EXPECT_TRUE(op->count());
  first.reset();
  EXPECT_TRUE(SqliteOutbox::open_reader(options)) << "the lock goes with the reader";
}

TEST_F(SqliteOutboxTest, TheServicesWritesGoOnWhileARelayHoldsTheLock) {
  auto relay = open_reader(path);
  RawDb impatient(path, /*busy_timeout_ms=*/100);  // would fail at once if the lock blocked it
  for (int i = 0; i < 20; ++i) {
    const std::string key = "key-outbox-live-" + std::to_string(1000 + i);
    const Fence fence = claim_key(key);
    auto done = store->complete_in_transaction(completion(fence), [&](sqlite3* db, std::string& error) {
      return SqliteOutbox::enqueue(db, message("live/" + std::to_string(i)), clock.now(), error);
    });
    ASSERT_TRUE(done) << done.error().message;
    ASSERT_EQ(*done, FenceStatus::ok);
    ASSERT_EQ(impatient.try_exec("INSERT INTO payments VALUES ('live-" + std::to_string(i) + "', 1)"), "");
    auto rows = relay->claim(claim_of(100));
    ASSERT_TRUE(rows) << rows.error().message;
    ASSERT_EQ(rows->size(), 1u);
    ASSERT_TRUE(relay->settle({{(*rows)[0].id, OutboxResult::Kind::sent, "", {}}}, clock.now(), "relay-a"));
  }
  EXPECT_EQ(relay->count().value().sent, 20u);
  EXPECT_EQ(raw->scalar("SELECT count(*) FROM payments"), 20);
}

// No fixture: the process forks, so it runs no store threads of its own.
TEST(SqliteOutboxLock, TheLockIsReleasedWhenTheRelayHoldingItIsKilled) {
  TempDir dir;
  const std::string path = dir.file("killed.db");
  RawDb(path).exec("CREATE TABLE orders (id INTEGER PRIMARY KEY)");
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(ready[0]);
    SqliteOutboxOptions options;
    options.path = path;
    auto held = SqliteOutbox::open_reader(options);
    const char byte = held ? 'y' : 'n';
    (void)!::write(ready[1], &byte, 1);
    for (;;) ::pause();  // holds it until killed
  }
  ::close(ready[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  ASSERT_EQ(byte, 'y');

  SqliteOutboxOptions options;
  options.path = path;
  auto refused = SqliteOutbox::open_reader(options);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("by process " + std::to_string(child)), std::string::npos)
      << refused.error().message;

  ASSERT_EQ(::kill(child, SIGKILL), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  auto taken = SqliteOutbox::open_reader(options);
  ASSERT_TRUE(taken) << taken.error().message;
}

// ---- where the table comes from -----------------------------------------------------------------

// Opens an idem store on `path` (running its migrations) and closes it again.
void open_and_close_store(const std::string& path) {
  SqliteOptions options;
  options.path = path;
  auto store = SqliteStore::open(options);
  ASSERT_TRUE(store) << store.error().message;
}

TEST(SqliteOutboxSchema, ADatabaseAtTheVersionBeforeOpensAndGainsTheOutbox) {
  TempDir dir;
  const std::string path = dir.file("v1.db");
  {
    RawDb raw(path);
    ASSERT_TRUE(sqlite_detail::migrate(raw.get(), 1));
    raw.exec("INSERT INTO idempotency_keys VALUES ('t', 'k', 'in_progress', 'h', 7, 0, NULL, NULL, NULL, 1, NULL, 9)");
    EXPECT_EQ(raw.scalar("SELECT version FROM idem_schema_version"), 1);
    EXPECT_EQ(raw.scalar("SELECT count(*) FROM sqlite_master WHERE name = 'idem_outbox'"), 0);
  }
  open_and_close_store(path);
  RawDb raw(path);
  EXPECT_GE(SqliteStore::schema_version(), 2);
  EXPECT_EQ(raw.scalar("SELECT version FROM idem_schema_version"), SqliteStore::schema_version());
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM idempotency_keys"), 1);
  for (const char* name : {"idem_outbox", "idem_outbox_settled", "idem_outbox_scan"}) {
    EXPECT_EQ(raw.scalar(std::string("SELECT count(*) FROM sqlite_master WHERE name = '") + name + "'"), 1) << name;
  }
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM sqlite_master WHERE name = 'idem_outbox_pending'"), 0);
}

TEST(SqliteOutboxSchema, ARelayCreatesTheTableInAServicesOwnDatabaseAndAStoreStillMigrates) {
  TempDir dir;
  const std::string path = dir.file("service.db");
  {
    RawDb raw(path);
    raw.exec("CREATE TABLE orders (id INTEGER PRIMARY KEY)");
  }
  auto op = SqliteOutbox::open_reader(SqliteOutboxOptions{path, /*relay=*/false});
  ASSERT_FALSE(op);  // an operator's tool changes no schema
  EXPECT_NE(op.error().message.find("has no idem_outbox table"), std::string::npos) << op.error().message;

  auto relay = open_reader(path);
  {
    RawDb raw(path);
    EXPECT_EQ(raw.scalar("SELECT count(*) FROM sqlite_master WHERE name = 'idem_outbox'"), 1);
    EXPECT_EQ(raw.scalar("SELECT count(*) FROM sqlite_master WHERE name = 'idempotency_keys'"), 0);
    EXPECT_EQ(raw.scalar("SELECT count(*) FROM sqlite_master WHERE name = 'idem_schema_version'"), 0);
    raw.exec("INSERT INTO idem_outbox (message_id, body) VALUES ('svc-1', 'x')");
  }
  EXPECT_EQ(relay->count().value().pending, 1u);
  // An idem store opened on that file later migrates around the table it finds.
  SqliteOptions options;
  options.path = path;
  auto store = SqliteStore::open(options);
  ASSERT_TRUE(store) << store.error().message;
  EXPECT_EQ(relay->count().value().pending, 1u);
}

// Whether an INSERT into the outbox opens a temporary b-tree (what `state IN (...)` in a CHECK
// costs on every row, and migration 4 removed).
bool insert_opens_a_temporary_btree(RawDb& raw) {
  sqlite3_stmt* stmt = nullptr;
  const char* sql = "EXPLAIN INSERT INTO idem_outbox (message_id, body) VALUES ('x', 'y')";
  if (sqlite3_prepare_v2(raw.get(), sql, -1, &stmt, nullptr) != SQLITE_OK) throw std::runtime_error(sql);
  bool found = false;
  while (sqlite3_step(stmt) == SQLITE_ROW) {
    const auto* opcode = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 1));
    if (opcode != nullptr && std::string(opcode) == "OpenEphemeral") found = true;
  }
  sqlite3_finalize(stmt);
  return found;
}

TEST(SqliteOutboxSchema, MigrationFourRebuildsTheTableKeepingRowsIdsAndTheHighWaterMark) {
  TempDir dir;
  const std::string path = dir.file("v3.db");
  {
    RawDb raw(path);
    ASSERT_TRUE(sqlite_detail::migrate(raw.get(), 3));
    ASSERT_TRUE(insert_opens_a_temporary_btree(raw));  // the table as version 3 had it
    raw.exec("INSERT INTO idem_outbox (message_id, destination, headers, body, created_ms) VALUES "
             "('m-1', 'ex/rk', '{\"a\":\"b\"}', x'00ff', 11), ('m-2', '', '{}', 'two', 12), ('m-3', '', '{}', 'three', 13)");
    raw.exec("UPDATE idem_outbox SET state = 'dead', attempts = 4, last_error = 'why' WHERE message_id = 'm-1'");
    raw.exec("DELETE FROM idem_outbox WHERE message_id = 'm-3'");  // purged: its id 3 must not come back
  }
  {
    RawDb raw(path);
    ASSERT_TRUE(sqlite_detail::migrate(raw.get(), 4));
  }
  RawDb raw(path);
  EXPECT_EQ(raw.scalar("SELECT version FROM idem_schema_version"), 4);
  EXPECT_FALSE(insert_opens_a_temporary_btree(raw));
  EXPECT_EQ(raw.text("SELECT group_concat(id || ':' || message_id || ':' || state || ':' || attempts || ':' || "
                     "destination || ':' || headers || ':' || hex(body) || ':' || created_ms || ':' || "
                     "ifnull(last_error, '-'), ' ') FROM (SELECT * FROM idem_outbox ORDER BY id)"),
            "1:m-1:dead:4:ex/rk:{\"a\":\"b\"}:00FF:11:why 2:m-2:pending:0::{}:74776F:12:-");
  raw.exec("INSERT INTO idem_outbox (message_id, body) VALUES ('m-4', 'four')");
  EXPECT_EQ(raw.scalar("SELECT id FROM idem_outbox WHERE message_id = 'm-4'"), 4);
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM sqlite_sequence WHERE name = 'idem_outbox_rebuilt'"), 0);
  // The checks and the triggers came through the rebuild.
  EXPECT_NE(raw.try_exec("UPDATE idem_outbox SET state = 'lost' WHERE id = 2"), "");
  EXPECT_NE(raw.try_exec("INSERT INTO idem_outbox (message_id, headers) VALUES ('m-5', '{\"n\": 1}')"), "");
  EXPECT_NE(raw.try_exec("UPDATE idem_outbox SET headers = '{\"n\": []}' WHERE id = 2"), "");
  EXPECT_NE(raw.try_exec("INSERT INTO idem_outbox (message_id) VALUES ('m-1')"), "");
  for (const char* name : {"idem_outbox_pending", "idem_outbox_sent", "idem_outbox_dead", "idem_outbox_headers_insert",
                           "idem_outbox_headers_update"}) {
    EXPECT_EQ(raw.scalar(std::string("SELECT count(*) FROM sqlite_master WHERE name = '") + name + "'"), 1) << name;
  }
}

// The outbox's table, indexes and triggers as SQLite keeps their text, and the sequence's row.
std::string outbox_schema(RawDb& raw) {
  return raw.text("SELECT group_concat(type || ' ' || name || ': ' || ifnull(sql, ''), char(10)) FROM "
                  "(SELECT * FROM sqlite_master WHERE tbl_name = 'idem_outbox' ORDER BY type, name)") +
         "\n" + std::to_string(raw.scalar("SELECT count(*) FROM sqlite_sequence WHERE name LIKE 'idem_outbox%'"));
}

TEST(SqliteOutboxSchema, MigrationFiveKeepsRowsAndIdsAndLeavesTheCheapChecks) {
  TempDir dir;
  const std::string path = dir.file("v4.db");
  {
    RawDb raw(path);
    ASSERT_TRUE(sqlite_detail::migrate(raw.get(), 4));
    EXPECT_NE(raw.try_exec("INSERT INTO idem_outbox (message_id) VALUES ('has space')"), "");  // as version 4 had it
    raw.exec("INSERT INTO idem_outbox (message_id, destination, headers, body, created_ms) VALUES "
             "('m-1', 'ex/rk', '{\"a\":\"b\"}', x'00ff', 11), ('m-2', '', '{}', 'two', 12), ('m-3', '', '{}', 'three', 13)");
    raw.exec("UPDATE idem_outbox SET state = 'sent', sent_ms = 20 WHERE message_id = 'm-1'");
    raw.exec("DELETE FROM idem_outbox WHERE message_id = 'm-3'");  // purged
  }
  {
    RawDb raw(path);
    ASSERT_TRUE(sqlite_detail::migrate(raw.get(), 5));
  }
  RawDb raw(path);
  EXPECT_EQ(raw.scalar("SELECT version FROM idem_schema_version"), 5);
  EXPECT_EQ(raw.text("SELECT group_concat(id || ':' || message_id || ':' || state || ':' || destination || ':' || "
                     "headers || ':' || hex(body) || ':' || created_ms || ':' || ifnull(sent_ms, '-'), ' ') "
                     "FROM (SELECT * FROM idem_outbox ORDER BY id)"),
            "1:m-1:sent:ex/rk:{\"a\":\"b\"}:00FF:11:20 2:m-2:pending::{}:74776F:12:-");
  // No AUTOINCREMENT any more: the next id is the newest row's plus one. Row 3, purged at version
  // 4 while it was the newest, gives its id once more (docs/outbox.md); from now on the purge
  // keeps the newest row.
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM sqlite_sequence WHERE name LIKE 'idem_outbox%'"), 0);
  raw.exec("INSERT INTO idem_outbox (message_id, body) VALUES ('m-4', 'four')");
  EXPECT_EQ(raw.scalar("SELECT id FROM idem_outbox WHERE message_id = 'm-4'"), 3);
  // The triggers are gone; the relay sees to ids and header values now.
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM sqlite_master WHERE type = 'trigger'"), 0);
  EXPECT_EQ(raw.try_exec("INSERT INTO idem_outbox (message_id, headers) VALUES ('has space', '{\"n\": 1}')"), "");
  EXPECT_NE(raw.try_exec("INSERT INTO idem_outbox (message_id) VALUES ('')"), "");
  EXPECT_NE(raw.try_exec("INSERT INTO idem_outbox (message_id, headers) VALUES ('m-6', '[]')"), "");
  EXPECT_NE(raw.try_exec("UPDATE idem_outbox SET state = 'lost' WHERE id = 2"), "");
  EXPECT_NE(raw.try_exec("INSERT INTO idem_outbox (message_id) VALUES ('m-1')"), "");
  for (const char* name : {"idem_outbox_pending", "idem_outbox_sent", "idem_outbox_dead"}) {
    EXPECT_EQ(raw.scalar(std::string("SELECT count(*) FROM sqlite_master WHERE name = '") + name + "'"), 1) << name;
  }
}

// How SQLite runs `sql` on `raw` (EXPLAIN QUERY PLAN's details, one a line).
std::string query_plan(RawDb& raw, const std::string& sql) {
  sqlite3_stmt* stmt = nullptr;
  const std::string explain = "EXPLAIN QUERY PLAN " + sql;
  if (sqlite3_prepare_v2(raw.get(), explain.c_str(), -1, &stmt, nullptr) != SQLITE_OK) throw std::runtime_error(sql);
  std::string plan;
  while (sqlite3_step(stmt) == SQLITE_ROW) plan += std::string(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 3))) + "\n";
  sqlite3_finalize(stmt);
  return plan;
}

TEST(SqliteOutboxSchema, MigrationSixKeepsRowsMergesTheSettledIndexesAndLeavesHeadersToTheRelay) {
  TempDir dir;
  const std::string path = dir.file("v5.db");
  {
    RawDb raw(path);
    ASSERT_TRUE(sqlite_detail::migrate(raw.get(), 5));
    raw.exec("INSERT INTO idem_outbox (message_id, destination, headers, body, created_ms) VALUES "
             "('m-1', 'ex/rk', '{\"a\":\"b\"}', x'00ff', 11), ('m-2', '', '{}', 'two', 12), "
             "('m-3', '', '{}', 'three', 13), ('m-4', '', '{}', 'four', 14)");
    raw.exec("UPDATE idem_outbox SET state = 'sent', sent_ms = 20 WHERE message_id = 'm-1'");
    raw.exec("UPDATE idem_outbox SET state = 'dead', attempts = 3, last_error = 'why' WHERE message_id = 'm-3'");
  }
  // A relay newer than the service's store reads a file still at version 5.
  auto counts_and_dead = [&]() {
    auto reader = open_reader(path);
    auto counts = reader->count();
    if (!counts) throw std::runtime_error(counts.error().message);
    auto dead = reader->list(OutboxQuery{OutboxState::dead, 0, 10});
    if (!dead) throw std::runtime_error(dead.error().message);
    std::string out = std::to_string(counts->pending) + " " + std::to_string(counts->sent) + " " +
                      std::to_string(counts->dead) + ":";
    for (const auto& row : *dead) out += " " + row.message.message_id;
    return out;
  };
  EXPECT_EQ(counts_and_dead(), "2 1 1: m-3");

  RawDb raw(path);
  ASSERT_TRUE(sqlite_detail::migrate(raw.get(), 6));
  EXPECT_EQ(raw.scalar("SELECT version FROM idem_schema_version"), 6);
  EXPECT_EQ(raw.text("SELECT group_concat(id || ':' || message_id || ':' || state || ':' || attempts || ':' || "
                     "destination || ':' || headers || ':' || hex(body) || ':' || created_ms || ':' || "
                     "ifnull(sent_ms, '-') || ':' || ifnull(last_error, '-'), ' ') "
                     "FROM (SELECT * FROM idem_outbox ORDER BY id)"),
            "1:m-1:sent:0:ex/rk:{\"a\":\"b\"}:00FF:11:20:- 2:m-2:pending:0::{}:74776F:12:-:- "
            "3:m-3:dead:3::{}:7468726565:13:-:why 4:m-4:pending:0::{}:666F7572:14:-:-");
  EXPECT_EQ(raw.text("SELECT group_concat(name, ' ') FROM (SELECT name FROM sqlite_master WHERE type = 'index' "
                     "AND tbl_name = 'idem_outbox' AND sql IS NOT NULL ORDER BY name)"),
            "idem_outbox_pending idem_outbox_settled");
  EXPECT_EQ(counts_and_dead(), "2 1 1: m-3");
  EXPECT_NE(query_plan(raw, "SELECT count(*) FROM idem_outbox WHERE state <> 'pending' AND state = 'dead'")
                .find("USING COVERING INDEX idem_outbox_settled"),
            std::string::npos);
  EXPECT_NE(query_plan(raw, "SELECT id FROM idem_outbox WHERE state <> 'pending' AND state = 'sent' AND sent_ms < 5")
                .find("USING COVERING INDEX idem_outbox_settled (state=? AND sent_ms<?)"),
            std::string::npos);
  // The headers' JSON check is gone (the relay makes such a row dead); the others stay.
  EXPECT_EQ(raw.try_exec("INSERT INTO idem_outbox (message_id, headers) VALUES ('m-5', 'not json')"), "");
  EXPECT_NE(raw.try_exec("INSERT INTO idem_outbox (message_id) VALUES ('')"), "");
  EXPECT_NE(raw.try_exec("INSERT INTO idem_outbox (message_id, destination) VALUES ('m-6', printf('%.257c', 'a'))"), "");
  EXPECT_NE(raw.try_exec("UPDATE idem_outbox SET state = 'lost' WHERE id = 2"), "");
  EXPECT_NE(raw.try_exec("INSERT INTO idem_outbox (message_id) VALUES ('m-1')"), "");
  EXPECT_EQ(raw.scalar("SELECT max(id) FROM idem_outbox"), 5);
  auto reader = open_reader(path);
  EXPECT_EQ(reader->purge_sent(from_epoch_ms(21), 10).value(), 1u);
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM idem_outbox WHERE message_id = 'm-1'"), 0);
}

TEST(SqliteOutboxSchema, MigrationSevenDropsThePendingIndexForAScanMarkAtTheFirstPendingRow) {
  TempDir dir;
  for (const char* rows : {"mixed", "settled", "empty"}) {
    const std::string path = dir.file(std::string("v6-") + rows + ".db");
    {
      RawDb raw(path);
      ASSERT_TRUE(sqlite_detail::migrate(raw.get(), 6));
      if (std::string(rows) != "empty") {
        raw.exec("INSERT INTO idem_outbox (message_id, body, created_ms) VALUES "
                 "('m-1', 'a', 11), ('m-2', 'b', 12), ('m-3', 'c', 13), ('m-4', 'd', 14)");
        raw.exec("UPDATE idem_outbox SET state = 'sent', sent_ms = 20 WHERE id IN (1, 2)");
        raw.exec(std::string("UPDATE idem_outbox SET state = 'dead' WHERE id = 3") +
                 (std::string(rows) == "settled" ? " OR id = 4" : ""));
      }
    }
    open_and_close_store(path);
    RawDb raw(path);
    EXPECT_EQ(raw.scalar("SELECT version FROM idem_schema_version"), sqlite_detail::latest_schema_version());
    EXPECT_EQ(raw.scalar("SELECT count(*) FROM sqlite_master WHERE name = 'idem_outbox_pending'"), 0) << rows;
    const std::int64_t expected = std::string(rows) == "mixed" ? 4 : std::string(rows) == "settled" ? 5 : 0;
    EXPECT_EQ(raw.scalar("SELECT from_id FROM idem_outbox_scan"), expected) << rows;
    auto relay = open_reader(path);
    auto claimed = relay->claim(OutboxClaim{10, from_epoch_ms(100), 30s, "relay-a"}).value();
    ASSERT_EQ(claimed.size(), std::string(rows) == "mixed" ? 1u : 0u) << rows;
    if (!claimed.empty()) {
      EXPECT_EQ(claimed[0].message.message_id, "m-4");
    }
    EXPECT_EQ(raw.try_exec("INSERT INTO idem_outbox_scan (id, from_id) VALUES (2, 0)").empty(), false);
  }
  // The relay seeks to the mark: the pending rows' search reads from it, not the whole table.
  RawDb raw(dir.file("v6-mixed.db"));
  EXPECT_NE(query_plan(raw, "SELECT id FROM idem_outbox WHERE id >= (SELECT from_id FROM idem_outbox_scan) AND "
                            "state = 'pending' AND next_attempt_ms <= 5 ORDER BY id LIMIT 10")
                .find("USING INTEGER PRIMARY KEY (rowid>?)"),
            std::string::npos);
  EXPECT_NE(query_plan(raw, "SELECT id FROM idem_outbox WHERE id >= max(0 + 1, (SELECT from_id FROM idem_outbox_scan)) "
                            "AND state = 'pending' ORDER BY id LIMIT 10")
                .find("USING INTEGER PRIMARY KEY (rowid>?)"),
            std::string::npos);
}

TEST(SqliteOutboxSchema, MigrationEightAddsOrderingKeysAndARelayReadsAFileBeforeItAsKeyless) {
  TempDir dir;
  const std::string path = dir.file("v7.db");
  {
    RawDb raw(path);
    ASSERT_TRUE(sqlite_detail::migrate(raw.get(), 7));
    raw.exec("INSERT INTO idem_outbox (message_id, body, created_ms) VALUES ('m-1', 'a', 11), ('m-2', 'b', 12)");
  }
  {
    // A relay newer than the service's store: the file is still at version 7.
    auto relay = open_reader(path);
    auto claimed = relay->claim(OutboxClaim{10, from_epoch_ms(100), 30s, "relay-a"}).value();
    ASSERT_EQ(claimed.size(), 2u);
    EXPECT_EQ(claimed[0].message.ordering_key, "");
    EXPECT_EQ(relay->count().value().held_keys, 0u);
    // The service's enqueue of a message without a key still works there; one with a key says why not.
    RawDb raw(path);
    raw.exec("BEGIN");
    std::string error;
    EXPECT_TRUE(SqliteOutbox::enqueue(raw.get(), message("m-3"), from_epoch_ms(13), error)) << error;
    EXPECT_FALSE(SqliteOutbox::enqueue(raw.get(), keyed("m-4", "pay_1"), from_epoch_ms(13), error));
    EXPECT_NE(error.find("predates ordering keys"), std::string::npos) << error;
    raw.exec("COMMIT");
  }
  open_and_close_store(path);
  RawDb raw(path);
  EXPECT_EQ(raw.scalar("SELECT version FROM idem_schema_version"), 8);
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM idem_outbox WHERE ordering_key IS NULL"), 3);
  EXPECT_NE(query_plan(raw, "SELECT 1 FROM idem_outbox e WHERE e.ordering_key = 'k' AND e.id < 5 AND e.state <> 'sent' "
                            "AND e.state = 'pending'")
                .find("idem_outbox_ordering"),
            std::string::npos);
}

TEST(SqliteOutboxSchema, ARelayMadeTableIsTheFormAStoreMigratesTo) {
  TempDir dir;
  const std::string by_relay = dir.file("service.db");
  RawDb(by_relay).exec("CREATE TABLE orders (id INTEGER PRIMARY KEY)");
  auto relay = SqliteOutbox::open_reader(SqliteOutboxOptions{by_relay});
  ASSERT_TRUE(relay) << relay.error().message;
  const std::string by_store = dir.file("store.db");
  open_and_close_store(by_store);
  RawDb relay_made(by_relay);
  RawDb store_made(by_store);
  EXPECT_EQ(outbox_schema(relay_made), outbox_schema(store_made));
  EXPECT_FALSE(insert_opens_a_temporary_btree(relay_made));
  EXPECT_EQ(relay_made.scalar("SELECT count(*) FROM sqlite_master WHERE name = 'idem_outbox_rebuilt'"), 0);
}

TEST(SqliteOutboxSchema, CreatorsAtOnceDoNotRace) {
  TempDir dir;
  const std::string path = dir.file("race.db");
  RawDb(path).exec("CREATE TABLE orders (id INTEGER PRIMARY KEY)");
  constexpr int kThreads = 8;
  std::vector<std::thread> threads;
  std::vector<std::string> errors(kThreads);
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      RawDb conn(path, 10'000);
      if (auto made = sqlite_detail::ensure_outbox(conn.get(), true, path); !made) errors[i] = made.error().message;
    });
  }
  for (auto& t : threads) t.join();
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(RawDb(path).scalar("SELECT count(*) FROM sqlite_master WHERE name = 'idem_outbox'"), 1);
}

TEST(SqliteOutboxSchema, AMissingFileIsAnErrorAndIsNotCreated) {
  TempDir dir;
  const std::string path = dir.file("typo.db");
  for (bool relay : {true, false}) {
    auto reader = SqliteOutbox::open_reader(SqliteOutboxOptions{path, relay});
    ASSERT_FALSE(reader);
    EXPECT_NE(reader.error().message.find("does not exist"), std::string::npos) << reader.error().message;
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(SqliteOutbox::open_reader(SqliteOutboxOptions{":memory:"}));
  EXPECT_FALSE(SqliteOutbox::open_reader(SqliteOutboxOptions{}));
}

TEST(SqliteOutboxSchema, AnIdemSchemaNewerThanThisBuildIsRefused) {
  TempDir dir;
  const std::string path = dir.file("newer.db");
  {
    SqliteOptions options;
    options.path = path;
    ASSERT_TRUE(SqliteStore::open(options));
    RawDb(path).exec("UPDATE idem_schema_version SET version = 99");
  }
  for (bool relay : {true, false}) {
    auto reader = SqliteOutbox::open_reader(SqliteOutboxOptions{path, relay});
    ASSERT_FALSE(reader);
    EXPECT_EQ(reader.error().code, StoreErrc::corrupt) << reader.error().message;
  }
}

}  // namespace
}  // namespace idem
