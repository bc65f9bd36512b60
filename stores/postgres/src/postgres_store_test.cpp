#include "idem/postgres_store.hpp"

#include <gtest/gtest.h>
#include <libpq-fe.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <future>
#include <stdexcept>
#include <thread>
#include <vector>

#include "idem/store_admin.hpp"
#include "idem/testing/manual_clock.hpp"
#include "idem/testing/store_conformance.hpp"
#include "schema.hpp"
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
using SteadyClock = std::chrono::steady_clock;

// ---- the conformance suite ----------------------------------------------------------------------

std::string last_conformance_schema;  // the schema the last `make` opened, for `share`

std::unique_ptr<Store> make_conformance_store() {
  last_conformance_schema = fresh_schema();  // a new, empty schema per store
  return open_store(options_for(last_conformance_schema));
}

// Another replica: a store of its own, with its own connections, over the same table.
std::unique_ptr<Store> share_conformance_store() { return open_store(options_for(last_conformance_schema)); }

}  // namespace

namespace testing {
INSTANTIATE_TEST_SUITE_P(Postgres, StoreConformance,
                         ::testing::Values(StoreFactory{"postgres", make_conformance_store, share_conformance_store}),
                         StoreConformance::name_of);
INSTANTIATE_TEST_SUITE_P(Postgres, ConsumerConformance,
                         ::testing::Values(StoreFactory{"postgres", make_conformance_store, share_conformance_store}),
                         ConsumerConformance::name_of);
}  // namespace testing

