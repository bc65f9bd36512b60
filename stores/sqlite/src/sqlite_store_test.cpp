#include "idem/sqlite_store.hpp"
#include "idem/sqlite_consumer.hpp"

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <barrier>
#include <filesystem>
#include <fstream>
#include <map>
#include <future>
#include <memory>
#include <stdexcept>
#include <random>
#include <thread>
#include <vector>

#include "idem/testing/consumer_batches.hpp"
#include "idem/testing/manual_clock.hpp"
#include "idem/testing/redeliveries.hpp"
#include "idem/testing/store_conformance.hpp"
#include "connection.hpp"
#include "journal_block_cache.hpp"
#include "schema.hpp"

namespace idem {
namespace {

using namespace std::chrono_literals;
using testing::ManualClock;

// A directory of its own under $TMPDIR, removed at the end.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "idem-sqlite-test-XXXXXX").string();
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

std::unique_ptr<SqliteStore> open_store(SqliteOptions options) {
  auto store = SqliteStore::open(std::move(options));
  if (!store) throw std::runtime_error("SqliteStore::open: " + store.error().message);
  return std::move(*store);
}

std::unique_ptr<SqliteStore> open_store(const std::string& path) {
  SqliteOptions options;
  options.path = path;
  return open_store(std::move(options));
}

// Blocks the store's writer thread in a ping's callback until `release` is set, and returns once
// it is blocked there: operations submitted afterwards queue up and are taken together. (Without
// waiting, the writer could pick up the ping together with the first of them.)
void hold_writer(SqliteStore& store, std::promise<void>& release) {
  // Shared: the writer may still be inside set_value when this function has returned.
  auto holding = std::make_shared<std::promise<void>>();
  auto held = holding->get_future();
  store.ping([holding, f = release.get_future().share()](StoreResult<Done>) {
    holding->set_value();
    f.wait();
  });
  held.wait();
}

// ---- the conformance suite ----------------------------------------------------------------------

TempDir& conformance_dir() {
  static TempDir dir;
  return dir;
}
std::string last_conformance_path;  // the file the last `make` opened, for `share`

std::unique_ptr<Store> make_conformance_store() {
  static std::atomic<int> counter{0};
  last_conformance_path = conformance_dir().file("conformance-" + std::to_string(counter++) + ".db");
  return open_store(last_conformance_path);
}

std::unique_ptr<Store> share_conformance_store() { return open_store(last_conformance_path); }

}  // namespace

namespace testing {
INSTANTIATE_TEST_SUITE_P(Sqlite, StoreConformance,
                         ::testing::Values(StoreFactory{"sqlite", make_conformance_store, share_conformance_store}),
                         StoreConformance::name_of);
INSTANTIATE_TEST_SUITE_P(Sqlite, ConsumerConformance,
                         ::testing::Values(StoreFactory{"sqlite", make_conformance_store, share_conformance_store}),
                         ConsumerConformance::name_of);
}  // namespace testing

namespace {

// ---- helpers for SQLite-specific tests ----------------------------------------------------------

// A plain connection of the test's own: another process's view of the file.
class RawDb {
 public:
  explicit RawDb(const std::string& path) {
    if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK) throw std::runtime_error("open " + path);
    sqlite3_busy_timeout(db_, 5000);
  }
  ~RawDb() { sqlite3_close_v2(db_); }
  RawDb(const RawDb&) = delete;
  RawDb& operator=(const RawDb&) = delete;

  void exec(const std::string& sql) {
    char* error = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
      std::string message = error ? error : "?";
      sqlite3_free(error);
      throw std::runtime_error(sql + ": " + message);
    }
  }

  // The first column of the first row, as an integer (0 when there is no row).
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

  sqlite3* get() { return db_; }

 private:
  sqlite3* db_ = nullptr;
};

class SqliteStoreTest : public ::testing::Test {
 protected:
  ClaimRequest request(const std::string& key, const std::string& hash = "h", Millis lease = 60s) {
    ClaimRequest r;
    r.id = RecordId{"t", key};
    r.request_hash = hash;
    r.token = next_token++;
    r.now = clock.now();
    r.lease_expires = r.now + lease;
    r.expires = r.now + 24h;
    return r;
  }
  CompleteRequest completion(const Fence& fence, std::string body = "{\"ok\":true}") {
    return CompleteRequest{fence, StoredResponse{201, {{"Content-Type", "application/json"}}, std::move(body)},
                           clock.now(), clock.now() + 24h};
  }
  static Fence fence_of(const ClaimResult& c) {
    return Fence{RecordId{c.record.tenant, c.record.key}, c.record.fencing_token};
  }

  ClaimResult claim_ok(Store& store, const std::string& key) {
    auto c = BlockingStore(store).claim(request(key));
    if (!c) throw std::runtime_error("claim: " + c.error().message);
    EXPECT_EQ(c->status, ClaimStatus::claimed);
    return *c;
  }

  TempDir dir;
  std::string path = dir.file("idem.db");
  ManualClock clock;
  std::uint64_t next_token = 1;
};

// ---- schema and migrations ----------------------------------------------------------------------

TEST_F(SqliteStoreTest, FreshDatabaseGetsTheLatestSchemaInWalMode) {
  open_store(path).reset();
  RawDb raw(path);
  EXPECT_EQ(raw.scalar("SELECT version FROM idem_schema_version"), SqliteStore::schema_version());
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'idempotency_keys'"), 1);
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name = 'idempotency_keys_expires'"),
            1);
  for (const char* column :
       {"tenant_id", "key", "state", "request_hash", "fencing_token", "lease_expires_ms", "response_status",
        "response_headers", "response_body", "created_ms", "completed_ms", "expires_ms"}) {
    EXPECT_EQ(raw.scalar(std::string("SELECT count(*) FROM pragma_table_info('idempotency_keys') WHERE name = '") +
                         column + "'"),
              1)
        << column;
  }
  sqlite3_stmt* stmt = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(raw.get(), "PRAGMA journal_mode", -1, &stmt, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(stmt), SQLITE_ROW);
  EXPECT_STREQ(reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0)), "wal");
  sqlite3_finalize(stmt);
}

// Processes that open one new file at once (three idem-consume sidecars started together) each
// switch it to WAL while the others hold a read lock: SQLite answers all but one SQLITE_BUSY at
// once, without waiting for the busy timeout. Each must still open it.
TEST_F(SqliteStoreTest, ProcessesOpeningOneNewFileAtOnceAllOpenIt) {
  for (int round = 0; round < 10; ++round) {
    const std::string file = dir.file("together-" + std::to_string(round) + ".db");
    int go[2];
    ASSERT_EQ(pipe(go), 0);
    std::vector<pid_t> children;
    for (int i = 0; i < 6; ++i) {
      const pid_t pid = fork();
      ASSERT_GE(pid, 0);
      if (pid == 0) {
        close(go[1]);
        char byte = 0;
        (void)!read(go[0], &byte, 1);  // returns when the parent closes its end: all start at once
        SqliteOptions options;
        options.path = file;
        auto store = SqliteStore::open(options);
        if (!store) std::fprintf(stderr, "process %d: %s\n", i, store.error().message.c_str());
        _exit(store ? 0 : 1);
      }
      children.push_back(pid);
    }
    close(go[0]);
    close(go[1]);
    for (const pid_t pid : children) {
      int status = 0;
      ASSERT_EQ(waitpid(pid, &status, 0), pid);
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "round " << round;
    }
  }
}

TEST_F(SqliteStoreTest, ReopeningKeepsSchemaAndRecords) {
  {
    auto store = open_store(path);
    auto c = claim_ok(*store, "key-durable-00001");
    ASSERT_EQ(BlockingStore(*store).complete(completion(fence_of(c), "kept")), FenceStatus::ok);
  }
  {
    auto store = open_store(path);  // migrating again is a no-op
    auto replay = BlockingStore(*store).claim(request("key-durable-00001"));
    ASSERT_TRUE(replay);
    ASSERT_EQ(replay->status, ClaimStatus::completed);
    EXPECT_EQ(replay->record.response->body, "kept");
  }
  RawDb raw(path);
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM idem_schema_version"), 1);
  EXPECT_EQ(raw.scalar("SELECT version FROM idem_schema_version"), SqliteStore::schema_version());
}

TEST_F(SqliteStoreTest, CoexistsWithTheApplicationsOwnTablesAndUserVersion) {
  {
    RawDb raw(path);
    raw.exec(
        "PRAGMA user_version = 7; CREATE TABLE payments (id INTEGER PRIMARY KEY, amount INTEGER);"
        "INSERT INTO payments (amount) VALUES (100);");
  }
  open_store(path).reset();
  RawDb raw(path);
  EXPECT_EQ(raw.scalar("PRAGMA user_version"), 7);  // the application's, left alone
  EXPECT_EQ(raw.scalar("SELECT amount FROM payments"), 100);
  EXPECT_EQ(raw.scalar("SELECT version FROM idem_schema_version"), SqliteStore::schema_version());
}

