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

TEST(RelayConfig, WebhookSecretFilesSignOnlyAWebhookSink) {
  EXPECT_TRUE(parse("outbox = \"sqlite:x.db\"\nsink = \"http://h/x\"\n", {}).webhook_secret_file.empty());
  const Config c = parse(
      "outbox = \"sqlite:x.db\"\nsink = \"http://h/x\"\nwebhook_secret_file = [\"/etc/idem/old\", \"/etc/idem/new\"]\n", {});
  EXPECT_EQ(c.webhook_secret_file, (std::vector<std::string>{"/etc/idem/old", "/etc/idem/new"}));
  EXPECT_NE(error_of("outbox = \"sqlite:x.db\"\nsink = \"redis+stream://h:6379/s\"\nwebhook_secret_file = \"/s\"\n")
                .find("only a webhook sink"),
            std::string::npos);
}

TEST(RelayConfig, WebhookTlsFilesOnlyForAnHttpsWebhook) {
  const Config c = parse(
      "outbox = \"sqlite:x.db\"\nsink = \"https://h/x\"\nwebhook_ca_file = \"/etc/idem/ca.pem\"\n"
      "webhook_cert_file = \"/etc/idem/relay.pem\"\nwebhook_key_file = \"/etc/idem/relay.key\"\n"
      "webhook_key_passphrase_file = \"/etc/idem/relay.pass\"\n",
      {});
  EXPECT_EQ(c.webhook_ca_file, "/etc/idem/ca.pem");
  EXPECT_EQ(c.webhook_cert_file, "/etc/idem/relay.pem");
  EXPECT_EQ(c.webhook_key_file, "/etc/idem/relay.key");
  EXPECT_EQ(c.webhook_key_passphrase_file, "/etc/idem/relay.pass");
  EXPECT_NE(error_of("outbox = \"sqlite:x.db\"\nsink = \"http://h/x\"\nwebhook_ca_file = \"/ca\"\n")
                .find("webhook_ca_file: only an https:// webhook sink"),
            std::string::npos);
  EXPECT_NE(error_of("outbox = \"sqlite:x.db\"\nsink = \"amqp://h/?exchange=e\"\nwebhook_cert_file = \"/c\"\n")
                .find("webhook_cert_file: only an https:// webhook sink"),
            std::string::npos);
  EXPECT_NE(error_of("outbox = \"sqlite:x.db\"\nsink = \"https://h/x\"\nwebhook_key_file = \"/k\"\n")
                .find("give both or neither"),
            std::string::npos);
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