namespace {

// ---- helpers ------------------------------------------------------------------------------------

constexpr Millis kLease = 60s;
constexpr Millis kRetention = 24h;

ClaimRequest claim_request(const Clock& clock, const std::string& key, const std::string& hash = "h1",
                           std::string tenant = "t") {
  ClaimRequest r;
  r.id = RecordId{std::move(tenant), key};
  r.request_hash = hash;
  r.token = new_fencing_token();
  r.now = clock.now();
  r.lease_expires = r.now + kLease;
  r.expires = r.now + kRetention;
  return r;
}

Fence fence_of(const ClaimResult& c) { return Fence{RecordId{c.record.tenant, c.record.key}, c.record.fencing_token}; }

CompleteRequest complete_request(const Clock& clock, const Fence& fence, std::string body = "{\"ok\":true}") {
  return CompleteRequest{fence, StoredResponse{201, {{"Content-Type", "application/json"}}, std::move(body)},
                         clock.now(), clock.now() + kRetention};
}

ClaimResult must_claim(PostgresStore& store, const ClaimRequest& request) {
  auto c = BlockingStore(store).claim(request);
  if (!c) throw std::runtime_error("claim: " + c.error().message);
  return *c;
}

Millis elapsed_since(SteadyClock::time_point start) {
  return std::chrono::duration_cast<Millis>(SteadyClock::now() - start);
}


// ---- migrations ---------------------------------------------------------------------------------

TEST(PostgresMigrations, FreshSchemaIsCreatedAtTheLatestVersion) {
  const std::string schema = fresh_schema();
  auto store = open_store(options_for(schema));
  RawConn raw;
  EXPECT_EQ(raw.exec("SELECT version FROM " + qualified(schema, "idem_schema_version")),
            std::to_string(PostgresStore::schema_version()));
  // SPEC §6: the table, its primary key, and the reaper's index on expiry.
  EXPECT_EQ(raw.exec("SELECT count(*) FROM pg_indexes WHERE schemaname = '" + schema +
                     "' AND tablename = 'idempotency_keys'"),
            "2");
  EXPECT_EQ(raw.exec("SELECT indexdef LIKE '%(expires_ms)%' FROM pg_indexes WHERE schemaname = '" + schema +
                     "' AND indexname = 'idempotency_keys_expires'"),
            "t");
}

TEST(PostgresMigrations, ReopeningKeepsTheDataAndDoesNotMigrateAgain) {
  const std::string schema = fresh_schema();
  ManualClock clock;
  ClaimResult claimed;
  {
    auto store = open_store(options_for(schema));
    claimed = must_claim(*store, claim_request(clock, "key-reopen-000001"));
  }
  auto store = open_store(options_for(schema));
  auto r = BlockingStore(*store).get(RecordId{"t", "key-reopen-000001"});
  ASSERT_TRUE(r && *r);
  EXPECT_EQ((*r)->fencing_token, claimed.record.fencing_token);
  RawConn raw;
  EXPECT_EQ(raw.exec("SELECT count(*) FROM " + qualified(schema, "idem_schema_version")), "1");
}

TEST(PostgresMigrations, ReplicasOpeningAFreshSchemaAtOnceMigrateItOnce) {
  const std::string schema = fresh_schema();
  constexpr int kReplicas = 8;
  std::barrier start(kReplicas);
  std::vector<std::future<StoreResult<std::unique_ptr<PostgresStore>>>> opened;
  for (int i = 0; i < kReplicas; ++i) {
    opened.push_back(std::async(std::launch::async, [&] {
      PostgresOptions o = options_for(schema);
      o.pool_size = 1;
      start.arrive_and_wait();
      return PostgresStore::open(std::move(o));
    }));
  }
  std::vector<std::unique_ptr<PostgresStore>> stores;
  for (auto& f : opened) {
    auto s = f.get();
    ASSERT_TRUE(s.has_value()) << s.error().message;
    stores.push_back(std::move(*s));
  }
  ManualClock clock;
  EXPECT_EQ(must_claim(*stores[3], claim_request(clock, "key-concurrent-open")).status, ClaimStatus::claimed);
  EXPECT_EQ(must_claim(*stores[5], claim_request(clock, "key-concurrent-open")).status, ClaimStatus::in_progress);
  RawConn raw;
  EXPECT_EQ(raw.exec("SELECT version FROM " + qualified(schema, "idem_schema_version")),
            std::to_string(PostgresStore::schema_version()));
}

// Migration 3 (attempt numbers, lookups): rows of version 2 are first attempts and count on; a
// replica of version 2 still claiming through the eight-parameter idem_claim keeps working.
TEST(PostgresMigrations, ASchemaOfVersionTwoGainsAttemptNumbers) {
  const std::string schema = fresh_schema();
  RawConn raw;
  ASSERT_TRUE(postgres_detail::migrate(raw.get(), schema, true, 10s, /*target=*/2));
  const std::string table = qualified(schema, "idempotency_keys");
  raw.exec("INSERT INTO " + table +
           " (tenant_id, key, state, request_hash, fencing_token, lease_expires_ms, created_ms, expires_ms) "
           "VALUES ('t', 'key-from-version-2', 'in_progress', 'h1', 7, 0, 1, 99999999999999)");
  auto store = open_store(options_for(schema));
  EXPECT_EQ(raw.exec("SELECT version FROM " + qualified(schema, "idem_schema_version")),
            std::to_string(PostgresStore::schema_version()));
  auto old = BlockingStore(*store).get(RecordId{"t", "key-from-version-2"});
  ASSERT_TRUE(old && *old);
  EXPECT_EQ((*old)->attempt, 1u);
  EXPECT_EQ((*old)->lookup, "");
  ManualClock clock;
  auto takeover = must_claim(*store, claim_request(clock, "key-from-version-2"));
  ASSERT_EQ(takeover.status, ClaimStatus::claimed);
  EXPECT_EQ(takeover.kind, ClaimKind::after_lease_expiry);
  EXPECT_EQ(takeover.record.attempt, 2u);
  EXPECT_EQ(raw.exec("SELECT attempt FROM " + table + " WHERE key = 'key-from-version-2'"), "2");
  // The previous version's call: eight parameters, twelve columns, the row's count untouched.
  EXPECT_EQ(raw.exec("SELECT o_outcome FROM " + qualified(schema, "idem_claim") +
                     "('t', 'key-old-replica-01', 'h1', 5, 1000, 2000, 99999999999999, true)"),
            "claimed");
  EXPECT_EQ(raw.exec("SELECT attempt FROM " + table + " WHERE key = 'key-old-replica-01'"), "1");
}

TEST(PostgresMigrations, ASchemaNewerThanThisBuildIsRefused) {
  const std::string schema = fresh_schema();
  open_store(options_for(schema)).reset();
  RawConn raw;
  raw.exec("UPDATE " + qualified(schema, "idem_schema_version") + " SET version = version + 1");
  auto store = PostgresStore::open(options_for(schema));
  ASSERT_FALSE(store.has_value());
  EXPECT_EQ(store.error().code, StoreErrc::corrupt);
  EXPECT_NE(store.error().message.find("newer than this build"), std::string::npos) << store.error().message;
}

TEST(PostgresMigrations, WithoutMigrationsAMissingSchemaIsRefusedNotCreated) {
  const std::string schema = fresh_schema();
  PostgresOptions o = options_for(schema);
  o.migrate = false;
  auto store = PostgresStore::open(std::move(o));
  ASSERT_FALSE(store.has_value());
  EXPECT_EQ(store.error().code, StoreErrc::corrupt);
  EXPECT_NE(store.error().message.find("PostgresOptions::migrate"), std::string::npos) << store.error().message;
  RawConn raw;
  EXPECT_EQ(raw.exec("SELECT count(*) FROM pg_namespace WHERE nspname = '" + schema + "'"), "0");
}

// ---- connections and errors ---------------------------------------------------------------------

TEST(PostgresErrorsLive, AnUnreachableServerFailsFastAtOpen) {
  pgtest::Proxy proxy("127.0.0.1", pgtest::port_of(pgtest::server_url()));
  const std::string url = proxy.url_via(pgtest::server_url());
  proxy.freeze();  // accepts TCP connections (the kernel does) and never answers
  PostgresOptions o = options_for(fresh_schema(), url);
  o.connect_timeout = 300ms;
  const auto start = SteadyClock::now();
  auto store = PostgresStore::open(std::move(o));
  ASSERT_FALSE(store.has_value());
  EXPECT_EQ(store.error().code, StoreErrc::unavailable) << store.error().message;
  EXPECT_LT(elapsed_since(start), 2s);
  proxy.thaw();
}

TEST(PostgresErrorsLive, ARefusedConnectionFailsAtOnce) {
  pgtest::Proxy proxy("127.0.0.1", 1);  // nothing listens on port 1: the proxy closes each connection
  PostgresOptions o = options_for(fresh_schema(), proxy.url_via(pgtest::server_url()));
  const auto start = SteadyClock::now();
  auto store = PostgresStore::open(std::move(o));
  ASSERT_FALSE(store.has_value());
  EXPECT_EQ(store.error().code, StoreErrc::unavailable) << store.error().message;
  EXPECT_LT(elapsed_since(start), 1s);
}

TEST(PostgresErrorsLive, StatementTimeoutIsATimeoutAndChangesNothing) {
  const std::string schema = fresh_schema();
  PostgresOptions o = options_for(schema);
  o.statement_timeout = 300ms;
  auto store = open_store(o);
  ManualClock clock;
  auto c = must_claim(*store, claim_request(clock, "key-stmt-timeout-1"));
  RawConn locker;
  locker.exec("BEGIN");
  locker.exec("SELECT 1 FROM " + qualified(schema, "idempotency_keys") + " WHERE key = 'key-stmt-timeout-1' FOR UPDATE");
  const auto start = SteadyClock::now();
  auto done = BlockingStore(*store).complete(complete_request(clock, fence_of(c)));
  ASSERT_FALSE(done.has_value());
  EXPECT_EQ(done.error().code, StoreErrc::timeout) << done.error().message;
  EXPECT_FALSE(done.error().in_doubt);  // the server said it cancelled: nothing committed
  EXPECT_LT(elapsed_since(start), 3s);  // the server's cancel, not the client's deadline
  locker.exec("ROLLBACK");
  EXPECT_EQ(BlockingStore(*store).get(RecordId{"t", "key-stmt-timeout-1"}).value()->state, RecordState::in_progress);
  auto again = BlockingStore(*store).complete(complete_request(clock, fence_of(c)));
  ASSERT_TRUE(again.has_value()) << again.error().message;
  EXPECT_EQ(*again, FenceStatus::ok);
}

TEST(PostgresErrorsLive, ConnectionsClosedWhileIdleAreReplacedTransparently) {
  pgtest::Proxy proxy("127.0.0.1", pgtest::port_of(pgtest::server_url()));
  auto store = open_store(options_for(fresh_schema(), proxy.url_via(pgtest::server_url())));
  ManualClock clock;
  must_claim(*store, claim_request(clock, "key-idle-cut-00000"));
  proxy.cut();  // every connection of the pool dies while idle
  std::this_thread::sleep_for(50ms);
  for (int i = 0; i < 10; ++i) {
    auto c = BlockingStore(*store).claim(claim_request(clock, "key-idle-cut-" + std::to_string(10000 + i)));
    ASSERT_TRUE(c.has_value()) << c.error().message;  // nothing was in flight: nothing may fail
    EXPECT_EQ(c->status, ClaimStatus::claimed);
  }
  EXPECT_GE(store->stats().connects, 5u);
}

TEST(PostgresErrorsLive, TerminatedBackendsAreReplaced) {
  PostgresOptions o = options_for(fresh_schema());
  o.application_name = "idem-test-terminate-" + std::to_string(::getpid());
  auto store = open_store(o);
  ManualClock clock;
  must_claim(*store, claim_request(clock, "key-terminated-000"));
  RawConn raw;
  EXPECT_EQ(raw.exec("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = '" +
                     o.application_name + "'"),
            "4");
  std::this_thread::sleep_for(100ms);
  for (int i = 0; i < 8; ++i) {
    auto c = BlockingStore(*store).claim(claim_request(clock, "key-terminated-" + std::to_string(100 + i)));
    ASSERT_TRUE(c.has_value()) << c.error().message;
  }
}

TEST(PostgresErrorsLive, AConnectionLostAfterTheCommitWasSentIsInDoubtAndMayHaveCommitted) {
  const std::string schema = fresh_schema();
  pgtest::Proxy proxy("127.0.0.1", pgtest::port_of(pgtest::server_url()));
  auto store = open_store(options_for(schema, proxy.url_via(pgtest::server_url())));
  ManualClock clock;
  auto c = must_claim(*store, claim_request(clock, "key-in-doubt-00001"));
  RawConn locker;  // holds the row so that the completion is sent but not yet answered
  locker.exec("BEGIN");
  locker.exec("SELECT 1 FROM " + qualified(schema, "idempotency_keys") + " WHERE key = 'key-in-doubt-00001' FOR UPDATE");
  std::promise<StoreResult<FenceStatus>> answer;
  store->complete(complete_request(clock, fence_of(c)), [&](StoreResult<FenceStatus> r) { answer.set_value(r); });
  std::this_thread::sleep_for(300ms);
  proxy.cut();
  auto result = answer.get_future().get();
  ASSERT_FALSE(result.has_value());
  EXPECT_EQ(result.error().code, StoreErrc::unavailable) << result.error().message;
  EXPECT_TRUE(result.error().in_doubt) << result.error().message;
  EXPECT_EQ(store->stats().in_doubt, 1u);
  // Indeed: the server had the whole transaction and commits it once the lock is free.
  locker.exec("COMMIT");
  RawConn raw;
  const auto deadline = SteadyClock::now() + 5s;
  std::optional<std::string> state;
  while (SteadyClock::now() < deadline) {
    state = raw.exec("SELECT state FROM " + qualified(schema, "idempotency_keys") + " WHERE key = 'key-in-doubt-00001'");
    if (state == "completed") break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(state, "completed");
}

TEST(PostgresErrorsLive, AServerThatStopsAnsweringTimesOutInDoubt) {
  pgtest::Proxy proxy("127.0.0.1", pgtest::port_of(pgtest::server_url()));
  PostgresOptions o = options_for(fresh_schema(), proxy.url_via(pgtest::server_url()));
  o.statement_timeout = 200ms;
  o.connect_timeout = 300ms;
  auto store = open_store(o);
  ManualClock clock;
  auto c = must_claim(*store, claim_request(clock, "key-frozen-000001"));
  proxy.freeze();
  // The caller's thread never waits for the server: the call returns, the answer comes later.
  std::promise<StoreResult<ClaimResult>> later;
  const auto call = SteadyClock::now();
  store->claim(claim_request(clock, "key-frozen-async-1"), [&](StoreResult<ClaimResult> r) { later.set_value(r); });
  EXPECT_LT(elapsed_since(call), 50ms);
  const auto start = SteadyClock::now();
  auto done = BlockingStore(*store).complete(complete_request(clock, fence_of(c)));
  ASSERT_FALSE(done.has_value());
  EXPECT_EQ(done.error().code, StoreErrc::timeout) << done.error().message;
  EXPECT_TRUE(done.error().in_doubt);
  EXPECT_LT(elapsed_since(start), 3s);
  // While it stays silent, claims fail fast instead of hanging: the pool's remaining
  // connections time out the same way, then new ones cannot be opened.
  for (int i = 0; i < 4; ++i) {
    const auto t = SteadyClock::now();
    auto r = BlockingStore(*store).claim(claim_request(clock, "key-frozen-" + std::to_string(100000 + i)));
    EXPECT_FALSE(r.has_value());
    EXPECT_LT(elapsed_since(t), 3s);
  }
  EXPECT_FALSE(later.get_future().get().has_value());
  proxy.thaw();
  proxy.cut();  // the held-back connections are of no use now
  const auto deadline = SteadyClock::now() + 5s;
  bool recovered = false;
  while (!recovered && SteadyClock::now() < deadline) {
    recovered = BlockingStore(*store).claim(claim_request(clock, "key-frozen-recovered")).has_value();
    if (!recovered) std::this_thread::sleep_for(50ms);
  }
  EXPECT_TRUE(recovered);
}

TEST(PostgresErrorsLive, TextTheServerWouldRefuseIsTurnedAwayBeforeIt) {
  auto store = open_store(options_for(fresh_schema()));
  ManualClock clock;
  auto bad = BlockingStore(*store).claim(claim_request(clock, "key-bad-utf8-00001", "h1", "tenant-\xff"));
  ASSERT_FALSE(bad.has_value());
  EXPECT_EQ(bad.error().code, StoreErrc::internal);
  EXPECT_FALSE(bad.error().retryable());
}

// ---- batching -----------------------------------------------------------------------------------

TEST(PostgresBatching, ConcurrentCallersShareTransactions) {
  PostgresOptions o = options_for(fresh_schema());
  o.pool_size = 2;
  auto store = open_store(o);
  ManualClock clock;
  constexpr int kThreads = 32, kEach = 20;
  std::atomic<int> claimed{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      BlockingStore b(*store);
      for (int i = 0; i < kEach; ++i) {
        auto c = b.claim(claim_request(clock, "key-batch-" + std::to_string(t * 1000 + i) + "-00000"));
        if (c && c->status == ClaimStatus::claimed && b.complete(complete_request(clock, fence_of(*c)))) ++claimed;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(claimed.load(), kThreads * kEach);
  const auto stats = store->stats();
  EXPECT_GT(stats.largest_batch, 1u);
  EXPECT_LT(stats.transactions, stats.operations);
}

TEST(PostgresBatching, AnOperationTheServerRefusesFailsAloneNotItsBatch) {
  const std::string schema = fresh_schema();
  PostgresOptions o = options_for(schema);
  o.pool_size = 1;  // one connection: what queues behind the slow call shares one transaction
  auto store = open_store(o);
  ManualClock clock;
  auto held = must_claim(*store, claim_request(clock, "key-refused-000000"));
  auto slow = must_claim(*store, claim_request(clock, "key-refused-slow00"));

  std::promise<StoreResult<FenceStatus>> slow_done;
  store->complete_in_transaction(
      complete_request(clock, fence_of(slow)),
      [](PostgresTransaction& tx, std::string&) { return tx.exec("SELECT pg_sleep(0.3)").has_value(); },
      [&](StoreResult<FenceStatus> r) { slow_done.set_value(r); });
  std::this_thread::sleep_for(50ms);

  // Queued behind it: good claims and one completion the schema refuses (status out of range).
  std::vector<std::promise<StoreResult<ClaimResult>>> claims(5);
  for (int i = 0; i < 5; ++i) {
    store->claim(claim_request(clock, "key-refused-good0" + std::to_string(i)),
                 [&, i](StoreResult<ClaimResult> r) { claims[static_cast<std::size_t>(i)].set_value(r); });
  }
  CompleteRequest refused = complete_request(clock, fence_of(held));
  refused.response.status = 42;
  std::promise<StoreResult<FenceStatus>> refused_done;
  store->complete(refused, [&](StoreResult<FenceStatus> r) { refused_done.set_value(r); });

  ASSERT_TRUE(slow_done.get_future().get().has_value());
  for (auto& c : claims) {
    auto r = c.get_future().get();
    ASSERT_TRUE(r.has_value()) << r.error().message;
    EXPECT_EQ(r->status, ClaimStatus::claimed);
  }
  auto r = refused_done.get_future().get();
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, StoreErrc::internal);
  EXPECT_NE(r.error().message.find("23514"), std::string::npos) << r.error().message;
  EXPECT_GE(store->stats().isolated, 1u);
  EXPECT_EQ(BlockingStore(*store).get(RecordId{"t", "key-refused-000000"}).value()->state, RecordState::in_progress);
}

// ---- batch calls -----------------------------------------------------------------------------------

// A batch call is one pipelined transaction, one round trip, even past max_batch.
TEST(PostgresBatchCalls, ABatchIsOneTransactionHoweverLarge) {
  PostgresOptions o = options_for(fresh_schema());
  o.pool_size = 1;
  o.max_batch = 16;
  auto store = open_store(o);
  ManualClock clock;
  std::vector<ClaimRequest> requests;
  for (int i = 0; i < 100; ++i) requests.push_back(claim_request(clock, "key-one-trip-" + std::to_string(1000 + i)));
  const auto before = store->stats();
  auto claims = BlockingStore(*store).claim_many(std::move(requests));
  const auto after = store->stats();
  ASSERT_EQ(claims.size(), 100u);
  for (const auto& c : claims) ASSERT_TRUE(c && c->status == ClaimStatus::claimed);
  EXPECT_EQ(after.transactions - before.transactions, 1u);
  EXPECT_EQ(after.operations - before.operations, 100u);
  EXPECT_GE(after.largest_batch, 100u);
}

// An item the server refuses (a status the schema's check forbids) rolls the transaction back;
// the items then run one by one, so that only it fails. An item the store refuses before the
// server (text that is not UTF-8) fails alone without being sent.
TEST(PostgresBatchCalls, AnItemTheServerRefusesFailsAloneNotItsBatch) {
  auto store = open_store(options_for(fresh_schema()));
  ManualClock clock;
  auto a = must_claim(*store, claim_request(clock, "key-batch-refused-a"));
  auto b = must_claim(*store, claim_request(clock, "key-batch-refused-b"));
  auto c = must_claim(*store, claim_request(clock, "key-batch-refused-c"));
  CompleteRequest refused = complete_request(clock, fence_of(b));
  refused.response.status = 42;
  auto results = BlockingStore(*store).complete_many(
      {complete_request(clock, fence_of(a)), refused, complete_request(clock, fence_of(c))});
  ASSERT_EQ(results.size(), 3u);
  ASSERT_TRUE(results[0] && results[2]);
  EXPECT_EQ(*results[0], FenceStatus::ok);
  EXPECT_EQ(*results[2], FenceStatus::ok);
  ASSERT_FALSE(results[1]);
  EXPECT_NE(results[1].error().message.find("23514"), std::string::npos) << results[1].error().message;
  EXPECT_GE(store->stats().isolated, 1u);
  EXPECT_EQ(BlockingStore(*store).get(RecordId{"t", "key-batch-refused-b"}).value()->state, RecordState::in_progress);

  auto claims = BlockingStore(*store).claim_many(
      {claim_request(clock, "key-batch-utf8-ok"), claim_request(clock, "key-batch-utf8-bad", "h1", "tenant-\xff")});
  ASSERT_TRUE(claims[0]);
  EXPECT_EQ(claims[0]->status, ClaimStatus::claimed);
  ASSERT_FALSE(claims[1]);
  EXPECT_EQ(claims[1].error().code, StoreErrc::internal);
}

// The server cannot be reached: every item fails as unavailable, none in doubt, and nothing of
// the batch is written; once it can, the same batch succeeds.
TEST(PostgresBatchCalls, ABatchAgainstAnUnreachableServerFailsEveryItemAndWritesNothing) {
  const std::string schema = fresh_schema();
  pgtest::Proxy proxy("127.0.0.1", pgtest::port_of(pgtest::server_url()));
  PostgresOptions o = options_for(schema, proxy.url_via(pgtest::server_url()));
  o.connect_timeout = 300ms;
  o.pool_size = 1;
  auto store = open_store(o);
  ManualClock clock;
  auto held = must_claim(*store, claim_request(clock, "key-unreachable-held"));
  proxy.cut();
  proxy.freeze();  // the dropped connection cannot be replaced
  std::vector<ClaimRequest> requests;
  for (int i = 0; i < 5; ++i) requests.push_back(claim_request(clock, "key-unreachable-" + std::to_string(i)));
  auto claims = BlockingStore(*store).claim_many(requests);
  auto completes = BlockingStore(*store).complete_many({complete_request(clock, fence_of(held))});
  ASSERT_EQ(claims.size(), 5u);
  for (const auto& c : claims) {
    ASSERT_FALSE(c);
    EXPECT_EQ(c.error().code, StoreErrc::unavailable) << c.error().message;
    EXPECT_FALSE(c.error().in_doubt);
  }
  ASSERT_FALSE(completes[0]);
  EXPECT_FALSE(completes[0].error().in_doubt);
  RawConn raw;
  EXPECT_EQ(raw.exec("SELECT count(*) FROM " + qualified(schema, "idempotency_keys") + " WHERE key LIKE 'key-unreachable-_'"),
            "0");
  proxy.thaw();
  const auto deadline = SteadyClock::now() + 5s;
  BatchResults<ClaimResult> again;
  do {
    std::this_thread::sleep_for(100ms);
    again = BlockingStore(*store).claim_many(requests);
  } while (!again[0] && SteadyClock::now() < deadline);
  for (const auto& c : again) {
    ASSERT_TRUE(c) << c.error().message;
    EXPECT_EQ(c->status, ClaimStatus::claimed);
  }
}

// The connection is lost after the batch's commit was sent: every write of it is in doubt, and
// the server commits all of it or nothing (here all, once the row it waited for is free).
TEST(PostgresBatchCalls, ABatchLostAfterItsCommitWasSentIsInDoubtAndAllOrNothing) {
  const std::string schema = fresh_schema();
  pgtest::Proxy proxy("127.0.0.1", pgtest::port_of(pgtest::server_url()));
  auto store = open_store(options_for(schema, proxy.url_via(pgtest::server_url())));
  ManualClock clock;
  std::vector<CompleteRequest> completions;
  for (int i = 0; i < 3; ++i) {
    auto c = must_claim(*store, claim_request(clock, "key-batch-doubt-" + std::to_string(i)));
    completions.push_back(complete_request(clock, fence_of(c)));
  }
  RawConn locker;  // holds one row: the batch is sent, and waits
  locker.exec("BEGIN");
  locker.exec("SELECT 1 FROM " + qualified(schema, "idempotency_keys") + " WHERE key = 'key-batch-doubt-1' FOR UPDATE");
  std::promise<BatchResults<FenceStatus>> answer;
  store->complete_many(std::move(completions), [&](BatchResults<FenceStatus> r) { answer.set_value(std::move(r)); });
  std::this_thread::sleep_for(300ms);
  proxy.cut();
  auto results = answer.get_future().get();
  ASSERT_EQ(results.size(), 3u);
  for (const auto& r : results) {
    ASSERT_FALSE(r);
    EXPECT_TRUE(r.error().in_doubt) << r.error().message;
  }
  RawConn raw;
  const std::string completed =
      "SELECT count(*) FROM " + qualified(schema, "idempotency_keys") + " WHERE key LIKE 'key-batch-doubt-_' AND state = 'completed'";
  EXPECT_EQ(raw.exec(completed), "0");  // nothing before the commit
  locker.exec("COMMIT");
  const auto deadline = SteadyClock::now() + 5s;
  std::optional<std::string> count;
  while (SteadyClock::now() < deadline) {
    count = raw.exec(completed);
    if (count == "3") break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(count, "3");
}

// ---- transactional completion -------------------------------------------------------------------

class PostgresTransactional : public ::testing::Test {
 protected:
  void SetUp() override {
    schema_ = fresh_schema();
    store_ = open_store(options_for(schema_));
    RawConn raw;
    raw.exec("CREATE TABLE " + ledger() + " (id text PRIMARY KEY, amount integer NOT NULL)");
  }
  std::string ledger() const { return qualified(schema_, "ledger"); }
  std::optional<std::string> ledger_amount(const std::string& id) {
    RawConn raw;
    return raw.exec("SELECT amount FROM " + ledger() + " WHERE id = '" + id + "'");
  }
  std::optional<Record> record(const std::string& key) { return BlockingStore(*store_).get(RecordId{"t", key}).value(); }

  std::string schema_;
  std::unique_ptr<PostgresStore> store_;
  ManualClock clock_;
};

TEST_F(PostgresTransactional, TheApplicationsWritesAndTheCompletionCommitTogether) {
  auto c = must_claim(*store_, claim_request(clock_, "key-tx-commit-0001"));
  auto done = store_->complete_in_transaction(
      complete_request(clock_, fence_of(c), "{\"id\":\"pay_1\"}"), [&](PostgresTransaction& tx, std::string& error) {
        auto r = tx.exec("INSERT INTO " + ledger() + " (id, amount) VALUES ($1, $2)", {"pay_1", "100"});
        if (!r) error = r.error().message;
        return r.has_value() && r->affected == 1;
      });
  ASSERT_TRUE(done.has_value()) << done.error().message;
  EXPECT_EQ(*done, FenceStatus::ok);
  EXPECT_EQ(ledger_amount("pay_1"), "100");
  auto r = record("key-tx-commit-0001");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->state, RecordState::completed);
  EXPECT_EQ(r->response->body, "{\"id\":\"pay_1\"}");
}

TEST_F(PostgresTransactional, WorkThatFailsRollsBackEverything) {
  auto c = must_claim(*store_, claim_request(clock_, "key-tx-rollback-01"));
  auto done = store_->complete_in_transaction(complete_request(clock_, fence_of(c)),
                                              [&](PostgresTransaction& tx, std::string& error) {
                                                (void)tx.exec("INSERT INTO " + ledger() + " VALUES ('pay_2', 5)");
                                                error = "insufficient funds";
                                                return false;
                                              });
  ASSERT_FALSE(done.has_value());
  EXPECT_EQ(done.error().code, StoreErrc::internal);
  EXPECT_NE(done.error().message.find("insufficient funds"), std::string::npos);
  EXPECT_FALSE(ledger_amount("pay_2"));
  auto r = record("key-tx-rollback-01");
  EXPECT_EQ(r->state, RecordState::in_progress);
  EXPECT_EQ(r->fencing_token, c.record.fencing_token);
  // The holder may still finish normally.
  EXPECT_EQ(BlockingStore(*store_).complete(complete_request(clock_, fence_of(c))).value(), FenceStatus::ok);
}

TEST_F(PostgresTransactional, AStaleHolderIsFencedOutAndItsWorkNeverRuns) {
  auto old_holder = must_claim(*store_, claim_request(clock_, "key-tx-stale-00001"));
  clock_.advance(kLease);
  auto new_holder = must_claim(*store_, claim_request(clock_, "key-tx-stale-00001"));
  ASSERT_EQ(new_holder.status, ClaimStatus::claimed);
  bool ran = false;
  auto done = store_->complete_in_transaction(complete_request(clock_, fence_of(old_holder)),
                                              [&](PostgresTransaction& tx, std::string&) {
                                                ran = true;
                                                return tx.exec("INSERT INTO " + ledger() + " VALUES ('pay_3', 1)").has_value();
                                              });
  ASSERT_TRUE(done.has_value()) << done.error().message;
  EXPECT_EQ(*done, FenceStatus::lost);
  EXPECT_FALSE(ran);
  EXPECT_FALSE(ledger_amount("pay_3"));
  EXPECT_EQ(record("key-tx-stale-00001")->fencing_token, new_holder.record.fencing_token);
}

TEST_F(PostgresTransactional, AFailedStatementRollsBackAndKeepsItsRetryableCode) {
  PostgresOptions o = options_for(schema_);
  o.statement_timeout = 200ms;
  auto store = open_store(o);
  auto c = must_claim(*store, claim_request(clock_, "key-tx-timeout-001"));
  auto done = store->complete_in_transaction(complete_request(clock_, fence_of(c)),
                                             [&](PostgresTransaction& tx, std::string& error) {
                                               (void)tx.exec("INSERT INTO " + ledger() + " VALUES ('pay_4', 1)");
                                               auto slow = tx.exec("SELECT pg_sleep(2)");
                                               if (!slow) error = "the report query failed";
                                               return slow.has_value();
                                             });
  ASSERT_FALSE(done.has_value());
  EXPECT_EQ(done.error().code, StoreErrc::timeout) << done.error().message;
  EXPECT_FALSE(done.error().in_doubt);
  EXPECT_FALSE(ledger_amount("pay_4"));
  // A statement error the work ignores still rolls everything back.
  auto ignored = store->complete_in_transaction(complete_request(clock_, fence_of(c)),
                                                [&](PostgresTransaction& tx, std::string&) {
                                                  (void)tx.exec("INSERT INTO " + ledger() + " VALUES ('pay_5', 1)");
                                                  (void)tx.exec("SELECT * FROM no_such_table");
                                                  return true;
                                                });
  ASSERT_FALSE(ignored.has_value());
  EXPECT_NE(ignored.error().message.find("42P01"), std::string::npos) << ignored.error().message;
  EXPECT_FALSE(ledger_amount("pay_5"));
  EXPECT_EQ(record("key-tx-timeout-001")->state, RecordState::in_progress);
}

TEST_F(PostgresTransactional, TheNativeHandleRunsInTheSameTransaction) {
  auto c = must_claim(*store_, claim_request(clock_, "key-tx-native-0001"));
  auto done = store_->complete_in_transaction(
      complete_request(clock_, fence_of(c)), [&](PostgresTransaction& tx, std::string& error) {
        PGconn* conn = tx.native_handle();
        const std::string sql = "INSERT INTO " + ledger() + " VALUES ('pay_6', 6)";
        PGresult* r = PQexec(conn, sql.c_str());
        const bool ok = PQresultStatus(r) == PGRES_COMMAND_OK;
        if (!ok) error = PQresultErrorMessage(r);
        PQclear(r);
        return ok && PQtransactionStatus(conn) == PQTRANS_INTRANS;
      });
  ASSERT_TRUE(done.has_value()) << done.error().message;
  EXPECT_EQ(*done, FenceStatus::ok);
  EXPECT_EQ(ledger_amount("pay_6"), "6");
  // The connection went back to the pool in working order.
  EXPECT_EQ(must_claim(*store_, claim_request(clock_, "key-tx-native-0002")).status, ClaimStatus::claimed);
}

// Many completions in one transaction, a savepoint each: a work that declines, one whose statement
// fails, a stale holder (its work never runs), a work that takes its own record, and a key the
// server would refuse each fail alone; the others commit together.
TEST_F(PostgresTransactional, ManyCompletionsCommitTogetherAndEachFailureStaysInItsSavepoint) {
  const std::vector<std::string> keys = {"key-many-ok-000001", "key-many-declined1", "key-many-stmt-fail",
                                         "key-many-stale-001", "key-many-self-lost", "key-many-last-0001"};
  std::vector<ClaimResult> claims;
  for (const auto& key : keys) claims.push_back(must_claim(*store_, claim_request(clock_, key)));
  clock_.advance(std::chrono::hours(1));  // every lease ran out; one is taken over
  auto taker = must_claim(*store_, claim_request(clock_, "key-many-stale-001"));
  ASSERT_EQ(taker.status, ClaimStatus::claimed);
  auto insert = [&](std::string id, bool succeed = true, bool* ran = nullptr) {
    return [this, id = std::move(id), succeed, ran](PostgresTransaction& tx, std::string& error) {
      if (ran) *ran = true;
      auto r = tx.exec("INSERT INTO " + ledger() + " (id, amount) VALUES ($1, 1)", {id});
      if (!r) error = r.error().message;
      if (r && !succeed) error = "insufficient funds";
      return r.has_value() && succeed;
    };
  };
  bool stale_ran = false;
  std::vector<PostgresWorkItem> items;
  items.push_back({complete_request(clock_, fence_of(claims[0])), insert("pay_ok")});
  items.push_back({complete_request(clock_, fence_of(claims[1])), insert("pay_declined", false)});
  items.push_back({complete_request(clock_, fence_of(claims[2])), [&](PostgresTransaction& tx, std::string& error) {
                     (void)tx.exec("INSERT INTO " + ledger() + " (id, amount) VALUES ('pay_stmt', 1)");
                     auto r = tx.exec("INSERT INTO " + ledger() + " (id, amount) VALUES ('pay_ok', 2)");  // duplicate key
                     if (!r) error = "the ledger refused it";
                     return r.has_value();
                   }});
  items.push_back({complete_request(clock_, fence_of(claims[3])), insert("pay_stale", true, &stale_ran)});
  items.push_back({complete_request(clock_, fence_of(claims[4])), [&](PostgresTransaction& tx, std::string&) {
                     (void)tx.exec("INSERT INTO " + ledger() + " (id, amount) VALUES ('pay_self', 1)");
                     // Misbehaving work that changes its own record: the completion is fenced out.
                     return tx.exec("UPDATE " + qualified(schema_, "idempotency_keys") +
                                    " SET fencing_token = fencing_token + 1 WHERE key = 'key-many-self-lost'")
                         .has_value();
                   }});
  items.push_back({complete_request(clock_, Fence{RecordId{"t", std::string("bad\0key", 7)}, 1}), insert("pay_bad")});
  items.push_back({complete_request(clock_, fence_of(claims[5])), insert("pay_last")});
  auto results = store_->complete_many_in_transaction(std::move(items));
  ASSERT_EQ(results.size(), 7u);
  for (std::size_t i : {0, 1, 2, 3, 4, 6}) ASSERT_TRUE(results[i].has_value()) << i << ": " << results[i].error().message;
  EXPECT_EQ(results[0]->status, WorkStatus::committed);
  EXPECT_EQ(results[1]->status, WorkStatus::declined);
  EXPECT_NE(results[1]->error.find("insufficient funds"), std::string::npos) << results[1]->error;
  EXPECT_EQ(results[2]->status, WorkStatus::declined);
  EXPECT_NE(results[2]->error.find("23505"), std::string::npos) << results[2]->error;
  EXPECT_EQ(results[3]->status, WorkStatus::lost);
  EXPECT_FALSE(stale_ran);
  EXPECT_EQ(results[4]->status, WorkStatus::lost);
  ASSERT_FALSE(results[5].has_value());
  EXPECT_EQ(results[6]->status, WorkStatus::committed);

  EXPECT_EQ(ledger_amount("pay_ok"), "1");
  EXPECT_EQ(ledger_amount("pay_last"), "1");
  for (const char* id : {"pay_declined", "pay_stmt", "pay_stale", "pay_self", "pay_bad"}) EXPECT_FALSE(ledger_amount(id)) << id;
  EXPECT_EQ(record("key-many-ok-000001")->state, RecordState::completed);
  EXPECT_EQ(record("key-many-last-0001")->state, RecordState::completed);
  for (const char* key : {"key-many-declined1", "key-many-stmt-fail"}) {
    EXPECT_EQ(record(key)->state, RecordState::in_progress) << key;
  }
  EXPECT_EQ(record("key-many-stale-001")->fencing_token, taker.record.fencing_token);
  EXPECT_EQ(record("key-many-self-lost")->fencing_token, claims[4].record.fencing_token);
}

// A work that ends the store's transaction takes the whole batch with it, in doubt for the items
// whose writes it may have committed; the store's next transaction works.
TEST_F(PostgresTransactional, AWorkThatEndsTheTransactionFailsEveryItem) {
  auto first = must_claim(*store_, claim_request(clock_, "key-many-end-00001"));
  auto second = must_claim(*store_, claim_request(clock_, "key-many-end-00002"));
  auto third = must_claim(*store_, claim_request(clock_, "key-many-end-00003"));
  std::vector<PostgresWorkItem> items;
  items.push_back({complete_request(clock_, fence_of(first)), [](PostgresTransaction&, std::string&) { return true; }});
  items.push_back({complete_request(clock_, fence_of(second)), [](PostgresTransaction& tx, std::string&) {
                     return tx.exec("COMMIT").has_value();
                   }});
  items.push_back({complete_request(clock_, fence_of(third)), [](PostgresTransaction&, std::string&) { return true; }});
  auto results = store_->complete_many_in_transaction(std::move(items));
  ASSERT_EQ(results.size(), 3u);
  for (const auto& r : results) ASSERT_FALSE(r.has_value());
  EXPECT_TRUE(results[0].error().in_doubt);
  EXPECT_TRUE(results[1].error().in_doubt);
  EXPECT_FALSE(results[2].error().in_doubt);  // its work never ran
  EXPECT_EQ(BlockingStore(*store_).complete(complete_request(clock_, fence_of(third))), FenceStatus::ok);
}

TEST_F(PostgresTransactional, BlockingBatchFormRefusesToRunOnAStoreThread) {
  auto c = must_claim(*store_, claim_request(clock_, "key-many-deadlock1"));
  std::promise<BatchResults<WorkResult>> inner;
  store_->get(RecordId{"t", "key-many-deadlock1"}, [&](StoreResult<std::optional<Record>>) {
    std::vector<PostgresWorkItem> items;
    items.push_back({complete_request(clock_, fence_of(c)), [](PostgresTransaction&, std::string&) { return true; }});
    inner.set_value(store_->complete_many_in_transaction(std::move(items)));
  });
  auto r = inner.get_future().get();
  ASSERT_EQ(r.size(), 1u);
  ASSERT_FALSE(r[0].has_value());
  EXPECT_EQ(r[0].error().code, StoreErrc::internal);
}

TEST_F(PostgresTransactional, BlockingFormRefusesToRunOnAStoreThread) {
  auto c = must_claim(*store_, claim_request(clock_, "key-tx-deadlock-01"));
  std::promise<StoreResult<FenceStatus>> inner;
  store_->get(RecordId{"t", "key-tx-deadlock-01"}, [&](StoreResult<std::optional<Record>>) {
    inner.set_value(store_->complete_in_transaction(complete_request(clock_, fence_of(c)),
                                                    [](PostgresTransaction&, std::string&) { return true; }));
  });
  auto r = inner.get_future().get();
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, StoreErrc::internal);
}

// ---- reaping ------------------------------------------------------------------------------------

TEST(PostgresReaper, PurgeSkipsRowsOthersHoldAndNeverWaitsForThem) {
  const std::string schema = fresh_schema();
  auto store = open_store(options_for(schema));
  ManualClock clock;
  for (int i = 0; i < 30; ++i) must_claim(*store, claim_request(clock, "key-purge-" + std::to_string(100000 + i)));
  clock.advance(kRetention);
  RawConn locker;
  locker.exec("BEGIN");
  locker.exec("SELECT 1 FROM " + qualified(schema, "idempotency_keys") + " WHERE key = 'key-purge-100007' FOR UPDATE");
  const auto start = SteadyClock::now();
  auto first = BlockingStore(*store).purge_expired(clock.now(), 100);
  ASSERT_TRUE(first.has_value()) << first.error().message;
  EXPECT_EQ(*first, 29u);
  EXPECT_LT(elapsed_since(start), 3s);  // waiting for the lock would take statement_timeout (5 s)
  locker.exec("ROLLBACK");
  EXPECT_EQ(BlockingStore(*store).purge_expired(clock.now(), 100).value(), 1u);
}

TEST(PostgresReaper, TheBackgroundReaperDeletesExpiredRecordsInBatches) {
  const std::string schema = fresh_schema();
  ManualClock clock;
  PostgresOptions o = options_for(schema);
  o.reaper_interval = 50ms;
  o.reaper_batch = 7;
  o.clock = &clock;
  auto store = open_store(o);
  for (int i = 0; i < 30; ++i) {
    auto c = must_claim(*store, claim_request(clock, "key-reap-" + std::to_string(100000 + i)));
    BlockingStore(*store).complete(complete_request(clock, fence_of(c))).value();
  }
  clock.advance(kRetention);
  for (int i = 0; i < 3; ++i) must_claim(*store, claim_request(clock, "key-keep-" + std::to_string(100000 + i)));
  const auto deadline = SteadyClock::now() + 10s;
  while (store->stats().reaped < 30 && SteadyClock::now() < deadline) std::this_thread::sleep_for(20ms);
  EXPECT_EQ(store->stats().reaped, 30u);
  RawConn raw;
  EXPECT_EQ(raw.exec("SELECT count(*) FROM " + qualified(schema, "idempotency_keys")), "3");
}

// Listing one tenant must be bounded by the primary key's index even with a generic plan, which
// the plan cache may pick for a prepared statement after five runs on a connection (paging with
// `idemctl list --all`). A `$n IS NULL OR tenant_id = $n` test would scan the whole index.
TEST(PostgresPlans, ListingOneTenantIsBoundedByTheKeyIndexEvenWithAGenericPlan) {
  const std::string schema = fresh_schema();
  auto store = open_store(options_for(schema));
  RawConn raw;
  raw.exec("INSERT INTO " + qualified(schema, "idempotency_keys") +
           " (tenant_id, key, state, request_hash, fencing_token, lease_expires_ms, created_ms, expires_ms)"
           " SELECT 't' || (i % 20), md5(i::text), 'completed', 'h', i, 0, 0, 9000000000000"
           " FROM generate_series(1, 20000) i");
  raw.exec("ANALYZE " + qualified(schema, "idempotency_keys"));
  raw.exec("SET plan_cache_mode = force_generic_plan");
  const struct {
    postgres_detail::Stmt stmt;
    std::string args;
  } listings[] = {{postgres_detail::Stmt::list_tenant, "(NULL, 100, 't3')"},
                  {postgres_detail::Stmt::list_tenant_after, "(NULL, 100, 't3', '', 't3')"}};
  for (const auto& listing : listings) {
    const std::string name = postgres_detail::statement_name(listing.stmt);
    raw.exec("PREPARE " + name + " AS " + postgres_detail::statement_sql(listing.stmt, schema));
    std::string plan;
    bool bounded = false;  // the tenant is a condition of the index scan, not a filter after it
    for (const auto& line : raw.column("EXPLAIN EXECUTE " + name + listing.args)) {
      plan += line + "\n";
      if (line.find("Index Cond:") != std::string::npos && line.find("tenant_id = $") != std::string::npos) {
        bounded = true;
      }
    }
    EXPECT_TRUE(bounded) << name << ":\n" << plan;
    EXPECT_EQ(plan.find("Seq Scan"), std::string::npos) << name << ":\n" << plan;
  }
}

}  // namespace
}  // namespace idem
