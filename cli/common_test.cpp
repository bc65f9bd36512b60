#include "common.hpp"

#include <gtest/gtest.h>

#include <chrono>

namespace idem::cli {
namespace {

using namespace std::chrono_literals;

TEST(ParseDuration, ReadsTheGatewayForms) {
  EXPECT_EQ(parse_duration("1500ms"), Millis{1500});
  EXPECT_EQ(parse_duration("30s"), Millis{30s});
  EXPECT_EQ(parse_duration("5m"), Millis{5min});
  EXPECT_EQ(parse_duration("24h"), Millis{24h});
  EXPECT_EQ(parse_duration("7d"), Millis{168h});
  EXPECT_EQ(parse_duration("1h30m"), Millis{90min});
  EXPECT_EQ(parse_duration("0s"), Millis{0});
}

TEST(ParseDuration, RefusesTheRest) {
  for (const char* bad : {"", "30", "1.5s", "s", "-1s", "10x", "1h 30m", "99999999999999999999d"}) {
    EXPECT_FALSE(parse_duration(bad)) << bad;
  }
}

TEST(FormatDuration, IsShortest) {
  EXPECT_EQ(format_duration(Millis{1500}), "1500ms");
  EXPECT_EQ(format_duration(Millis{30s}), "30s");
  EXPECT_EQ(format_duration(Millis{24h}), "1d");
  EXPECT_EQ(format_duration(Millis{90min}), "90m");
}

TEST(FormatTime, IsIsoUtcWithMilliseconds) {
  EXPECT_EQ(format_time(from_epoch_ms(0)), "1970-01-01T00:00:00.000Z");
  EXPECT_EQ(format_time(from_epoch_ms(1'767'225'600'123)), "2026-01-01T00:00:00.123Z");
  EXPECT_EQ(format_time(from_epoch_ms(-1)), "1969-12-31T23:59:59.999Z");
}

TEST(ParseHeaderLine, SplitsAndTrims) {
  EXPECT_EQ(parse_header_line("Content-Type:  application/json "), (Header{"Content-Type", "application/json"}));
  EXPECT_EQ(parse_header_line("X-Empty:"), (Header{"X-Empty", ""}));
  EXPECT_FALSE(parse_header_line("no colon"));
  EXPECT_FALSE(parse_header_line(": value"));
  EXPECT_FALSE(parse_header_line("Bad Name: v"));
  EXPECT_FALSE(parse_header_line("X-A: a\r\nX-B: b"));
}

TEST(Base64, Rfc4648Vectors) {
  EXPECT_EQ(base64(""), "");
  EXPECT_EQ(base64("f"), "Zg==");
  EXPECT_EQ(base64("fo"), "Zm8=");
  EXPECT_EQ(base64("foo"), "Zm9v");
  EXPECT_EQ(base64("foobar"), "Zm9vYmFy");
  EXPECT_EQ(base64(std::string("\xff\x00\x80", 3)), "/wCA");
}

TEST(Quoting, ShellAndJson) {
  EXPECT_EQ(shell_quote("it's"), "'it'\\''s'");
  EXPECT_EQ(shell_quote(""), "''");
  EXPECT_EQ(json_quoted("a\"b\n"), "\"a\\\"b\\n\"");
}

TEST(ReadDataArgument, LiteralAndMissingFile) {
  std::string why;
  EXPECT_EQ(read_data_argument("{\"a\":1}", why), "{\"a\":1}");
  EXPECT_FALSE(read_data_argument("@/nonexistent/idemctl-test", why));
  EXPECT_NE(why.find("/nonexistent/idemctl-test"), std::string::npos);
}

}  // namespace
}  // namespace idem::cli
