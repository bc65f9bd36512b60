#include "idem/key.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace idem {
namespace {

std::expected<std::string, KeyError> parse_one(std::string_view value, KeyRules rules = {}) {
  std::vector<std::string_view> values{value};
  return parse_key(values, rules);
}

void expect_invalid(std::string_view value, KeyRules rules = {}) {
  auto r = parse_one(value, rules);
  ASSERT_FALSE(r.has_value()) << "accepted: [" << value << "]";
  EXPECT_EQ(r.error().code, KeyErrc::invalid) << value;
  EXPECT_FALSE(r.error().detail.empty());
}

const std::string kUuid = "5d2c3a8e-1f0b-4f9c-9e1a-c5b8d7e2f1a3";

TEST(ParseKey, AcceptsTheBareFormStripeClientsSend) {
  EXPECT_EQ(parse_one(kUuid).value(), kUuid);
}

TEST(ParseKey, AcceptsAStructuredFieldString) {
  EXPECT_EQ(parse_one("\"" + kUuid + "\"").value(), kUuid);
}

TEST(ParseKey, UnescapesQuoteAndBackslash) {
  EXPECT_EQ(parse_one(R"("abc\"def\\ghi-0123456")").value(), R"(abc"def\ghi-0123456)");
}

TEST(ParseKey, TrimsOptionalWhitespaceAroundTheValue) {
  EXPECT_EQ(parse_one(" \t" + kUuid + " ").value(), kUuid);
  EXPECT_EQ(parse_one("  \"" + kUuid + "\"\t").value(), kUuid);
}

TEST(ParseKey, AcceptsEveryVisibleAsciiCharacterInTheBareForm) {
  std::string all;
  for (char c = 0x21; c <= 0x7e; ++c) {
    if (c != ',') all.push_back(c);
  }
  EXPECT_EQ(parse_one(all).value(), all);
}

TEST(ParseKey, LengthBoundsAreInclusive) {
  EXPECT_TRUE(parse_one(std::string(16, 'a')).has_value());
  EXPECT_TRUE(parse_one(std::string(256, 'a')).has_value());
  expect_invalid(std::string(15, 'a'));
  expect_invalid(std::string(257, 'a'));
}

TEST(ParseKey, LengthIsMeasuredAfterUnquoting) {
  // 16 characters between the quotes, two of them escapes: 14 characters of key.
  expect_invalid(R"("abcdefghijkl\"\\")");
  EXPECT_TRUE(parse_one(R"("abcdefghijklmn\"\\")").has_value());
}

TEST(ParseKey, BoundsAreConfigurable) {
  KeyRules rules{4, 8};
  EXPECT_TRUE(parse_one("abcd", rules).has_value());
  EXPECT_TRUE(parse_one("abcdefgh", rules).has_value());
  expect_invalid("abc", rules);
  expect_invalid("abcdefghi", rules);
}

TEST(ParseKey, MissingHeaderIsMissing) {
  auto r = parse_key({}, {});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, KeyErrc::missing);
}

TEST(ParseKey, RejectsEmptyValues) {
  expect_invalid("");
  expect_invalid("   ");
  expect_invalid("\"\"");
}

TEST(ParseKey, RejectsTheHeaderTwice) {
  std::vector<std::string_view> values{kUuid, kUuid};
  auto r = parse_key(values, {});
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, KeyErrc::invalid);
}

TEST(ParseKey, RejectsLists) {
  expect_invalid(kUuid + "," + kUuid);
  expect_invalid(kUuid + ", " + kUuid);
  expect_invalid("\"" + kUuid + "\", \"" + kUuid + "\"");
}

TEST(ParseKey, RejectsParametersAfterTheString) {
  expect_invalid("\"" + kUuid + "\";a=1");
}

TEST(ParseKey, RejectsSpacesInside) {
  expect_invalid("abcdefgh ijklmnopq");
  expect_invalid("\"abcdefgh ijklmnopq\"");
}

TEST(ParseKey, RejectsControlCharacters) {
  expect_invalid(std::string("abcdefgh\x01ijklmnopq"));
  expect_invalid(std::string("abcdefgh\tijklmnopq"));
  expect_invalid(std::string("abcdefgh\x7fijklmnopq"));
  expect_invalid(std::string("\"abcdefgh\x7fijklmnopq\""));
  expect_invalid(std::string("abcdefghijklmnopq\0", 18));
}

TEST(ParseKey, RejectsNonAscii) {
  expect_invalid("abcdefgh\xc3\xa9ijklmnopq");
  expect_invalid("\"abcdefgh\xc3\xa9ijklmnopq\"");
}

TEST(ParseKey, RejectsBadQuotedStrings) {
  expect_invalid("\"" + kUuid);                 // no closing quote
  expect_invalid("\"" + kUuid + "\\n\"");       // escape other than \" and \\ .
  expect_invalid("\"" + kUuid + "\\");          // dangling backslash
  expect_invalid("\"" + kUuid + "\"extra");     // text after the string
}

}  // namespace
}  // namespace idem
