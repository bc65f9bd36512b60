#include "idem/open_store.hpp"

#include <gtest/gtest.h>

#include <filesystem>

#include "idem/testing/test_keys.hpp"
#include "sqlite_url.hpp"

namespace idem {
namespace {

TEST(OpenStore, MemoryAndSqliteOpenWithAnOperatorInterface) {
  auto memory = open_store("memory:");
  ASSERT_TRUE(memory) << memory.error().message;
  EXPECT_NE(memory->admin, nullptr);
  const auto path = std::filesystem::temp_directory_path() / ("idem-open-store-" + std::to_string(::getpid()) + ".db");
  auto sqlite = open_store("sqlite:" + path.string());
  ASSERT_TRUE(sqlite) << sqlite.error().message;
  EXPECT_NE(sqlite->admin, nullptr);
  EXPECT_TRUE(BlockingStore(*sqlite->store).ping());
  sqlite->store.reset();
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path.string() + suffix);
}

TEST(OpenStore, KeysWrapTheBackendInAnEncryptedStore) {
  const auto path = std::filesystem::temp_directory_path() / ("idem-open-enc-" + std::to_string(::getpid()) + ".db");
  OpenStoreOptions options;
  options.encryption = testing::test_key_ring(testing::test_key_line("k1", 1));
  auto opened = open_store("sqlite:" + path.string(), options);
  ASSERT_TRUE(opened) << opened.error().message;
  ASSERT_NE(opened->encrypted, nullptr);
  EXPECT_EQ(static_cast<Store*>(opened->encrypted), opened->store.get());
  EXPECT_EQ(static_cast<StoreAdmin*>(opened->encrypted), opened->admin);
  EXPECT_EQ(opened->encrypted->keys(), options.encryption);
  ClaimRequest claim;
  claim.id = RecordId{"t", "key-0000000000000001"};
  claim.request_hash = "h";
  claim.token = new_fencing_token();
  claim.now = SystemClock::instance().now();
  claim.lease_expires = claim.now + std::chrono::minutes(1);
  claim.expires = claim.now + std::chrono::hours(1);
  BlockingStore store(*opened->store);
  ASSERT_EQ(store.claim(claim)->status, ClaimStatus::claimed);
  ASSERT_EQ(store.complete(CompleteRequest{Fence{claim.id, claim.token}, StoredResponse{200, {}, "secret"}, claim.now,
                                           claim.expires}),
            FenceStatus::ok);
  EXPECT_EQ((*store.get(claim.id))->response->body, "secret");
  auto raw = BlockingStore(opened->encrypted->inner()).get(claim.id);
  EXPECT_EQ(sealed_key_id(*(*raw)->response), "k1");
  EXPECT_EQ(open_store("memory:")->encrypted, nullptr);  // no keys, no decorator
  opened->store.reset();
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path.string() + suffix);
}

TEST(OpenStore, BadUrlsSayWhatIsWrong) {
  EXPECT_TRUE(check_store_url("sqlite:").has_value());
  EXPECT_TRUE(check_store_url("mysql://x").has_value());
  EXPECT_FALSE(check_store_url("sqlite:./var/idem.db").has_value());
  auto r = open_store("nonsense");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("unknown store URL"), std::string::npos);
  for (const char* tls : {"rediss://cache:6380", "rediss+cluster://a:1,b:2"}) {
    const std::string why = check_store_url(tls).value_or("");
    EXPECT_NE(why.find("TLS"), std::string::npos) << why;
    EXPECT_NE(why.find("tunnel"), std::string::npos) << why;
  }
}

TEST(OpenStore, SqliteUrlOptionsSetTheStoresOptions) {
  using open_detail::parse_sqlite_url;
  const SqliteOptions defaults;
  auto plain = parse_sqlite_url("sqlite:./var/idem.db");
  ASSERT_TRUE(plain) << plain.error();
  EXPECT_EQ(plain->path, "./var/idem.db");
  EXPECT_EQ(plain->synchronous, defaults.synchronous);
  EXPECT_EQ(plain->busy_timeout, defaults.busy_timeout);
  EXPECT_EQ(plain->max_batch, defaults.max_batch);
  EXPECT_EQ(plain->wal_autocheckpoint, defaults.wal_autocheckpoint);

  auto tuned =
      parse_sqlite_url("sqlite:///srv/idem.db?synchronous=normal&busy_timeout_ms=250&max_batch=64&wal_autocheckpoint=1000");
  ASSERT_TRUE(tuned) << tuned.error();
  EXPECT_EQ(tuned->path, "/srv/idem.db");
  EXPECT_EQ(tuned->synchronous, SqliteSynchronous::normal);
  EXPECT_EQ(tuned->busy_timeout, Millis(250));
  EXPECT_EQ(tuned->max_batch, 64u);
  EXPECT_EQ(tuned->wal_autocheckpoint, 1000);
  EXPECT_EQ(parse_sqlite_url("sqlite:x.db?synchronous=off")->synchronous, SqliteSynchronous::off);
  EXPECT_EQ(parse_sqlite_url("sqlite:x.db?synchronous=extra")->synchronous, SqliteSynchronous::extra);
  EXPECT_EQ(parse_sqlite_url("sqlite:x.db?synchronous=full&synchronous=normal")->synchronous,
            SqliteSynchronous::normal);  // the last one wins, as on a command line
  EXPECT_EQ(parse_sqlite_url("sqlite:x.db?max_batch=8&")->max_batch, 8u);  // empty items are ignored
  EXPECT_EQ(parse_sqlite_url("sqlite:x.db?max_batch=8&&wal_autocheckpoint=5")->wal_autocheckpoint, 5);
}

