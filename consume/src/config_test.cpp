#include "config.hpp"

#include <gtest/gtest.h>

namespace idem::consume {
namespace {

std::string error_of(std::string_view toml, const Flags& flags = {}) {
  try {
    parse(toml, flags);
  } catch (const sidecar::ConfigError& e) {
    return e.what();
  }
  return "";
}

Flags flags(std::vector<std::pair<std::string, std::string>> settings) { return Flags{std::nullopt, std::move(settings)}; }

TEST(ConsumeConfig, DefaultsAndTheNameFromTheSource) {
  const Config c = parse("", flags({{"source", "amqp://guest:guest@127.0.0.1:5672/%2f?queue=receipts"},
                                    {"deliver", "http://127.0.0.1:9000/events"}}));
  EXPECT_EQ(c.name, "receipts");
  EXPECT_EQ(c.store, "sqlite:./var/consume.db");
  EXPECT_EQ(c.workers, 8u);
  EXPECT_EQ(c.prefetch, 64u);
  EXPECT_EQ(c.max_attempts, 5u);
  EXPECT_EQ(c.on_lease_expiry, LeaseExpiry::reexecute);
  EXPECT_EQ(c.ordering, ConsumeOrdering::none);
  EXPECT_TRUE(c.hold_after_dead_letter);
  ASSERT_TRUE(c.admin_listen);
  EXPECT_EQ(c.admin_listen->port, 9101);
  const Config s = parse("", flags({{"source", "redis+stream://127.0.0.1:6379/events?group=mailer"},
                                    {"deliver", "http://h/x"}}));
  EXPECT_EQ(s.name, "events/mailer");
}

TEST(ConsumeConfig, FlagsOverTheFile) {
  const Config c = parse(
      "source = \"redis+stream://127.0.0.1:6379/s?group=g\"\ndeliver = \"http://h/x\"\nworkers = 2\n"
      "on_lease_expiry = \"unknown\"\nname = \"mailer\"\nlease = \"10m\"\nhandler_timeout = \"5s\"\n"
      "dead_letters = \"pass\"\n",
      flags({{"workers", "4"}, {"admin_listen", "off"}, {"ordering", "key"}}));
  EXPECT_EQ(c.workers, 4u);
  EXPECT_EQ(c.ordering, ConsumeOrdering::key);
  EXPECT_FALSE(c.hold_after_dead_letter);
  EXPECT_EQ(c.on_lease_expiry, LeaseExpiry::unknown);
  EXPECT_EQ(c.name, "mailer");
  EXPECT_FALSE(c.admin_listen);
}

TEST(ConsumeConfig, SignSecretFiles) {
  const auto base = flags({{"source", "amqp://h/?queue=q"}, {"deliver", "http://h/x"}});
  EXPECT_TRUE(parse("", base).sign_secret_file.empty());
  EXPECT_EQ(parse("sign_secret_file = \"/etc/idem/consume.secret\"\n", base).sign_secret_file,
            (std::vector<std::string>{"/etc/idem/consume.secret"}));
  EXPECT_EQ(parse("", flags({{"source", "amqp://h/?queue=q"}, {"deliver", "http://h/x"},
                             {"sign_secret_file", "/run/old,/run/new"}}))
                .sign_secret_file,
            (std::vector<std::string>{"/run/old", "/run/new"}));
}

TEST(ConsumeConfig, HandlerTlsFiles) {
  const Config c = parse("handler_ca_file = \"/etc/idem/ca.pem\"\nhandler_cert_file = \"/etc/idem/consume.pem\"\n",
                         flags({{"source", "amqp://h/?queue=q"}, {"deliver", "https://h/x"},
                                {"handler_key_file", "/etc/idem/consume.key"},
                                {"handler_key_passphrase_file", "/etc/idem/consume.pass"}}));
  EXPECT_EQ(c.handler_ca_file, "/etc/idem/ca.pem");
  EXPECT_EQ(c.handler_cert_file, "/etc/idem/consume.pem");
  EXPECT_EQ(c.handler_key_file, "/etc/idem/consume.key");
  EXPECT_EQ(c.handler_key_passphrase_file, "/etc/idem/consume.pass");
  // Files for a plain handler, half a pair, a passphrase without a key: one clear line each.
  EXPECT_NE(error_of("source = \"amqp://h/?queue=q\"\ndeliver = \"http://h/x\"\nhandler_ca_file = \"/ca\"")
                .find("handler_ca_file: only an https:// handler"),
            std::string::npos);
  EXPECT_NE(error_of("source = \"amqp://h/?queue=q\"\ndeliver = \"https://h/x\"\nhandler_cert_file = \"/c\"")
                .find("give both or neither"),
            std::string::npos);
  EXPECT_NE(error_of("source = \"amqp://h/?queue=q\"\ndeliver = \"https://h/x\"\nhandler_key_passphrase_file = \"/p\"")
                .find("only with handler_key_file"),
            std::string::npos);
}

TEST(ConsumeConfig, BadSettingsAreOneClearLine) {
  EXPECT_NE(error_of("deliver = \"http://h/x\"").find("no source"), std::string::npos);
  EXPECT_NE(error_of("source = \"amqp://h/?queue=q\"").find("no handler"), std::string::npos);
  EXPECT_NE(error_of("source = \"kafka://h\"\ndeliver = \"http://h/x\"").find("source: "), std::string::npos);
  EXPECT_NE(error_of("source = \"amqp://h/?queue=q\"\ndeliver = \"ftp://h/x\"").find("deliver: expected an http://"),
            std::string::npos);
  EXPECT_NE(error_of("source = \"amqp://h/?queue=q\"\ndeliver = \"http://h/x\"\nlease = \"10s\"\nhandler_timeout = \"30s\"")
                .find("lease (10s) must be longer than handler_timeout (30s)"),
            std::string::npos);
  EXPECT_NE(error_of("source = \"amqp://h/?queue=q\"\ndeliver = \"http://h/x\"\nname = \"has space\"").find("name: "),
            std::string::npos);
  EXPECT_NE(error_of("source = \"amqp://h/?queue=q\"\ndeliver = \"http://h/x\"\nprefetch = 0").find("prefetch: 0 is outside"),
            std::string::npos);
}

TEST(ConsumeConfig, ErrorsNeverEchoAPassword) {
  for (const char* source : {"amqp://idem:hunter2hunter2@h:5672/%2f", "redis+stream://:hunter2hunter2@h:1/s",
                                    "amqp://idem:hunter2hunter2@h:5672/%2f?queue=q&bogus=1",
                                    "kafka://idem:hunter2hunter2@h:9092/t?group=g&bogus=1",
                                    "kafka://h:9092/t?group=g&sasl_username=u&sasl_password=hunter2hunter2&bogus=1"}) {
    const auto message = error_of("", flags({{"source", source}, {"deliver", "http://u:hunter2hunter2@h/x"}}));
    EXPECT_FALSE(message.empty());
    EXPECT_EQ(message.find("hunter2"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace idem::consume
