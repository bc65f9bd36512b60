// Encryption at rest on SQLite: the raw storage is the database file and its -wal and -shm
// files, read byte for byte; records are altered with SQLite's own API, as a person with the
// file would.
#include <sqlite3.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "encryption_at_rest_test.hpp"
#include "idem/sqlite_store.hpp"

namespace idem::testing {
namespace {

class SqliteRaw final : public RawBackend {
 public:
  SqliteRaw() {
    static std::atomic<int> n{0};
    dir_ = std::filesystem::temp_directory_path() /
           ("idem-enc-sqlite-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    std::filesystem::create_directories(dir_);
    path_ = (dir_ / "idem.db").string();
  }
  ~SqliteRaw() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Store> open() override {
    SqliteOptions options;
    options.path = path_;
    auto store = SqliteStore::open(std::move(options));
    if (!store) throw std::runtime_error("sqlite: " + store.error().message);
    return std::move(*store);
  }

  std::size_t count_in_storage(std::string_view needle) override {
    std::size_t n = 0;
    for (const char* suffix : {"", "-wal", "-shm", "-journal"}) {
      std::ifstream in(path_ + suffix, std::ios::binary);
      if (!in) continue;
      std::ostringstream bytes;
      bytes << in.rdbuf();
      n += occurrences(bytes.str(), needle);
    }
    return n;
  }

  void alter_one_byte(const RecordId& id) override {
    Db db(path_);
    sqlite3_stmt* read = db.prepare("SELECT response_body FROM idempotency_keys WHERE tenant_id = ?1 AND key = ?2");
    bind_id(read, id);
    ASSERT_EQ(sqlite3_step(read), SQLITE_ROW);
    std::string body(static_cast<const char*>(sqlite3_column_blob(read, 0)),
                     static_cast<std::size_t>(sqlite3_column_bytes(read, 0)));
    sqlite3_finalize(read);
    ASSERT_GT(body.size(), 40u);
    body[body.size() / 2] = static_cast<char>(body[body.size() / 2] ^ 0x01);
    sqlite3_stmt* write = db.prepare("UPDATE idempotency_keys SET response_body = ?3 WHERE tenant_id = ?1 AND key = ?2");
    bind_id(write, id);
    sqlite3_bind_blob(write, 3, body.data(), static_cast<int>(body.size()), SQLITE_TRANSIENT);
    ASSERT_EQ(sqlite3_step(write), SQLITE_DONE);
    sqlite3_finalize(write);
    EXPECT_EQ(sqlite3_changes(db.db), 1);
  }

  void copy_response(const RecordId& from, const RecordId& to) override {
    Db db(path_);
    sqlite3_stmt* s = db.prepare(
        "UPDATE idempotency_keys SET (response_status, response_headers, response_body) = "
        "(SELECT response_status, response_headers, response_body FROM idempotency_keys "
        " WHERE tenant_id = ?3 AND key = ?4) WHERE tenant_id = ?1 AND key = ?2");
    bind_id(s, to);
    sqlite3_bind_text(s, 3, from.tenant.data(), static_cast<int>(from.tenant.size()), SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 4, from.key.data(), static_cast<int>(from.key.size()), SQLITE_TRANSIENT);
    ASSERT_EQ(sqlite3_step(s), SQLITE_DONE) << sqlite3_errmsg(db.db);
    sqlite3_finalize(s);
    EXPECT_EQ(sqlite3_changes(db.db), 1);
  }

 private:
  struct Db {
    sqlite3* db = nullptr;
    explicit Db(const std::string& path) {
      if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE, nullptr) != SQLITE_OK) {
        throw std::runtime_error("sqlite3_open " + path);
      }
      sqlite3_busy_timeout(db, 5000);
    }
    ~Db() { sqlite3_close(db); }
    sqlite3_stmt* prepare(const char* sql) {
      sqlite3_stmt* s = nullptr;
      if (sqlite3_prepare_v2(db, sql, -1, &s, nullptr) != SQLITE_OK) throw std::runtime_error(sqlite3_errmsg(db));
      return s;
    }
  };
  static void bind_id(sqlite3_stmt* s, const RecordId& id) {
    sqlite3_bind_text(s, 1, id.tenant.data(), static_cast<int>(id.tenant.size()), SQLITE_TRANSIENT);
    sqlite3_bind_text(s, 2, id.key.data(), static_cast<int>(id.key.size()), SQLITE_TRANSIENT);
  }

  std::filesystem::path dir_;
  std::string path_;
};

INSTANTIATE_TEST_SUITE_P(Sqlite, EncryptionAtRest,
                         ::testing::Values(RawBackendFactory{"sqlite", [] { return std::make_unique<SqliteRaw>(); }}),
                         EncryptionAtRest::name_of);

}  // namespace
}  // namespace idem::testing