// Migration 3 (the attempt number and the lookup): records of an older database are first
// attempts without a lookup, and count on from there.
TEST_F(SqliteStoreTest, ADatabaseOfVersionTwoGainsAttemptNumbers) {
  {
    RawDb raw(path);
    ASSERT_TRUE(sqlite_detail::migrate(raw.get(), 2));
    // An in-progress record whose lease ran out long ago, as version 2 wrote it.
    raw.exec("INSERT INTO idempotency_keys VALUES ('t', 'key-from-version-2', 'in_progress', 'h', 7, 0, NULL, NULL, "
             "NULL, 1, NULL, 99999999999999)");
  }
  auto store = open_store(path);
  {
    RawDb raw(path);
    EXPECT_EQ(raw.scalar("SELECT version FROM idem_schema_version"), SqliteStore::schema_version());
    EXPECT_EQ(raw.scalar("SELECT attempt FROM idempotency_keys WHERE key = 'key-from-version-2'"), 1);
  }
  auto old = BlockingStore(*store).get(RecordId{"t", "key-from-version-2"});
  ASSERT_TRUE(old && *old);
  EXPECT_EQ((*old)->attempt, 1u);
  EXPECT_EQ((*old)->lookup, "");
  ClaimRequest r = request("key-from-version-2");
  r.request_hash = "h";
  auto takeover = BlockingStore(*store).claim(r);
  ASSERT_TRUE(takeover);
  ASSERT_EQ(takeover->status, ClaimStatus::claimed);
  EXPECT_EQ(takeover->kind, ClaimKind::after_lease_expiry);
  EXPECT_EQ(takeover->record.attempt, 2u);
  RawDb raw(path);
  EXPECT_EQ(raw.scalar("SELECT attempt FROM idempotency_keys WHERE key = 'key-from-version-2'"), 2);
}

TEST_F(SqliteStoreTest, RefusesADatabaseFromANewerVersion) {
  open_store(path).reset();
  {
    RawDb raw(path);
    raw.exec("UPDATE idem_schema_version SET version = " + std::to_string(SqliteStore::schema_version() + 1));
  }
  SqliteOptions options;
  options.path = path;
  auto store = SqliteStore::open(options);
  ASSERT_FALSE(store);
  EXPECT_EQ(store.error().code, StoreErrc::corrupt);
  EXPECT_NE(store.error().message.find("newer than this build"), std::string::npos) << store.error().message;
  RawDb raw(path);  // and nothing was changed
  EXPECT_EQ(raw.scalar("SELECT version FROM idem_schema_version"), SqliteStore::schema_version() + 1);
}

TEST_F(SqliteStoreTest, RefusesAFileThatIsNotADatabase) {
  std::ofstream(path) << std::string(4096, 'x');
  SqliteOptions options;
  options.path = path;
  auto store = SqliteStore::open(options);
  ASSERT_FALSE(store);
  EXPECT_EQ(store.error().code, StoreErrc::corrupt) << store.error().message;
}

TEST_F(SqliteStoreTest, UnopenablePathIsUnavailable) {
  SqliteOptions options;
  options.path = dir.file("no-such-dir/idem.db");
  auto store = SqliteStore::open(options);
  ASSERT_FALSE(store);
  EXPECT_EQ(store.error().code, StoreErrc::unavailable) << store.error().message;
}

// ---- storage details ----------------------------------------------------------------------------

