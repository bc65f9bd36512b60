#include "config.hpp"

#include <gtest/gtest.h>

namespace idem::relay {
namespace {

std::string error_of(std::string_view toml) {
  try {
    parse(toml, {});
  } catch (const sidecar::ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(RelayConfig, DefaultsAndAName) {
  const Config c = parse("outbox = \"sqlite:./var/payments.db\"\nsink = \"http://127.0.0.1:9/receipts\"\n", {});
  EXPECT_EQ(c.batch, 100u);
  EXPECT_EQ(c.max_attempts, 20u);
  EXPECT_FALSE(c.name.empty());
  ASSERT_TRUE(c.admin_listen);
  EXPECT_EQ(c.admin_listen->port, 9102);
}

TEST(RelayConfig, BadSettingsAreOneClearLine) {
  EXPECT_NE(error_of("sink = \"http://h/x\"").find("no outbox"), std::string::npos);
  EXPECT_NE(error_of("outbox = \"sqlite:x.db\"").find("no sink"), std::string::npos);
  EXPECT_NE(error_of("outbox = \"redis://h:1\"\nsink = \"http://h/x\"").find("SQLite or PostgreSQL"), std::string::npos);
  EXPECT_NE(error_of("outbox = \"sqlite:x.db\"\nsink = \"kafka://h\"").find("sink: "), std::string::npos);
  EXPECT_NE(error_of("outbox = \"sqlite:x.db\"\nsink = \"http://h/x\"\nlease = \"5s\"").find("lease must be longer"),
            std::string::npos);
  const auto secret = error_of("outbox = \"postgres://u:hunter2hunter2@h/db\"\nsink = \"amqp://u:hunter2hunter2@h/?bogus=1\"");
  EXPECT_FALSE(secret.empty());
  EXPECT_EQ(secret.find("hunter2"), std::string::npos) << secret;
}

}  // namespace
}  // namespace idem::relay
