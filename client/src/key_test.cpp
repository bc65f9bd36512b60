#include "idem/client/key.hpp"

#include <gtest/gtest.h>

#include <set>

#include "idem/key.hpp"

namespace idem::client {
namespace {

TEST(NewKey, IsAVersion4UuidWithTheRfc4122Variant) {
  for (int i = 0; i < 1000; ++i) {
    const auto key = new_key();
    ASSERT_TRUE(key.has_value()) << key.error();
    ASSERT_EQ(key->size(), 36u);
    EXPECT_TRUE(is_uuid_v4(*key)) << *key;
    EXPECT_EQ((*key)[14], '4');
    EXPECT_NE(std::string("89ab").find((*key)[19]), std::string::npos) << *key;
    for (char c : *key) EXPECT_FALSE(c >= 'A' && c <= 'F') << "lowercase hex: " << *key;
  }
}

TEST(NewKey, IsUnique) {
  std::set<std::string> seen;
  for (int i = 0; i < 10000; ++i) seen.insert(new_key().value());
  EXPECT_EQ(seen.size(), 10000u);
}

TEST(NewKey, IsAcceptedByTheServersKeyParser) {
  const std::string key = new_key().value();
  const std::string_view values[] = {key};
  EXPECT_EQ(parse_key(values).value_or(""), key);
}

TEST(NewKey, SetsEveryRandomBitSomewhere) {
  // 122 random bits: across many keys every hex digit outside the fixed nibbles varies.
  std::set<char> digits_at_0;
  for (int i = 0; i < 500; ++i) digits_at_0.insert(new_key().value()[0]);
  EXPECT_EQ(digits_at_0.size(), 16u);
}

TEST(IsUuidV4, RejectsOtherShapes) {
  EXPECT_TRUE(is_uuid_v4("8e03978e-40d5-43e8-bc93-6894a57f9324"));
  EXPECT_TRUE(is_uuid_v4("8E03978E-40D5-43E8-BC93-6894A57F9324"));
  EXPECT_FALSE(is_uuid_v4("8e03978e-40d5-13e8-bc93-6894a57f9324"));  // version 1
  EXPECT_FALSE(is_uuid_v4("8e03978e-40d5-43e8-7c93-6894a57f9324"));  // NCS variant
  EXPECT_FALSE(is_uuid_v4("8e03978e40d543e8bc936894a57f9324"));
  EXPECT_FALSE(is_uuid_v4("8e03978e-40d5-43e8-bc93-6894a57f932g"));
  EXPECT_FALSE(is_uuid_v4(""));
}

}  // namespace
}  // namespace idem::client