TEST_F(SqliteStoreTest, HeadersAndBodiesWithAnyBytesSurviveAReopen) {
  std::string every_byte;
  for (int b = 0; b < 256; ++b) every_byte.push_back(static_cast<char>(b));
  const StoredResponse response{200,
                                {{"Set-Cookie", "a=1"},
                                 {"Set-Cookie", "a=1"},
                                 {std::string("x\0y", 3), every_byte},
                                 {"", ""},
                                 {"X-Big", std::string(100'000, 'z')}},
                                every_byte + std::string(1 << 20, '\0')};
  {
    auto store = open_store(path);
    auto c = claim_ok(*store, "key-weird-bytes-01");
    auto done = BlockingStore(*store).complete(CompleteRequest{fence_of(c), response, clock.now(), clock.now() + 24h});
    ASSERT_EQ(done, FenceStatus::ok);
  }
  auto store = open_store(path);
  auto r = BlockingStore(*store).get(RecordId{"t", "key-weird-bytes-01"});
  ASSERT_TRUE(r && *r && (*r)->response);
  EXPECT_EQ(*(*r)->response, response);
}

TEST_F(SqliteStoreTest, TokensUseAllSixtyFourBits) {
  auto store = open_store(path);
  ClaimRequest r = request("key-big-token-0001");
  r.token = 0xfedc'ba98'7654'3210ULL;
  auto c = BlockingStore(*store).claim(r);
  ASSERT_TRUE(c);
  EXPECT_EQ(c->record.fencing_token, r.token);
  EXPECT_EQ(BlockingStore(*store).get(r.id).value()->fencing_token, r.token);
  EXPECT_EQ(BlockingStore(*store).complete(completion(Fence{r.id, r.token})), FenceStatus::ok);
}

TEST_F(SqliteStoreTest, UndecodableStoredHeadersAreReportedAsCorrupt) {
  auto store = open_store(path);
  auto c = claim_ok(*store, "key-corrupt-0001");
  ASSERT_EQ(BlockingStore(*store).complete(completion(fence_of(c))), FenceStatus::ok);
  {
    RawDb raw(path);
    raw.exec("UPDATE idempotency_keys SET response_headers = x'01ff'");
  }
  auto r = BlockingStore(*store).get(RecordId{"t", "key-corrupt-0001"});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, StoreErrc::corrupt);
  EXPECT_FALSE(r.error().retryable());
}

// ---- the reaper ---------------------------------------------------------------------------------

TEST_F(SqliteStoreTest, BackgroundReaperDeletesExpiredRecordsInBatches) {
  SqliteOptions options;
  options.path = path;
  options.reaper_interval = 10ms;
  options.reaper_batch = 7;
  options.clock = &clock;
  auto store = open_store(options);
  BlockingStore b(*store);
  for (int i = 0; i < 50; ++i) {
    auto c = claim_ok(*store, "key-reap-old-" + std::to_string(i));
    ASSERT_EQ(b.complete(completion(fence_of(c))), FenceStatus::ok);
  }
  clock.advance(24h);
  for (int i = 0; i < 3; ++i) claim_ok(*store, "key-reap-new-" + std::to_string(i));
  for (int wait = 0; wait < 1000 && store->stats().reaped < 50; ++wait) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(store->stats().reaped, 50u);
  // All 50 expired at one instant, so one pass deleted them: 7 at a time, 8 transactions.
  EXPECT_EQ(store->stats().reaper_batches, 8u);
  RawDb raw(path);
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM idempotency_keys"), 3);
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM idempotency_keys WHERE key LIKE 'key-reap-new-%'"), 3);
}

TEST_F(SqliteStoreTest, PurgeWithZeroLimitDeletesNothing) {
  auto store = open_store(path);
  claim_ok(*store, "key-purge-zero-01");
  clock.advance(48h);
  EXPECT_EQ(BlockingStore(*store).purge_expired(clock.now(), 0), 0u);
  EXPECT_EQ(BlockingStore(*store).purge_expired(clock.now(), 100), 1u);
}

// ---- group commit -------------------------------------------------------------------------------

TEST_F(SqliteStoreTest, ConcurrentOperationsShareTransactions) {
  auto store = open_store(path);
  constexpr int kThreads = 8, kKeysPerThread = 100;
  std::atomic<int> errors{0};
  std::vector<std::thread> workers;
  std::atomic<std::uint64_t> token{1};
  for (int t = 0; t < kThreads; ++t) {
    workers.emplace_back([&, t] {
      BlockingStore b(*store);
      for (int i = 0; i < kKeysPerThread; ++i) {
        ClaimRequest r;
        r.id = RecordId{"t", "key-group-" + std::to_string(t) + "-" + std::to_string(i)};
        r.request_hash = "h";
        r.token = token++;
        r.now = clock.now();
        r.lease_expires = r.now + 60s;
        r.expires = r.now + 24h;
        auto c = b.claim(r);
        if (!c || c->status != ClaimStatus::claimed) {
          ++errors;
          continue;
        }
        auto done = b.complete(CompleteRequest{Fence{r.id, r.token}, StoredResponse{200, {}, "x"}, r.now, r.expires});
        if (!done || *done != FenceStatus::ok) ++errors;
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(errors.load(), 0);
  const auto stats = store->stats();
  const std::uint64_t ops = 2 * kThreads * kKeysPerThread;
  EXPECT_EQ(stats.operations, ops);
  EXPECT_LT(stats.write_transactions, ops * 3 / 4) << "largest batch " << stats.largest_batch;
  EXPECT_GT(stats.largest_batch, 1u);
}

TEST_F(SqliteStoreTest, ABurstOfAsyncOperationsCommitsInFullBatches) {
  SqliteOptions options;
  options.path = path;
  options.max_batch = 64;
  auto store = open_store(options);
  constexpr int kOps = 1000;
  std::atomic<int> ok{0};
  std::promise<void> blocker;
  // Hold the writer so that the whole burst is queued before the first batch is taken.
  hold_writer(*store, blocker);
  for (int i = 0; i < kOps; ++i) {
    store->claim(request("key-burst-" + std::to_string(i)), [&ok](StoreResult<ClaimResult> r) {
      if (r && r->status == ClaimStatus::claimed) ++ok;
    });
  }
  blocker.set_value();
  EXPECT_TRUE(BlockingStore(*store).ping());  // queued last: answered after every claim
  EXPECT_EQ(ok.load(), kOps);
  const auto stats = store->stats();
  EXPECT_EQ(stats.largest_batch, 64u);
  EXPECT_LE(stats.write_transactions, kOps / 64 + 4);
  RawDb raw(path);
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM idempotency_keys"), kOps);
}

// wal_autocheckpoint bounds the WAL: past that many pages a commit copies the WAL into the
// database and the next transaction starts writing it from the start again.
TEST_F(SqliteStoreTest, TheWalStaysWithinWalAutocheckpointPages) {
  const auto wal_bytes_after_1000_claims = [&](int pages, const std::string& file) {
    SqliteOptions options;
    options.path = file;
    options.synchronous = SqliteSynchronous::off;  // the WAL's size is the point, not its fsyncs
    options.wal_autocheckpoint = pages;
    auto store = open_store(options);
    for (int i = 0; i < 1000; ++i) claim_ok(*store, "key-wal-" + std::to_string(i * 7919 % 1000));
    return std::filesystem::file_size(file + "-wal");
  };
  const std::uintmax_t frame = 4096 + 24;  // a page and its WAL frame header
  const auto small = wal_bytes_after_1000_claims(50, dir.file("small.db"));
  const auto large = wal_bytes_after_1000_claims(100000, dir.file("large.db"));
  EXPECT_LE(small, 60 * frame);  // 50 pages, plus the transaction that crossed the line
  EXPECT_GT(large, 200 * frame);  // never checkpointed: every commit appended its pages
}

TEST_F(SqliteStoreTest, OneFailingOperationDoesNotUndoTheOthersInItsBatch) {
  auto store = open_store(path);
  RawDb raw(path);
  raw.exec("CREATE TABLE business (key TEXT NOT NULL)");
  auto held = claim_ok(*store, "key-batch-failing");
  std::promise<void> blocker;
  hold_writer(*store, blocker);  // until all eleven operations below are queued
  std::atomic<int> claimed{0};
  std::promise<StoreResult<FenceStatus>> failing;
  auto failing_result = failing.get_future();
  for (int i = 0; i < 5; ++i) {
    store->claim(request("key-batch-before-" + std::to_string(i)), [&](StoreResult<ClaimResult> r) {
      if (r && r->status == ClaimStatus::claimed) ++claimed;
    });
  }
  store->complete_in_transaction(
      completion(fence_of(held)),
      [](sqlite3* db, std::string& error) {
        sqlite3_exec(db, "INSERT INTO business (key) VALUES ('key-batch-failing')", nullptr, nullptr, nullptr);
        error = "declined";
        return false;
      },
      [&](StoreResult<FenceStatus> r) { failing.set_value(std::move(r)); });
  for (int i = 0; i < 5; ++i) {
    store->claim(request("key-batch-after-" + std::to_string(i)), [&](StoreResult<ClaimResult> r) {
      if (r && r->status == ClaimStatus::claimed) ++claimed;
    });
  }
  blocker.set_value();
  auto result = failing_result.get();
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code, StoreErrc::internal);
  EXPECT_NE(result.error().message.find("declined"), std::string::npos);
  EXPECT_GE(store->stats().largest_batch, 11u);  // all eleven shared one transaction
  store.reset();
  EXPECT_EQ(claimed.load(), 10);
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM idempotency_keys WHERE key LIKE 'key-batch-%-%'"), 10);
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM business"), 0);
  EXPECT_EQ(
      raw.scalar("SELECT count(*) FROM idempotency_keys WHERE key = 'key-batch-failing' AND state = 'in_progress'"), 1);
}

// A claim that fails after it wrote (the trigger refuses one key after its row is inserted) is
// undone alone: the rest of its batch commits.
TEST_F(SqliteStoreTest, AClaimThatFailsAfterWritingIsUndoneAloneInItsBatch) {
  auto store = open_store(path);
  {
    RawDb raw(path);
    raw.exec("CREATE TRIGGER refuse_one AFTER INSERT ON idempotency_keys WHEN NEW.key = 'key-single-refused' "
             "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END");
  }
  auto held = claim_ok(*store, "key-single-held");
  std::promise<void> blocker;
  hold_writer(*store, blocker);  // until all five operations below are queued
  std::vector<std::future<StoreResult<ClaimResult>>> claims;
  for (const char* key : {"key-single-a", "key-single-refused", "key-single-b"}) {
    auto promise = std::make_shared<std::promise<StoreResult<ClaimResult>>>();
    claims.push_back(promise->get_future());
    store->claim(request(key), [promise](StoreResult<ClaimResult> r) { promise->set_value(std::move(r)); });
  }
  std::promise<StoreResult<FenceStatus>> completed;
  store->complete(completion(fence_of(held), "done"),
                  [&completed](StoreResult<FenceStatus> r) { completed.set_value(std::move(r)); });
  blocker.set_value();

  auto a = claims[0].get(), refused = claims[1].get(), b = claims[2].get();
  ASSERT_TRUE(a);
  EXPECT_EQ(a->status, ClaimStatus::claimed);
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("refused by the test"), std::string::npos) << refused.error().message;
  ASSERT_TRUE(b);
  EXPECT_EQ(b->status, ClaimStatus::claimed);
  EXPECT_EQ(completed.get_future().get(), FenceStatus::ok);
  EXPECT_GE(store->stats().largest_batch, 4u);  // they shared one transaction
  store.reset();
  RawDb raw(path);
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM idempotency_keys WHERE key IN ('key-single-a', 'key-single-b')"), 2);
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM idempotency_keys WHERE key = 'key-single-refused'"), 0);
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM idempotency_keys WHERE key = 'key-single-held' AND state = 'completed'"),
            1);
}

TEST_F(SqliteStoreTest, ClosingFinishesQueuedOperations) {
  auto store = open_store(path);
  constexpr int kOps = 300;
  std::atomic<int> answered{0};
  for (int i = 0; i < kOps; ++i) {
    store->claim(request("key-drain-" + std::to_string(i)), [&](StoreResult<ClaimResult> r) {
      if (r) ++answered;
    });
  }
  store.reset();
  EXPECT_EQ(answered.load(), kOps);
  RawDb raw(path);
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM idempotency_keys"), kOps);
}

// ---- transactional completion (SPEC §4.4) -------------------------------------------------------

class TransactionalCompletionTest : public SqliteStoreTest {
 protected:
  void SetUp() override {
    store = open_store(path);
    raw = std::make_unique<RawDb>(path);
    raw->exec("CREATE TABLE business (key TEXT NOT NULL, amount INTEGER NOT NULL)");
  }
  static SqliteWork insert_row(std::string key, bool succeed = true, bool* ran = nullptr) {
    return [key = std::move(key), succeed, ran](sqlite3* db, std::string& error) {
      if (ran) *ran = true;
      const std::string sql = "INSERT INTO business (key, amount) VALUES ('" + key + "', 100)";
      if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr) != SQLITE_OK) {
        error = sqlite3_errmsg(db);
        return false;
      }
      if (!succeed) error = "insufficient funds";
      return succeed;
    };
  }
  std::int64_t business_rows(const std::string& key) {
    return raw->scalar("SELECT count(*) FROM business WHERE key = '" + key + "'");
  }

  std::unique_ptr<SqliteStore> store;
  std::unique_ptr<RawDb> raw;
};

TEST_F(TransactionalCompletionTest, WorkAndCompletionCommitTogether) {
  auto c = claim_ok(*store, "key-tx-commit-0001");
  auto result = store->complete_in_transaction(completion(fence_of(c), "paid"), insert_row("key-tx-commit-0001"));
  ASSERT_TRUE(result) << result.error().message;
  EXPECT_EQ(*result, FenceStatus::ok);
  EXPECT_EQ(business_rows("key-tx-commit-0001"), 1);
  auto r = BlockingStore(*store).get(RecordId{"t", "key-tx-commit-0001"});
  ASSERT_TRUE(r && *r);
  EXPECT_EQ((*r)->state, RecordState::completed);
  EXPECT_EQ((*r)->response->body, "paid");
}

TEST_F(TransactionalCompletionTest, WorkReturningFalseRollsBothBack) {
  auto c = claim_ok(*store, "key-tx-declined-01");
  auto result = store->complete_in_transaction(completion(fence_of(c)), insert_row("key-tx-declined-01", false));
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code, StoreErrc::internal);
  EXPECT_FALSE(result.error().in_doubt);
  EXPECT_NE(result.error().message.find("insufficient funds"), std::string::npos) << result.error().message;
  EXPECT_EQ(business_rows("key-tx-declined-01"), 0);
  auto r = BlockingStore(*store).get(RecordId{"t", "key-tx-declined-01"});
  ASSERT_TRUE(r && *r);
  EXPECT_EQ((*r)->state, RecordState::in_progress);
  EXPECT_EQ((*r)->fencing_token, c.record.fencing_token);
  // The holder still holds the key and can finish it.
  EXPECT_EQ(store->complete_in_transaction(completion(fence_of(c)), insert_row("key-tx-declined-01")), FenceStatus::ok);
  EXPECT_EQ(business_rows("key-tx-declined-01"), 1);
}

