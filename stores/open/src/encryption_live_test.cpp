// Encryption at rest on PostgreSQL and Redis: the raw storage is the table as psql prints it and
// the values as redis-cli returns them (GET), and records are altered with those clients.
// Needs IDEM_TEST_POSTGRES_URL and IDEM_TEST_REDIS_URL (scripts/test, or
// `bash scripts/lib/servers.sh start DIR postgres redis && source DIR/env`). Without them: every
// test fails under CI=true and is skipped, loudly, otherwise.
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

#include "encryption_at_rest_test.hpp"
#include "idem/postgres_store.hpp"
#include "idem/redis_store.hpp"

namespace idem::testing {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

std::string required_env(const char* name) {
  if (const char* v = env(name)) return v;
  throw std::runtime_error(std::string(name) + " is not set (scripts/lib/servers.sh start DIR && source DIR/env)");
}

class LiveEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    if (env("IDEM_TEST_POSTGRES_URL") && env("IDEM_TEST_REDIS_URL")) return;
    const char* ci = env("CI");
    if (ci != nullptr && std::string_view(ci) == "true") {
      std::fprintf(stderr, "\n*** FAILING every encryption live test: no server URLs (CI=true: never skipped) ***\n\n");
      return;
    }
    std::printf("\n[  SKIPPED ] *** every encryption live test: IDEM_TEST_POSTGRES_URL and IDEM_TEST_REDIS_URL "
                "are not both set; scripts/test starts the servers ***\n\n");
    std::fflush(stdout);
    GTEST_SKIP();
  }
};
[[maybe_unused]] ::testing::Environment* const registered = ::testing::AddGlobalTestEnvironment(new LiveEnvironment);

std::string unique_suffix() {
  static std::atomic<int> n{0};
  return std::to_string(::getpid()) + "_" + std::to_string(n++);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) out.push_back(line);
  }
  return out;
}

// ---- PostgreSQL: a schema of its own per test, read and altered through psql ----------------

std::string sql_literal(std::string_view s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += '\'';
    out += c;
  }
  return out + "'";
}

class PostgresRaw final : public RawBackend {
 public:
  PostgresRaw() : url_(required_env("IDEM_TEST_POSTGRES_URL")), schema_("idem_enc_" + unique_suffix()) {}
  ~PostgresRaw() override {
    psql("SET client_min_messages = warning; DROP SCHEMA IF EXISTS \"" + schema_ + "\" CASCADE");
  }

  std::unique_ptr<Store> open() override {
    PostgresOptions options;
    options.conninfo = url_;
    options.schema = schema_;
    options.reaper_interval = Millis{0};
    auto store = PostgresStore::open(std::move(options));
    if (!store) throw std::runtime_error("postgres: " + store.error().message);
    return std::move(*store);
  }

  // Every column of every row, as text: bytea in PostgreSQL's hex form, so the needle is looked
  // for both as text and as hex.
  std::size_t count_in_storage(std::string_view needle) override {
    const std::string rows = psql("SELECT t::text FROM " + table() + " t");
    return occurrences(rows, needle) + occurrences(rows, hex_of(needle));
  }

  void alter_one_byte(const RecordId& id) override {
    const std::string changed = psql("UPDATE " + table() +
                                     " SET response_body = set_byte(response_body, length(response_body) / 2,"
                                     " get_byte(response_body, length(response_body) / 2) # 1) WHERE " +
                                     where(id) + " RETURNING 1");
    EXPECT_EQ(lines_of(changed).size(), 1u) << changed;
  }

  void copy_response(const RecordId& from, const RecordId& to) override {
    const std::string changed =
        psql("UPDATE " + table() + " d SET response_status = s.response_status, response_headers = s.response_headers,"
             " response_body = s.response_body FROM " + table() + " s WHERE d.tenant_id = " + sql_literal(to.tenant) +
             " AND d.key = " + sql_literal(to.key) + " AND s.tenant_id = " + sql_literal(from.tenant) +
             " AND s.key = " + sql_literal(from.key) + " RETURNING 1");
    EXPECT_EQ(lines_of(changed).size(), 1u) << changed;
  }