TEST(OpenStore, BadSqliteUrlOptionsAreRefusedWithTheReason) {
  const auto reason = [](const char* url) { return check_store_url(url).value_or(""); };
  EXPECT_NE(reason("sqlite:x.db?synchronous=sometimes").find("synchronous"), std::string::npos);
  EXPECT_NE(reason("sqlite:x.db?fsync=full").find("unknown sqlite URL option \"fsync\""), std::string::npos);
  EXPECT_NE(reason("sqlite:x.db?max_batch").find("NAME=VALUE"), std::string::npos);
  for (const char* url : {"sqlite:x.db?max_batch=0", "sqlite:x.db?max_batch=-1", "sqlite:x.db?max_batch=12x",
                          "sqlite:x.db?busy_timeout_ms=", "sqlite:x.db?wal_autocheckpoint=99999999999",
                          "sqlite:?synchronous=full"}) {
    EXPECT_FALSE(reason(url).empty()) << url;
  }
  auto refused = open_store("sqlite:x.db?synchronous=sometimes");
  ASSERT_FALSE(refused);
  EXPECT_NE(refused.error().message.find("synchronous"), std::string::npos);
}

TEST(OpenStore, AnSqliteUrlWithOptionsOpensTheFileBeforeTheQuestionMark) {
  const auto path = std::filesystem::temp_directory_path() / ("idem-open-opts-" + std::to_string(::getpid()) + ".db");
  auto sqlite = open_store("sqlite:" + path.string() + "?synchronous=normal&max_batch=8");
  ASSERT_TRUE(sqlite) << sqlite.error().message;
  EXPECT_TRUE(BlockingStore(*sqlite->store).ping());
  EXPECT_TRUE(std::filesystem::exists(path));
  sqlite->store.reset();
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path.string() + suffix);
}

TEST(OpenStore, TheSqlitePathOfAUrlLeavesItsOptionsOut) {
  EXPECT_EQ(sqlite_path_of("sqlite:./var/idem.db?synchronous=normal"), "./var/idem.db");
  EXPECT_EQ(sqlite_path_of("sqlite:///abs/idem.db"), "/abs/idem.db");
  EXPECT_EQ(sqlite_path_of("sqlite:x.db?synchronous=sometimes"), std::nullopt);  // not a valid URL
  EXPECT_EQ(sqlite_path_of("memory:"), std::nullopt);
  EXPECT_EQ(sqlite_path_of("redis://h:6379"), std::nullopt);
}

TEST(OpenStore, PasswordsNeverAppearInNames) {
  EXPECT_EQ(redact_url("postgres://idem:s3cret@db:5432/idem"), "postgres://idem:***@db:5432/idem");
  EXPECT_EQ(redact_url("postgres://idem@db/idem"), "postgres://idem@db/idem");
  EXPECT_EQ(redact_url("redis://h:6379"), "redis://h:6379");
  EXPECT_EQ(check_store_url("mysql://u:pw@h/db")->find("pw"), std::string::npos);
}

TEST(OpenOutboxReader, AnSqliteUrlOpensTheOutboxOfAnExistingFile) {
  const auto path = std::filesystem::temp_directory_path() / ("idem-open-outbox-" + std::to_string(::getpid()) + ".db");
  const std::string url = "sqlite:" + path.string() + "?busy_timeout_ms=250";
  auto missing = open_outbox_reader(url);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message.find("does not exist"), std::string::npos) << missing.error().message;
  EXPECT_FALSE(std::filesystem::exists(path));  // never created

  open_store("sqlite:" + path.string())->store.reset();  // the store's migrations make the table
  auto relay = open_outbox_reader(url);
  ASSERT_TRUE(relay) << relay.error().message;
  EXPECT_TRUE((*relay)->ping());
  auto second = open_outbox_reader(url);
  ASSERT_FALSE(second);
  EXPECT_NE(second.error().message.find("one relay per SQLite file"), std::string::npos) << second.error().message;
  OutboxReaderOptions op;
  op.relay = false;
  auto operator_reader = open_outbox_reader(url, op);
  ASSERT_TRUE(operator_reader) << operator_reader.error().message;
  EXPECT_EQ((*operator_reader)->count()->pending, 0u);
  relay->reset();
  operator_reader->reset();
  for (const char* suffix : {"", "-wal", "-shm", "-relay.lock"}) std::filesystem::remove(path.string() + suffix);
}

TEST(OpenOutboxReader, OtherSchemesAreRefusedSayingTheOutboxNeedsSqliteOrPostgres) {
  for (const char* url : {"memory:", "redis://h:6379", "redis+cluster://a:1,b:2", "mysql://u:pw123@h/db", "nonsense"}) {
    auto r = open_outbox_reader(url);
    ASSERT_FALSE(r) << url;
    EXPECT_NE(r.error().message.find("the outbox needs SQLite or PostgreSQL"), std::string::npos) << r.error().message;
    EXPECT_EQ(r.error().message.find("pw123"), std::string::npos) << r.error().message;
  }
  auto bad = open_outbox_reader("sqlite:x.db?synchronous=sometimes");
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message.find("synchronous"), std::string::npos);
}

TEST(OpenOutboxReader, APostgresErrorNeverShowsThePassword) {
  OutboxReaderOptions options;
  options.connect_timeout = std::chrono::seconds(2);
  for (const char* url : {"postgres://idem:s3cretpw@127.0.0.1:1/idem", "postgres://idem:s3cretpw@[broken/idem"}) {
    auto r = open_outbox_reader(url, options);
    ASSERT_FALSE(r) << url;
    EXPECT_EQ(r.error().message.find("s3cretpw"), std::string::npos) << r.error().message;
  }
}

}  // namespace
}  // namespace idem