TEST_F(TransactionalCompletionTest, WorkThrowingRollsBothBack) {
  auto c = claim_ok(*store, "key-tx-throws-0001");
  auto result = store->complete_in_transaction(completion(fence_of(c)), [](sqlite3* db, std::string&) -> bool {
    sqlite3_exec(db, "INSERT INTO business (key, amount) VALUES ('key-tx-throws-0001', 1)", nullptr, nullptr, nullptr);
    throw std::runtime_error("boom");
  });
  ASSERT_FALSE(result);
  EXPECT_NE(result.error().message.find("boom"), std::string::npos);
  EXPECT_EQ(business_rows("key-tx-throws-0001"), 0);
  EXPECT_EQ(BlockingStore(*store).get(RecordId{"t", "key-tx-throws-0001"}).value()->state, RecordState::in_progress);
}

TEST_F(TransactionalCompletionTest, StaleTokenDoesNotRunWorkAndWritesNothing) {
  auto old_holder = claim_ok(*store, "key-tx-stale-00001");
  clock.advance(61s);
  auto new_holder = BlockingStore(*store).claim(request("key-tx-stale-00001"));
  ASSERT_EQ(new_holder->status, ClaimStatus::claimed);
  bool ran = false;
  auto result =
      store->complete_in_transaction(completion(fence_of(old_holder)), insert_row("key-tx-stale-00001", true, &ran));
  ASSERT_TRUE(result);
  EXPECT_EQ(*result, FenceStatus::lost);
  EXPECT_FALSE(ran);
  EXPECT_EQ(business_rows("key-tx-stale-00001"), 0);
  auto r = BlockingStore(*store).get(RecordId{"t", "key-tx-stale-00001"});
  EXPECT_EQ((*r)->state, RecordState::in_progress);
  EXPECT_EQ((*r)->fencing_token, new_holder->record.fencing_token);
}

TEST_F(TransactionalCompletionTest, WorkThatLosesTheFenceItselfIsUndone) {
  auto c = claim_ok(*store, "key-tx-self-lost-1");
  auto result = store->complete_in_transaction(completion(fence_of(c)), [](sqlite3* db, std::string&) {
    sqlite3_exec(db, "INSERT INTO business (key, amount) VALUES ('key-tx-self-lost-1', 1)", nullptr, nullptr, nullptr);
    // Misbehaving work that changes the record under the store: the completion is fenced out.
    sqlite3_exec(db, "UPDATE idempotency_keys SET fencing_token = fencing_token + 1", nullptr, nullptr, nullptr);
    return true;
  });
  ASSERT_TRUE(result);
  EXPECT_EQ(*result, FenceStatus::lost);
  EXPECT_EQ(business_rows("key-tx-self-lost-1"), 0);
  EXPECT_EQ(BlockingStore(*store).get(RecordId{"t", "key-tx-self-lost-1"}).value()->fencing_token,
            c.record.fencing_token);
}

TEST_F(TransactionalCompletionTest, WorkThatEndsTheTransactionIsAnError) {
  auto c = claim_ok(*store, "key-tx-commits-001");
  auto result = store->complete_in_transaction(completion(fence_of(c)), [](sqlite3* db, std::string&) {
    return sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr) == SQLITE_OK;
  });
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code, StoreErrc::internal);
  // The store recovers: its next transaction works.
  EXPECT_EQ(BlockingStore(*store).complete(completion(fence_of(c))), FenceStatus::ok);
}

TEST_F(TransactionalCompletionTest, BlockingCallFromACallbackFailsInsteadOfDeadlocking) {
  auto c = claim_ok(*store, "key-tx-callback-01");
  std::promise<StoreResult<FenceStatus>> inner;
  store->ping([&](StoreResult<Done>) {
    inner.set_value(store->complete_in_transaction(completion(fence_of(c)), insert_row("key-tx-callback-01")));
  });
  auto result = inner.get_future().get();
  ASSERT_FALSE(result);
  EXPECT_EQ(result.error().code, StoreErrc::internal);
  EXPECT_EQ(business_rows("key-tx-callback-01"), 0);
}

// ---- several writers on one file ----------------------------------------------------------------

