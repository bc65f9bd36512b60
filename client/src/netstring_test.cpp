#include "netstring.hpp"

#include <gtest/gtest.h>

namespace idem::client::detail {
namespace {

TEST(HeadersCodec, RoundTripsAnyBytesInOrder) {
  const Headers headers{{"Content-Type", "application/json"},
                        {"X-Empty", ""},
                        {"X-Repeat", "1"},
                        {"X-Repeat", "2"},
                        {"X-Bytes", std::string("a\0b\r\n,:\xff", 8)}};
  const std::string encoded = encode_headers(headers);
  EXPECT_TRUE(encoded.starts_with("12:Content-Type,16:application/json,"));
  EXPECT_EQ(decode_headers(encoded), headers);
  EXPECT_EQ(decode_headers(""), Headers{});
}

TEST(HeadersCodec, RejectsMalformedText) {
  EXPECT_FALSE(decode_headers("3:abc,"));          // a name without a value
  EXPECT_FALSE(decode_headers("3:abc,4:de,"));     // short
  EXPECT_FALSE(decode_headers("3:abc;1:x,"));      // missing comma
  EXPECT_FALSE(decode_headers(":abc,1:x,"));       // no length
  EXPECT_FALSE(decode_headers("99999999999:a,"));  // absurd length
  EXPECT_FALSE(decode_headers("3:abc,1:x,junk"));
}

}  // namespace
}  // namespace idem::client::detail