 private:
  std::string table() const { return "\"" + schema_ + "\".idempotency_keys"; }
  static std::string where(const RecordId& id) {
    return "tenant_id = " + sql_literal(id.tenant) + " AND key = " + sql_literal(id.key);
  }
  std::string psql(const std::string& sql) {
    return run_command({"psql", url_, "-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-c", sql});
  }

  std::string url_;
  std::string schema_;
};

// ---- Redis: a key prefix of its own per test, read and altered through redis-cli --------------

class RedisRaw final : public RawBackend {
 public:
  RedisRaw() : url_(required_env("IDEM_TEST_REDIS_URL")), prefix_("idem-enc-test:" + unique_suffix() + ":") {}
  ~RedisRaw() override {
    // In batches: the rotation test leaves thousands of keys, one redis-cli each would take long.
    std::vector<std::string> batch = {"DEL"};
    for (const std::string& k : keys()) {
      batch.push_back(k);
      if (batch.size() == 500) {
        cli(batch);
        batch.resize(1);
      }
    }
    if (batch.size() > 1) cli(batch);
  }

  std::unique_ptr<Store> open() override {
    RedisOptions options;
    options.url = url_;
    options.key_prefix = prefix_;
    auto store = RedisStore::open(std::move(options));
    if (!store) throw std::runtime_error("redis: " + store.error().message);
    return std::move(*store);
  }

  // Every value under the prefix, read raw with GET (one string per record).
  std::size_t count_in_storage(std::string_view needle) override {
    std::size_t n = 0;
    const auto all = keys();
    EXPECT_FALSE(all.empty()) << "no keys under " << prefix_;
    for (const std::string& k : all) n += occurrences(cli({"GET", k}), needle);
    return n;
  }

  void alter_one_byte(const RecordId& id) override {
    const std::string k = key_of(id);
    const long length = std::stol(cli({"STRLEN", k}));
    ASSERT_GT(length, 40);
    // The record string ends with the stored body: the ciphertext and its tag.
    const std::string offset = std::to_string(length - 20);
    const std::string old = cli({"GETRANGE", k, offset, offset});
    ASSERT_EQ(old.size(), 1u);
    cli({"SETRANGE", k, offset, old == "A" ? "B" : "A"});
  }

  void copy_response(const RecordId& from, const RecordId& to) override {
    // The whole record string: its response, and also its hash and token, which the claim of
    // `to` then finds under `to`'s key.
    EXPECT_EQ(lines_of(cli({"COPY", key_of(from), key_of(to), "REPLACE"})), std::vector<std::string>{"1"});
  }

 private:
  // The key RedisStore uses: prefix{tenant:key}; the test ids need no escaping.
  std::string key_of(const RecordId& id) const { return prefix_ + "{" + id.tenant + ":" + id.key + "}"; }
  std::vector<std::string> keys() { return lines_of(cli({"--scan", "--pattern", prefix_ + "*"})); }
  std::string cli(std::vector<std::string> args) {
    std::vector<std::string> argv = {"redis-cli", "-u", url_, "--no-auth-warning"};
    argv.insert(argv.end(), args.begin(), args.end());
    std::string out = run_command(argv);
    // redis-cli ends every reply with a newline of its own.
    if (!out.empty() && out.back() == '\n') out.pop_back();
    return out;
  }

  std::string url_;
  std::string prefix_;
};

INSTANTIATE_TEST_SUITE_P(Live, EncryptionAtRest,
                         ::testing::Values(RawBackendFactory{"postgres", [] { return std::make_unique<PostgresRaw>(); }},
                                           RawBackendFactory{"redis", [] { return std::make_unique<RedisRaw>(); }}),
                         EncryptionAtRest::name_of);

}  // namespace
}  // namespace idem::testing