TEST_F(SqliteStoreTest, TwoStoresOnOneFileSixteenThreadsOneKeyOneWinner) {
  auto first = open_store(path);
  auto second = open_store(path);
  constexpr int kThreads = 16;
  std::barrier start(kThreads);
  std::atomic<int> claimed{0}, in_progress{0}, errors{0};
  std::atomic<std::uint64_t> token{1};
  const TimePoint now = clock.now();
  std::vector<std::thread> workers;
  for (int t = 0; t < kThreads; ++t) {
    workers.emplace_back([&, t] {
      BlockingStore b(t % 2 ? *first : *second);
      ClaimRequest r;
      r.id = RecordId{"t", "one-contended-key-01"};
      r.request_hash = "h";
      r.token = token++;
      r.now = now;
      r.lease_expires = now + 60s;
      r.expires = now + 24h;
      start.arrive_and_wait();
      auto c = b.claim(r);
      if (!c)
        ++errors;
      else if (c->status == ClaimStatus::claimed)
        ++claimed;
      else if (c->status == ClaimStatus::in_progress)
        ++in_progress;
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(errors.load(), 0);
  EXPECT_EQ(claimed.load(), 1);
  EXPECT_EQ(in_progress.load(), kThreads - 1);
}

TEST_F(SqliteStoreTest, LockHeldPastBusyTimeoutIsUnavailableAndReadsStillWork) {
  SqliteOptions options;
  options.path = path;
  options.busy_timeout = 100ms;
  auto store = open_store(options);
  claim_ok(*store, "key-locked-000001");
  RawDb other(path);  // another process, in the middle of a long write transaction
  other.exec("BEGIN EXCLUSIVE; DELETE FROM idempotency_keys WHERE key = 'nothing';");
  BlockingStore b(*store);
  auto c = b.claim(request("key-locked-000002"));
  ASSERT_FALSE(c);
  EXPECT_EQ(c.error().code, StoreErrc::unavailable) << c.error().message;
  EXPECT_TRUE(c.error().retryable());
  EXPECT_FALSE(c.error().in_doubt);
  auto ping = b.ping();
  ASSERT_FALSE(ping);
  EXPECT_EQ(ping.error().code, StoreErrc::unavailable);
  // WAL readers do not wait for writers.
  auto r = b.get(RecordId{"t", "key-locked-000001"});
  ASSERT_TRUE(r) << r.error().message;
  EXPECT_TRUE(*r);
  other.exec("COMMIT");
  EXPECT_EQ(b.claim(request("key-locked-000002"))->status, ClaimStatus::claimed);
  EXPECT_GE(store->stats().failed_transactions, 2u);
}

// ---- batch calls ----------------------------------------------------------------------------------

// A batch is one operation of the writer: one transaction, one commit, however many items (here
// more than max_batch).
TEST_F(SqliteStoreTest, ABatchCommitsInOneTransaction) {
  auto store = open_store(path);
  std::vector<ClaimRequest> requests;
  for (int i = 0; i < 300; ++i) requests.push_back(request("key-one-tx-" + std::to_string(i)));
  const auto before = store->stats();
  auto claims = BlockingStore(*store).claim_many(std::move(requests));
  const auto after = store->stats();
  ASSERT_EQ(claims.size(), 300u);
  for (const auto& c : claims) ASSERT_TRUE(c && c->status == ClaimStatus::claimed);
  EXPECT_EQ(after.transactions - before.transactions, 1u);
  EXPECT_EQ(after.write_transactions - before.write_transactions, 1u);
  EXPECT_EQ(after.operations - before.operations, 300u);
  EXPECT_GE(after.largest_batch, 300u);
}

// An item that fails after it wrote (a trigger refuses its key) is undone alone; the rest of the
// batch commits.
TEST_F(SqliteStoreTest, ABatchItemThatFailsAfterWritingIsUndoneAlone) {
  auto store = open_store(path);
  {
    RawDb raw(path);
    raw.exec("CREATE TRIGGER refuse_one AFTER INSERT ON idempotency_keys WHEN NEW.key = 'key-batch-refused' "
             "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END");
  }
  auto claims = BlockingStore(*store).claim_many(
      {request("key-batch-a"), request("key-batch-refused"), request("key-batch-b"), request("key-batch-a")});
  ASSERT_EQ(claims.size(), 4u);
  ASSERT_TRUE(claims[0]);
  EXPECT_EQ(claims[0]->status, ClaimStatus::claimed);
  ASSERT_FALSE(claims[1]);
  EXPECT_NE(claims[1].error().message.find("refused by the test"), std::string::npos) << claims[1].error().message;
  EXPECT_FALSE(claims[1].error().in_doubt);
  ASSERT_TRUE(claims[2]);
  EXPECT_EQ(claims[2]->status, ClaimStatus::claimed);
  ASSERT_TRUE(claims[3]);
  EXPECT_EQ(claims[3]->status, ClaimStatus::in_progress);
  store.reset();
  RawDb raw(path);
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM idempotency_keys WHERE key IN ('key-batch-a', 'key-batch-b')"), 2);
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM idempotency_keys WHERE key = 'key-batch-refused'"), 0);
}

// Another process holds the write lock past busy_timeout: every item of the batch fails as
// unavailable, not in doubt, and nothing of it is written; the same batch succeeds afterwards.
TEST_F(SqliteStoreTest, ABatchThatCannotTakeTheLockFailsEveryItemAndWritesNothing) {
  SqliteOptions options;
  options.path = path;
  options.busy_timeout = 100ms;
  auto store = open_store(options);
  auto held = claim_ok(*store, "key-batch-locked-held");
  RawDb other(path);
  other.exec("BEGIN EXCLUSIVE; DELETE FROM idempotency_keys WHERE key = 'nothing';");
  BlockingStore b(*store);
  auto claims = b.claim_many({request("key-batch-locked-1"), request("key-batch-locked-2")});
  auto completes = b.complete_many({completion(fence_of(held))});
  ASSERT_EQ(claims.size(), 2u);
  for (const auto& c : claims) {
    ASSERT_FALSE(c);
    EXPECT_EQ(c.error().code, StoreErrc::unavailable) << c.error().message;
    EXPECT_FALSE(c.error().in_doubt);
  }
  ASSERT_EQ(completes.size(), 1u);
  ASSERT_FALSE(completes[0]);
  EXPECT_EQ(completes[0].error().code, StoreErrc::unavailable);
  other.exec("COMMIT");
  EXPECT_EQ(other.scalar("SELECT count(*) FROM idempotency_keys WHERE key LIKE 'key-batch-locked-_'"), 0);
  EXPECT_EQ(other.scalar("SELECT count(*) FROM idempotency_keys WHERE state = 'completed'"), 0);
  auto again = b.claim_many({request("key-batch-locked-1"), request("key-batch-locked-2")});
  for (const auto& c : again) {
    ASSERT_TRUE(c);
    EXPECT_EQ(c->status, ClaimStatus::claimed);
  }
  EXPECT_EQ(b.complete_many({completion(fence_of(held))})[0], FenceStatus::ok);
}

// The disk fills up (here: the process's file-size limit, RLIMIT_FSIZE, is reached) under a running
// store. Claims and completions fail as unavailable and lose nothing, reads go on, and the same
// store object writes again once there is room. The limit's SIGXFSZ, which kills a process by
// default, must not: the store's thread blocks it, so the write fails with EFBIG instead.
TEST_F(SqliteStoreTest, WritesBeyondTheFileSizeLimitFailAsUnavailableAndResumeOnceThereIsRoom) {
  constexpr std::uintmax_t kWalBefore = 512 * 1024;
  auto store = open_store(path);
  BlockingStore b(*store);
  // Grown past the limit set below, the WAL takes its next frames beyond it (no checkpoint yet).
  for (int n = 0; std::filesystem::file_size(path + "-wal") < kWalBefore; ++n) {
    const auto c = claim_ok(*store, "key-fill-" + std::to_string(n) + "-000000");
    ASSERT_EQ(b.complete(completion(fence_of(c))), FenceStatus::ok);
  }
  const auto held = claim_ok(*store, "key-held-across-limit");  // claimed before, completed during

  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  rlimit limited = saved;
  limited.rlim_cur = kWalBefore / 2;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  auto claimed = b.claim(request("key-during-limit"));
  auto completed = b.complete(completion(fence_of(held)));
  auto read = b.get(RecordId{"t", "key-fill-0-000000"});
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &saved), 0);

  ASSERT_FALSE(claimed);
  EXPECT_EQ(claimed.error().code, StoreErrc::unavailable) << claimed.error().message;
  EXPECT_TRUE(claimed.error().retryable());
  ASSERT_FALSE(completed);
  EXPECT_EQ(completed.error().code, StoreErrc::unavailable) << completed.error().message;
  ASSERT_TRUE(read) << read.error().message;
  ASSERT_TRUE(*read);
  EXPECT_EQ((*read)->state, RecordState::completed);

  // Room again: the failed claim left nothing behind, the held key is still in progress under its
  // token, and the same store records both.
  EXPECT_EQ(b.claim(request("key-during-limit"))->status, ClaimStatus::claimed);
  EXPECT_EQ(b.complete(completion(fence_of(held))), FenceStatus::ok);
  auto replayed = b.get(RecordId{"t", "key-held-across-limit"});
  ASSERT_TRUE(replayed && *replayed);
  EXPECT_EQ((*replayed)->state, RecordState::completed);
  RawDb raw(path);
  EXPECT_EQ(raw.scalar("SELECT count(*) FROM pragma_integrity_check WHERE integrity_check != 'ok'"), 0);
}

// ---- message consumers: the effect and "processed" in one transaction (SPEC §10) -------------

class SqliteConsumerTest : public SqliteStoreTest {
 protected:
  void SetUp() override {
    store = open_store(path);
    raw = std::make_unique<RawDb>(path);
    raw->exec("CREATE TABLE ledger (message_id TEXT NOT NULL, amount INTEGER NOT NULL)");
  }
  Consumer consumer_on(SqliteStore& s) {
    ConsumerOptions options;
    options.name = "ledger";
    options.lease = 30s;
    options.clock = &clock;
    auto c = Consumer::create(s, std::move(options));
    if (!c) throw std::runtime_error(c.error());
    return std::move(*c);
  }
  // The consumer's effect: a ledger row for the message, then `succeed` decides.
  static SqliteWork post(std::string id, bool succeed = true, std::atomic<int>* ran = nullptr) {
    return [id = std::move(id), succeed, ran](sqlite3* db, std::string& error) {
      if (ran) ++*ran;
      const std::string sql = "INSERT INTO ledger (message_id, amount) VALUES ('" + id + "', 100)";
      if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr) != SQLITE_OK) {
        error = sqlite3_errmsg(db);
        return false;
      }
      if (!succeed) error = "account frozen";
      return succeed;
    };
  }
  std::int64_t rows(const std::string& id) {
    return raw->scalar("SELECT count(*) FROM ledger WHERE message_id = '" + id + "'");
  }

  std::unique_ptr<SqliteStore> store;
  std::unique_ptr<RawDb> raw;
};

TEST_F(SqliteConsumerTest, TheEffectAndTheProcessedRecordCommitTogether) {
  auto consumer = consumer_on(*store);
  auto first = process_once_in_transaction(consumer, *store, "msg-1", "p", post("msg-1"));
  ASSERT_TRUE(first) << first.error().message;
  EXPECT_EQ(first->status, MessageStatus::processed);
  std::atomic<int> ran{0};
  auto again = process_once_in_transaction(consumer, *store, "msg-1", "p", post("msg-1", true, &ran));
  ASSERT_TRUE(again) << again.error().message;
  EXPECT_EQ(again->status, MessageStatus::duplicate);
  EXPECT_EQ(ran.load(), 0);
  EXPECT_EQ(rows("msg-1"), 1);
  EXPECT_EQ(raw->scalar("SELECT count(*) FROM idempotency_keys WHERE tenant_id = 'consumer ledger' AND state = 'completed'"), 1);
}

TEST_F(SqliteConsumerTest, DeclinedOrThrowingWorkRollsBackAndTheNextDeliveryApplies) {
  auto consumer = consumer_on(*store);
  auto declined = process_once_in_transaction(consumer, *store, "msg-2", "p", post("msg-2", false));
  ASSERT_TRUE(declined) << declined.error().message;
  EXPECT_EQ(declined->status, MessageStatus::handler_failed);
  EXPECT_NE(declined->detail.find("account frozen"), std::string::npos) << declined->detail;
  EXPECT_EQ(rows("msg-2"), 0) << "the declined work's row must be rolled back";

  auto threw = process_once_in_transaction(consumer, *store, "msg-2", "p", [](sqlite3* db, std::string&) -> bool {
    sqlite3_exec(db, "INSERT INTO ledger (message_id, amount) VALUES ('msg-2', 1)", nullptr, nullptr, nullptr);
    throw std::runtime_error("bug in the consumer");
  });
  ASSERT_TRUE(threw) << threw.error().message;
  EXPECT_EQ(threw->status, MessageStatus::handler_failed);
  EXPECT_NE(threw->detail.find("bug in the consumer"), std::string::npos) << threw->detail;
  EXPECT_EQ(rows("msg-2"), 0);

  auto applied = process_once_in_transaction(consumer, *store, "msg-2", "p", post("msg-2"));
  ASSERT_TRUE(applied) << applied.error().message;
  EXPECT_EQ(applied->status, MessageStatus::processed);
  EXPECT_EQ(rows("msg-2"), 1);
}

