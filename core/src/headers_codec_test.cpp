#include "idem/headers_codec.hpp"

#include <gtest/gtest.h>

#include <string>

namespace idem {
namespace {

std::string bytes(std::initializer_list<int> values) {
  std::string s;
  for (int v : values) s.push_back(static_cast<char>(v));
  return s;
}

TEST(HeadersCodec, EmptyListRoundTrips) {
  const std::string blob = encode_headers({});
  EXPECT_EQ(blob, bytes({0x01, 0x00}));
  auto decoded = decode_headers(blob);
  ASSERT_TRUE(decoded);
  EXPECT_TRUE(decoded->empty());
}

TEST(HeadersCodec, AnyBytesOrderAndRepeatsRoundTrip) {
  std::string every_byte;
  for (int b = 0; b < 256; ++b) every_byte.push_back(static_cast<char>(b));
  const Headers headers{
      {"Set-Cookie", "a=1"},
      {"Set-Cookie", "b=2"},
      {"", ""},
      {std::string("nul\0name", 8), std::string("\r\nInjected: yes\r\n", 17)},
      {"X-Bytes", every_byte},
      {"X-Latin1", "\xe9t\xe9"},
      {"X-Long", std::string(200'000, 'x')},  // lengths above one varint byte
  };
  auto decoded = decode_headers(encode_headers(headers));
  ASSERT_TRUE(decoded);
  EXPECT_EQ(*decoded, headers);
}

TEST(HeadersCodec, ManyHeadersRoundTrip) {
  Headers headers;
  for (int i = 0; i < 1000; ++i)
    headers.push_back({"X-H" + std::to_string(i), std::string(static_cast<std::size_t>(i), 'v')});
  EXPECT_EQ(decode_headers(encode_headers(headers)), headers);
}

TEST(HeadersCodec, RejectsMalformedBlobs) {
  const std::string good = encode_headers({{"Name", "Value"}});
  EXPECT_FALSE(decode_headers(""));
  EXPECT_FALSE(decode_headers(bytes({0x02, 0x00})));  // unknown version
  EXPECT_FALSE(decode_headers(good + "x"));           // trailing bytes
  for (std::size_t cut = 0; cut < good.size(); ++cut) {
    EXPECT_FALSE(decode_headers(good.substr(0, cut))) << "truncated at " << cut;
  }
  // A count far larger than the bytes that follow must not make the decoder reserve memory.
  EXPECT_FALSE(decode_headers(bytes({0x01, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f})));
  // A length that runs past the end.
  EXPECT_FALSE(decode_headers(bytes({0x01, 0x01, 0x05, 'a', 'b', 0x00})));
  // A varint longer than 64 bits.
  EXPECT_FALSE(decode_headers(bytes({0x01, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01})));
}

}  // namespace
}  // namespace idem
