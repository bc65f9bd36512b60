#include "idem/open_store.hpp"

#include <gtest/gtest.h>

#include <filesystem>

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

TEST(OpenStore, BadUrlsSayWhatIsWrong) {
  EXPECT_TRUE(check_store_url("sqlite:").has_value());
  EXPECT_TRUE(check_store_url("mysql://x").has_value());
  EXPECT_FALSE(check_store_url("sqlite:./var/idem.db").has_value());
  auto r = open_store("nonsense");
  ASSERT_FALSE(r);
  EXPECT_NE(r.error().message.find("unknown store URL"), std::string::npos);
}

TEST(OpenStore, PasswordsNeverAppearInNames) {
  EXPECT_EQ(redact_store_url("postgres://idem:s3cret@db:5432/idem"), "postgres://idem:***@db:5432/idem");
  EXPECT_EQ(redact_store_url("postgres://idem@db/idem"), "postgres://idem@db/idem");
  EXPECT_EQ(redact_store_url("redis://h:6379"), "redis://h:6379");
  EXPECT_EQ(check_store_url("mysql://u:pw@h/db")->find("pw"), std::string::npos);
}

}  // namespace
}  // namespace idem