TEST_F(SqliteConsumerTest, AHolderWhoseLeaseWasTakenOverCommitsNothing) {
  auto consumer = consumer_on(*store);
  // A consumer claims and stalls (a GC pause, a hung call) past its lease.
  auto stalled = consumer.claim("msg-3", "p");
  ASSERT_TRUE(stalled && std::holds_alternative<Consumer::Held>(*stalled));
  clock.advance(31s);
  auto taker = process_once_in_transaction(consumer, *store, "msg-3", "p", post("msg-3"));
  ASSERT_TRUE(taker) << taker.error().message;
  EXPECT_EQ(taker->status, MessageStatus::processed);
  // The stalled one resumes: its transaction finds the fence gone and runs nothing.
  std::atomic<int> ran{0};
  auto late = store->complete_in_transaction(consumer.completion(std::get<Consumer::Held>(*stalled), ""),
                                             post("msg-3", true, &ran));
  ASSERT_TRUE(late) << late.error().message;
  EXPECT_EQ(*late, FenceStatus::lost);
  EXPECT_EQ(ran.load(), 0);
  EXPECT_EQ(rows("msg-3"), 1);
}

TEST_F(SqliteConsumerTest, AConsumerOfAnotherStoreIsRefused) {
  auto other = open_store(dir.file("other.db"));
  auto consumer = consumer_on(*other);
  auto refused = process_once_in_transaction(consumer, *store, "msg-4", "p", post("msg-4"));
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("another store"), std::string::npos);
  EXPECT_EQ(rows("msg-4"), 0);
}

// Deliveries of the same messages racing on eight threads through two stores on one file (two
// consumer processes): every message's ledger row is written exactly once.
TEST_F(SqliteConsumerTest, ConcurrentRedeliveriesApplyEachEffectExactlyOnce) {
  auto second = open_store(path);
  SqliteStore* stores[] = {store.get(), second.get()};
  std::vector<Consumer> consumers{consumer_on(*store), consumer_on(*second)};
  constexpr int kMessages = 30, kThreads = 8, kDeliveries = 2;
  auto tally = testing::redeliver_concurrently(kThreads, kMessages, kDeliveries, [&](int thread, const std::string& id) {
    return process_once_in_transaction(consumers[thread % 2], *stores[thread % 2], id, "p", post(id));
  });
  testing::expect_each_processed_once(tally, kMessages, kThreads * kDeliveries);
  EXPECT_EQ(raw->scalar("SELECT count(*) FROM ledger"), kMessages);
  EXPECT_EQ(raw->scalar("SELECT count(*) FROM (SELECT message_id FROM ledger GROUP BY message_id HAVING count(*) > 1)"), 0);
}

// ---- a batch of messages in one transaction, a savepoint each (process_batch_in_transaction) ----

TEST_F(TransactionalCompletionTest, ManyCompletionsCommitInOneTransactionEachInItsOwnSavepoint) {
  auto ok = claim_ok(*store, "key-many-ok-000001");
  auto declined = claim_ok(*store, "key-many-declined1");
  auto stale = claim_ok(*store, "key-many-stale-001");
  auto thrown = claim_ok(*store, "key-many-throws-01");
  auto last = claim_ok(*store, "key-many-last-0001");
  clock.advance(61s);
  auto taker = BlockingStore(*store).claim(request("key-many-stale-001"));  // the stale holder's lease is taken over
  ASSERT_EQ(taker->status, ClaimStatus::claimed);
  bool stale_ran = false;
  std::vector<SqliteWorkItem> items;
  items.push_back({completion(fence_of(ok)), insert_row("key-many-ok-000001")});
  items.push_back({completion(fence_of(declined)), insert_row("key-many-declined1", false)});
  items.push_back({completion(fence_of(stale)), insert_row("key-many-stale-001", true, &stale_ran)});
  items.push_back({completion(fence_of(thrown)), [](sqlite3* db, std::string&) -> bool {
                     sqlite3_exec(db, "INSERT INTO business (key, amount) VALUES ('key-many-throws-01', 1)", nullptr,
                                  nullptr, nullptr);
                     throw std::runtime_error("boom");
                   }});
  items.push_back({completion(fence_of(last)), insert_row("key-many-last-0001")});
  const auto before = store->stats();
  auto results = store->complete_many_in_transaction(std::move(items));
  EXPECT_EQ(store->stats().transactions - before.transactions, 1u);
  ASSERT_EQ(results.size(), 5u);
  for (const auto& r : results) ASSERT_TRUE(r) << r.error().message;
  EXPECT_EQ(results[0]->status, WorkStatus::committed);
  EXPECT_EQ(results[1]->status, WorkStatus::declined);
  EXPECT_NE(results[1]->error.find("insufficient funds"), std::string::npos) << results[1]->error;
  EXPECT_EQ(results[2]->status, WorkStatus::lost);
  EXPECT_FALSE(stale_ran);
  EXPECT_EQ(results[3]->status, WorkStatus::declined);
  EXPECT_NE(results[3]->error.find("boom"), std::string::npos) << results[3]->error;
  EXPECT_EQ(results[4]->status, WorkStatus::committed);

  EXPECT_EQ(business_rows("key-many-ok-000001"), 1);
  EXPECT_EQ(business_rows("key-many-last-0001"), 1);
  EXPECT_EQ(raw->scalar("SELECT count(*) FROM business"), 2);
  BlockingStore b(*store);
  EXPECT_EQ(b.get(RecordId{"t", "key-many-ok-000001"}).value()->state, RecordState::completed);
  EXPECT_EQ(b.get(RecordId{"t", "key-many-declined1"}).value()->state, RecordState::in_progress);
  EXPECT_EQ(b.get(RecordId{"t", "key-many-stale-001"}).value()->fencing_token, taker->record.fencing_token);
  EXPECT_EQ(b.get(RecordId{"t", "key-many-throws-01"}).value()->state, RecordState::in_progress);
}

// A work that ends the store's transaction takes the whole batch with it: no item commits.
TEST_F(TransactionalCompletionTest, AWorkThatEndsTheTransactionFailsEveryItem) {
  auto first = claim_ok(*store, "key-many-end-00001");
  auto second = claim_ok(*store, "key-many-end-00002");
  std::vector<SqliteWorkItem> items;
  items.push_back({completion(fence_of(first)), insert_row("key-many-end-00001")});
  items.push_back({completion(fence_of(second)), [](sqlite3* db, std::string&) {
                     return sqlite3_exec(db, "ROLLBACK", nullptr, nullptr, nullptr) == SQLITE_OK;
                   }});
  auto results = store->complete_many_in_transaction(std::move(items));
  ASSERT_EQ(results.size(), 2u);
  for (const auto& r : results) EXPECT_FALSE(r);
  EXPECT_EQ(business_rows("key-many-end-00001"), 0);
  EXPECT_EQ(BlockingStore(*store).get(RecordId{"t", "key-many-end-00001"}).value()->state, RecordState::in_progress);
  // The store recovers: its next transaction works.
  EXPECT_EQ(BlockingStore(*store).complete(completion(fence_of(first))), FenceStatus::ok);
}

TEST_F(TransactionalCompletionTest, BlockingBatchCallFromACallbackFailsInsteadOfDeadlocking) {
  auto c = claim_ok(*store, "key-many-callback1");
  std::promise<BatchResults<WorkResult>> inner;
  store->ping([&](StoreResult<Done>) {
    std::vector<SqliteWorkItem> items;
    items.push_back({completion(fence_of(c)), insert_row("key-many-callback1")});
    inner.set_value(store->complete_many_in_transaction(std::move(items)));
  });
  auto results = inner.get_future().get();
  ASSERT_EQ(results.size(), 1u);
  ASSERT_FALSE(results[0]);
  EXPECT_EQ(results[0].error().code, StoreErrc::internal);
  EXPECT_EQ(business_rows("key-many-callback1"), 0);
}

class SqliteBatchConsumerTest : public SqliteConsumerTest {
 protected:
  // The batch's effect: a ledger row for messages[index], then the batch's `fails` decides; the
  // ids of the works that ran are counted in `ran`.
  static SqliteBatchWork post_batch(const testing::MessageBatch& batch, std::map<std::string, int>* ran = nullptr) {
    return [&batch, ran](std::size_t index, sqlite3* db, std::string& error) {
      if (ran) ++(*ran)[batch.ids[index]];
      const std::string sql = "INSERT INTO ledger (message_id, amount) VALUES ('" + batch.ids[index] + "', 100)";
      if (sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr) != SQLITE_OK) {
        error = sqlite3_errmsg(db);
        return false;
      }
      if (batch.fails[index]) error = "account frozen";
      return !batch.fails[index];
    };
  }
  std::int64_t records(const std::string& id, const std::string& state = "completed") {
    return raw->scalar("SELECT count(*) FROM idempotency_keys WHERE tenant_id = 'consumer ledger' AND key = '" + id +
                       "' AND state = '" + state + "'");
  }
  // The first column of the first row, as text.
  static std::string text_of(sqlite3* db, const std::string& sql) {
    sqlite3_stmt* stmt = nullptr;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &stmt, nullptr) != SQLITE_OK) throw std::runtime_error(sql);
    std::string value;
    if (sqlite3_step(stmt) == SQLITE_ROW && sqlite3_column_text(stmt, 0)) {
      value = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
    }
    sqlite3_finalize(stmt);
    return value;
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

