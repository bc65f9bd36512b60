#include "idem/redact.hpp"

#include <gtest/gtest.h>

namespace idem {
namespace {

TEST(RedactUrl, HidesTheUserinfoPassword) {
  EXPECT_EQ(redact_url("postgres://idem:s3cret@db:5432/idem"), "postgres://idem:***@db:5432/idem");
  EXPECT_EQ(redact_url("postgresql://idem:s3cret@db/idem"), "postgresql://idem:***@db/idem");
  EXPECT_EQ(redact_url("redis://app:s3cret@h:6379/2"), "redis://app:***@h:6379/2");
  EXPECT_EQ(redact_url("redis://:s3cret@h:6379"), "redis://:***@h:6379");
  EXPECT_EQ(redact_url("amqp://guest:s3cret@h:5672/%2f?queue=q"), "amqp://guest:***@h:5672/%2f?queue=q");
  // amqps://: the password goes, the TLS file paths (no secrets) stay, so the line says which.
  EXPECT_EQ(redact_url("amqps://idem:s3cret@h:5671/%2f?queue=q&cacertfile=%2Fetc%2Fca.pem&keyfile=/etc/k.pem"),
            "amqps://idem:***@h:5671/%2f?queue=q&cacertfile=%2Fetc%2Fca.pem&keyfile=/etc/k.pem");
  EXPECT_EQ(redact_url("redis+cluster://u:s3cret@a:1,b:2"), "redis+cluster://u:***@a:1,b:2");
  EXPECT_EQ(redact_url("http://hook:s3cret@h/receipts"), "http://hook:***@h/receipts");
}

TEST(RedactUrl, HidesKafkasSaslAndKeyPasswordsInTheQuery) {
  EXPECT_EQ(redact_url("kafka://b:9092/t?group=g&sasl_username=u&sasl_password=s3cret"),
            "kafka://b:9092/t?group=g&sasl_username=u&sasl_password=***");
  EXPECT_EQ(redact_url("kafka://b:9092/t?group=g&ssl_key_password=s3cret&client_id=c"),
            "kafka://b:9092/t?group=g&ssl_key_password=***&client_id=c");
}

TEST(RedactUrl, ALoneRedisUserinfoIsThePassword) {
  EXPECT_EQ(redact_url("redis://s3cret@h:6379"), "redis://***@h:6379");
  EXPECT_EQ(redact_url("redis+stream://s3cret@h:6379/s?group=g"), "redis+stream://***@h:6379/s?group=g");
  // For other schemes a lone userinfo is a user name: kept, it helps to read the error.
  EXPECT_EQ(redact_url("postgres://idem@db/idem"), "postgres://idem@db/idem");
}

TEST(RedactUrl, HidesPasswordsWithReservedAndEncodedCharacters) {
  EXPECT_EQ(redact_url("postgres://idem:p%40ss%2Fw%3Ad@db/idem"), "postgres://idem:***@db/idem");
  EXPECT_EQ(redact_url("redis://u:p@ss@h:1"), "redis://u:***@h:1");
  EXPECT_EQ(redact_url("postgres://idem:pa/ss?w@db/idem"), "postgres://idem:***@db/idem");
  EXPECT_EQ(redact_url("postgres://idem:pa:ss@db/idem"), "postgres://idem:***@db/idem");
}

TEST(RedactUrl, HidesSecretQueryParameters) {
  EXPECT_EQ(redact_url("postgres://db/idem?password=s3cret"), "postgres://db/idem?password=***");
  EXPECT_EQ(redact_url("postgres://db/idem?sslmode=disable&PassWord=s3cret&application_name=x"),
            "postgres://db/idem?sslmode=disable&PassWord=***&application_name=x");
  EXPECT_EQ(redact_url("postgres://db/idem?sslpassword=k1&user=u&pass%77ord=s3cret"),
            "postgres://db/idem?sslpassword=***&user=u&pass%77ord=***");
  EXPECT_EQ(redact_url("http://h/hook?token=abc&x=1"), "http://h/hook?token=***&x=1");
  EXPECT_EQ(redact_url("postgres://u:a@db/idem?password=b"), "postgres://u:***@db/idem?password=***");
}

TEST(RedactUrl, HidesLibpqKeywordValueForms) {
  EXPECT_EQ(redact_url("host=db user=idem password=s3cret dbname=idem"),
            "host=db user=idem password=*** dbname=idem");
  EXPECT_EQ(redact_url("host=db password = 'a b\\' c' dbname=idem"), "host=db password = *** dbname=idem");
}

TEST(RedactUrl, KeepsWhatHasNoSecret) {
  for (const char* url : {"memory:", "sqlite:./var/idem.db?synchronous=normal", "redis://h:6379",
                          "redis+cluster://a:1,b:2", "postgres://idem@127.0.0.1:5432/idem_test?sslmode=disable",
                          "amqp://h/?queue=payments", "", "http://h/path?a=b&c"}) {
    EXPECT_EQ(redact_url(url), url);
  }
}

TEST(RedactText, RedactsEveryUrlInFreeText) {
  EXPECT_EQ(redact_text("The following argument was not expected: postgres://u:s3cret@h/db"),
            "The following argument was not expected: postgres://u:***@h/db");
  EXPECT_EQ(redact_text("store=\"redis://:pw@h:1\" and (amqp://a:b@c/)"), "store=\"redis://:***@h:1\" and (amqp://a:***@c/)");
  EXPECT_EQ(redact_text("no urls here"), "no urls here");
}

TEST(ScrubSecrets, HidesTheUrlsSecretsInAMessageAsWrittenAndDecoded) {
  const std::string url = "postgres://idem:p%40ssw0rd@db/idem?sslpassword=k3y-file";
  EXPECT_EQ(scrub_secrets("invalid percent-encoded token: \"p%40ssw0rd\"", url), "invalid percent-encoded token: \"***\"");
  EXPECT_EQ(scrub_secrets("auth failed for p@ssw0rd and k3y-file", url), "auth failed for *** and ***");
  EXPECT_EQ(scrub_secrets("password authentication failed for user \"idem\"", url),
            "password authentication failed for user \"idem\"");
  EXPECT_EQ(scrub_secrets("nothing to hide", "redis://h:1"), "nothing to hide");
}

TEST(RedactUrl, NamesOfSecretParameters) {
  EXPECT_TRUE(is_secret_parameter("password"));
  EXPECT_TRUE(is_secret_parameter("PASSWORD"));
  EXPECT_TRUE(is_secret_parameter("%70assword"));
  EXPECT_TRUE(is_secret_parameter("api_key"));
  EXPECT_FALSE(is_secret_parameter("user"));
  EXPECT_FALSE(is_secret_parameter("passwords_allowed"));
}

}  // namespace
}  // namespace idem