// Fifty new messages in one transaction; the 8th declines and the 32nd throws: they alone roll
// back, leaving no row and no record, and their next delivery runs them.
TEST_F(SqliteBatchConsumerTest, FiftyMessagesCommitTogetherButTheTwoThatFail) {
  auto consumer = consumer_on(*store);
  testing::MessageBatch batch;
  for (int i = 0; i < 50; ++i) batch.add(std::string("batch-") + std::to_string(100 + i), "p", i == 7);
  SqliteBatchWork post = post_batch(batch);
  const auto before = store->stats();
  auto outcomes = process_batch_in_transaction(
      consumer, *store, batch.messages(), [&](std::size_t index, sqlite3* db, std::string& error) -> bool {
        if (index == 31) {
          sqlite3_exec(db, "INSERT INTO ledger (message_id, amount) VALUES ('batch-131', 1)", nullptr, nullptr, nullptr);
          throw std::runtime_error("bug in the consumer");
        }
        return post(index, db, error);
      });
  // One transaction claims, one applies, one forgets the two failed claims.
  EXPECT_EQ(store->stats().transactions - before.transactions, 3u);
  ASSERT_EQ(outcomes.size(), 50u);
  for (std::size_t i = 0; i < outcomes.size(); ++i) {
    ASSERT_TRUE(outcomes[i]) << outcomes[i].error().message;
    if (i == 7 || i == 31) {
      EXPECT_EQ(outcomes[i]->status, MessageStatus::handler_failed) << i;
      EXPECT_EQ(rows(batch.ids[i]), 0) << i;
      EXPECT_EQ(raw->scalar("SELECT count(*) FROM idempotency_keys WHERE key = '" + batch.ids[i] + "'"), 0) << i;
    } else {
      EXPECT_EQ(outcomes[i]->status, MessageStatus::processed) << i;
      EXPECT_EQ(rows(batch.ids[i]), 1) << i;
      EXPECT_EQ(records(batch.ids[i]), 1) << i;
    }
  }
  EXPECT_NE(outcomes[7]->detail.find("account frozen"), std::string::npos) << outcomes[7]->detail;
  EXPECT_NE(outcomes[31]->detail.find("bug in the consumer"), std::string::npos) << outcomes[31]->detail;

  // The whole batch is delivered again: the 48 are duplicates, the two run now.
  batch.fails[7] = false;
  std::map<std::string, int> ran;
  auto again = process_batch_in_transaction(consumer, *store, batch.messages(), post_batch(batch, &ran));
  for (std::size_t i = 0; i < again.size(); ++i) {
    ASSERT_TRUE(again[i]) << again[i].error().message;
    EXPECT_EQ(again[i]->status, i == 7 || i == 31 ? MessageStatus::processed : MessageStatus::duplicate) << i;
  }
  EXPECT_EQ(ran, (std::map<std::string, int>{{"batch-107", 1}, {"batch-131", 1}}));
  EXPECT_EQ(raw->scalar("SELECT count(*) FROM ledger"), 50);
  EXPECT_EQ(raw->scalar("SELECT count(DISTINCT message_id) FROM ledger"), 50);
}

TEST_F(SqliteBatchConsumerTest, DuplicatesWithinABatchAndOfEarlierBatchesRunOnce) {
  auto consumer = consumer_on(*store);
  testing::MessageBatch first;
  first.add("dup-a");
  first.add("dup-b");
  first.add("dup-a");
  first.add("bad id");
  std::map<std::string, int> ran;
  EXPECT_EQ(statuses(process_batch_in_transaction(consumer, *store, first.messages(), post_batch(first, &ran))),
            (std::vector{MessageStatus::processed, MessageStatus::processed, MessageStatus::in_progress,
                         MessageStatus::invalid_id}));
  testing::MessageBatch second;
  second.add("dup-b");
  second.add("dup-c");
  second.add("dup-c");
  second.add("dup-a");
  second.add("dup-a", "another payload");
  EXPECT_EQ(statuses(process_batch_in_transaction(consumer, *store, second.messages(), post_batch(second, &ran))),
            (std::vector{MessageStatus::duplicate, MessageStatus::processed, MessageStatus::in_progress,
                         MessageStatus::duplicate, MessageStatus::conflict}));
  EXPECT_EQ(ran, (std::map<std::string, int>{{"dup-a", 1}, {"dup-b", 1}, {"dup-c", 1}}));
  EXPECT_EQ(raw->scalar("SELECT count(*) FROM ledger"), 3);
}

// Between the batch's claims and its transaction, its lease runs out and another consumer (another
// process on the same file) takes one message over and processes it: that message alone is lost,
// its work not run; the others commit.
TEST_F(SqliteBatchConsumerTest, ALeaseTakenOverIsLostForThatMessageOnly) {
  testing::HookClock hooked(clock);
  ConsumerOptions options;
  options.name = "ledger";
  options.lease = 30s;
  options.clock = &hooked;
  auto consumer = Consumer::create(*store, options);
  ASSERT_TRUE(consumer) << consumer.error();
  auto other_store = open_store(path);
  auto other = consumer_on(*other_store);
  testing::MessageBatch batch;
  for (int i = 0; i < 5; ++i) batch.add(std::string("lease-") + std::to_string(i));
  hooked.arm(6, [&] {
    clock.advance(31s);
    auto taken = process_once_in_transaction(other, *other_store, "lease-2", "p", post("lease-2"));
    ASSERT_TRUE(taken && taken->status == MessageStatus::processed);
  });
  std::map<std::string, int> ran;
  auto outcomes = process_batch_in_transaction(*consumer, *store, batch.messages(), post_batch(batch, &ran));
  EXPECT_EQ(statuses(outcomes), (std::vector{MessageStatus::processed, MessageStatus::processed, MessageStatus::lost,
                                             MessageStatus::processed, MessageStatus::processed}));
  EXPECT_EQ(ran.count("lease-2"), 0u);
  for (const auto& id : batch.ids) {
    EXPECT_EQ(rows(id), 1) << id;  // lease-2's row is the other consumer's
    EXPECT_EQ(records(id), 1) << id;
  }
}

// Another process holds the write lock past busy_timeout when the batch's transaction would begin:
// no message commits, each fails as unavailable (not in doubt), and once the lock is gone and the
// lease has run out (forgetting the claims needed the lock too) the next delivery runs them all.
TEST_F(SqliteBatchConsumerTest, ATransactionThatCannotCommitLeavesNothingAndTheNextDeliveryRunsThem) {
  SqliteOptions options;
  options.path = path;
  options.busy_timeout = 100ms;
  auto impatient = open_store(options);
  testing::HookClock hooked(clock);
  ConsumerOptions consumer_options;
  consumer_options.name = "ledger";
  consumer_options.lease = 30s;
  consumer_options.clock = &hooked;
  auto consumer = Consumer::create(*impatient, consumer_options);
  ASSERT_TRUE(consumer) << consumer.error();
  testing::MessageBatch batch;
  for (int i = 0; i < 10; ++i) batch.add(std::string("locked-") + std::to_string(i));
  RawDb other(path);
  hooked.arm(11, [&] { other.exec("BEGIN EXCLUSIVE; DELETE FROM ledger WHERE message_id = 'nothing';"); });
  auto outcomes = process_batch_in_transaction(*consumer, *impatient, batch.messages(), post_batch(batch));
  ASSERT_EQ(outcomes.size(), 10u);
  for (const auto& o : outcomes) {
    ASSERT_FALSE(o);
    EXPECT_EQ(o.error().code, StoreErrc::unavailable) << o.error().message;
    EXPECT_FALSE(o.error().in_doubt);
  }
  other.exec("COMMIT");
  EXPECT_EQ(raw->scalar("SELECT count(*) FROM ledger"), 0);
  EXPECT_EQ(raw->scalar("SELECT count(*) FROM idempotency_keys WHERE state = 'completed'"), 0);

  clock.advance(31s);
  auto again = process_batch_in_transaction(*consumer, *impatient, batch.messages(), post_batch(batch));
  for (const auto& o : again) {
    ASSERT_TRUE(o) << o.error().message;
    EXPECT_EQ(o->status, MessageStatus::processed);
  }
  EXPECT_EQ(raw->scalar("SELECT count(*) FROM ledger"), 10);
}

// The same random batches (duplicates of earlier batches, conflicts, invalid ids, declining
// works) applied with the batch form to one database and one message at a time with
// process_once_in_transaction to another give the same outcomes, rows and records.
TEST_F(SqliteBatchConsumerTest, TheBatchFormAndTheSingleFormAgree) {
  auto single_path = dir.file("single.db");
  auto single_store = open_store(single_path);
  RawDb single_raw(single_path);
  single_raw.exec("CREATE TABLE ledger (message_id TEXT NOT NULL, amount INTEGER NOT NULL)");
  auto batched = consumer_on(*store);
  auto single = consumer_on(*single_store);
  const auto batches = testing::random_batches(20261206, 12, 24, 60);
  std::map<MessageStatus, int> seen;
  for (std::size_t round = 0; round < batches.size(); ++round) {
    const testing::MessageBatch& batch = batches[round];
    auto outcomes = statuses(process_batch_in_transaction(batched, *store, batch.messages(), post_batch(batch)));
    for (MessageStatus status : outcomes) ++seen[status];
    for (std::size_t i = 0; i < batch.ids.size(); ++i) {
      auto one = process_once_in_transaction(single, *single_store, batch.ids[i], batch.payloads[i],
                                             post(batch.ids[i], !batch.fails[i]));
      ASSERT_TRUE(one) << one.error().message;
      EXPECT_EQ(one->status, outcomes[i]) << "round " << round << " message " << batch.ids[i];
    }
  }
  // Every message's rows, and every record's state, in one string each.
  for (const char* sql : {"SELECT group_concat(message_id || ':' || n, ',') FROM "
                          "(SELECT message_id, count(*) AS n FROM ledger GROUP BY message_id ORDER BY message_id)",
                          "SELECT group_concat(key || ':' || state, ',') FROM "
                          "(SELECT key, state FROM idempotency_keys ORDER BY key)"}) {
    EXPECT_EQ(text_of(raw->get(), sql), text_of(single_raw.get(), sql)) << sql;
  }
  // The mix had every kind of message in it.
  for (MessageStatus status : {MessageStatus::processed, MessageStatus::duplicate, MessageStatus::conflict,
                               MessageStatus::handler_failed, MessageStatus::invalid_id}) {
    EXPECT_GT(seen[status], 0) << to_string(status);
  }
}

// sqlite_configure_process, in a child of its own: it acts only before SQLite is initialized,
// which this test process did long ago (sqlite3_shutdown in the child returns it to that state).
TEST(SqliteConfigureProcess, TurnsMemoryStatisticsOffBeforeFirstUseAndIsHarmlessAfter) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    int failures = 0;
    if (sqlite3_shutdown() != SQLITE_OK) failures |= 1;
    if (!sqlite_configure_process()) failures |= 2;
    if (sqlite3_initialize() != SQLITE_OK) failures |= 4;
    if (sqlite_configure_process()) failures |= 8;  // too late now: refused, nothing changed
    sqlite3* db = nullptr;
    if (sqlite3_open(":memory:", &db) != SQLITE_OK ||
        sqlite3_exec(db, "CREATE TABLE t (x); INSERT INTO t VALUES (randomblob(100000))", nullptr, nullptr,
                     nullptr) != SQLITE_OK) {
      failures |= 16;
    }
    if (sqlite3_memory_used() != 0) failures |= 32;  // no statistics kept
    sqlite3_close(db);
    ::_exit(failures);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  sqlite3* db = nullptr;  // this process, never configured, still counts
  ASSERT_EQ(sqlite3_open(":memory:", &db), SQLITE_OK);
  EXPECT_GT(sqlite3_memory_used(), 0);
  sqlite3_close(db);
}

// Where statement journals go: a VFS in front of the default one counts the sub-journal files
// SQLite opens. The store's group commit runs every write in a savepoint of its own; 200 of them
// in one transaction, each journaling more than SQLite's default threshold of 64 KiB (with it,
// step 10 fails) and all together megabytes, must stay in memory: the journal is emptied at each
// release. One savepoint journaling 8 MiB moves to a file past the 127 KiB threshold, and must
// still succeed (SQLite 3.40 fails that move for thresholds of 128 KiB and more: step 11). Without
// sqlite_configure_process the connection keeps everything in memory (temp_store = MEMORY).
namespace journal_files {
sqlite3_vfs* real = nullptr;
sqlite3_vfs counting;
int subjournal_opens = 0;
int open_counted(sqlite3_vfs*, sqlite3_filename name, sqlite3_file* file, int flags, int* out_flags) {
  if (flags & SQLITE_OPEN_SUBJOURNAL) ++subjournal_opens;
  return real->xOpen(real, name, file, flags, out_flags);
}

// In a fresh child: configures the process (or not), counts sub-journal files opened by many
// savepoints in one transaction, then by one big savepoint. Returns 0, or the number of the first
// step that failed (an exit status holds 8 bits: no masks).
int run(const std::string& path, bool configure) {
  if (sqlite3_shutdown() != SQLITE_OK) return 1;
  if (configure && !sqlite_configure_process()) return 2;
  if (sqlite3_initialize() != SQLITE_OK) return 3;
  real = sqlite3_vfs_find(nullptr);
  counting = *real;
  counting.zName = "idem-counting";
  counting.xOpen = open_counted;
  if (sqlite3_vfs_register(&counting, /*makeDflt=*/1) != SQLITE_OK) return 4;
  auto db = sqlite_detail::open_connection(path, 5000);
  if (!db) return 5;
  auto exec = [&](const std::string& sql) {
    return sqlite3_exec(db->get(), sql.c_str(), nullptr, nullptr, nullptr) == SQLITE_OK;
  };
  if (!exec("PRAGMA journal_mode = WAL; CREATE TABLE t (x BLOB);"
            "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2000) "
            "INSERT INTO t SELECT randomblob(3000) FROM n")) {  // one row per page
    return 6;
  }
  if (!exec("BEGIN IMMEDIATE")) return 7;
  // 200 writes of 10 rows (10 pages) each.
  for (int first = 1; first <= 2000; first += 10) {
    if (!exec("SAVEPOINT op; UPDATE t SET x = randomblob(3000) WHERE rowid BETWEEN " + std::to_string(first) +
              " AND " + std::to_string(first + 9) + "; RELEASE op;")) {
      return 8;
    }
  }
  if (!exec("COMMIT")) return 9;
  if (subjournal_opens != 0) return 10;  // many savepoints past 64 KiB: memory only
  // Configured, the 200 journals share a few blocks rather than taking and freeing one each
  // (journal_block_cache.cpp); unconfigured, the cache is not installed at all.
  const auto blocks = sqlite_detail::journal_block_counts();
  if (configure ? blocks.allocated > 4 || blocks.reused < 190 : blocks.allocated + blocks.reused != 0) return 13;
  if (!exec("BEGIN IMMEDIATE; SAVEPOINT op; UPDATE t SET x = randomblob(3000); RELEASE op; COMMIT;")) return 11;
  if (configure ? subjournal_opens == 0 : subjournal_opens != 0) return 12;  // one of 8 MiB
  return 0;
}
}  // namespace journal_files

int journal_child(const std::string& path, bool configure) {
  const pid_t child = ::fork();
  if (child < 0) return -1;
  if (child == 0) ::_exit(journal_files::run(path, configure));
  int status = 0;
  if (::waitpid(child, &status, 0) != child || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST(SqliteStatementJournals, SavepointsOfAGroupCommitStayInMemoryAndOnlyAHugeOneSpillsToAFile) {
  TempDir dir;
  EXPECT_EQ(journal_child(dir.file("configured.db"), /*configure=*/true), 0);
  EXPECT_EQ(journal_child(dir.file("unconfigured.db"), /*configure=*/false), 0);
}

// The journal block cache through SQLite's own allocator, in a configured child: a freed block of
// a journal's size comes back for the next request in its band and is never smaller than asked;
// other sizes, reallocations and a shutdown with blocks cached go through as before. Returns 0
// or the first step that failed.
int journal_block_cache_child() {
  if (sqlite3_shutdown() != SQLITE_OK) return 1;
  if (!sqlite_configure_process()) return 2;
  if (sqlite3_initialize() != SQLITE_OK) return 3;
  constexpr int kJournal = (127 << 10) + 8;  // what SQLite asks for a 127 KiB journal
  void* first = sqlite3_malloc(kJournal);
  if (first == nullptr || sqlite3_msize(first) < kJournal) return 4;
  std::memset(first, 0xab, kJournal);
  sqlite3_free(first);
  void* again = sqlite3_malloc(kJournal - 8);  // another request in the band: the same block
  if (again != first || sqlite3_msize(again) < kJournal) return 5;
  const auto counts = sqlite_detail::journal_block_counts();
  if (counts.allocated != 1 || counts.reused != 1) return 6;
  void* small = sqlite3_malloc(4096);  // outside the band: SQLite's allocator as it was
  if (small == nullptr || sqlite_detail::journal_block_counts().allocated != 1) return 7;
  void* grown = sqlite3_realloc(again, 1 << 20);  // a journal block grown: an ordinary block now
  if (grown == nullptr || sqlite3_msize(grown) < (1 << 20)) return 8;
  sqlite3_free(grown);
  sqlite3_free(small);
  void* held[6];  // more journals at once than the cache keeps: the rest are freed, not lost
  for (auto& p : held) {
    if ((p = sqlite3_malloc(kJournal)) == nullptr) return 9;
  }
  for (auto* p : held) sqlite3_free(p);
  if (sqlite3_shutdown() != SQLITE_OK) return 10;  // frees the cached blocks
  if (!sqlite_configure_process() || sqlite3_initialize() != SQLITE_OK) return 11;  // not wrapped twice
  void* after = sqlite3_malloc(kJournal);
  if (after == nullptr) return 12;
  sqlite3_free(after);
  return 0;
}

TEST(SqliteStatementJournals, AFreedJournalBlockIsReusedAndOtherAllocationsAreUntouched) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(journal_block_cache_child());
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace idem
