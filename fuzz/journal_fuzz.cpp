// The client journal's record decoder: the netstring blob its rows keep headers in (a journal
// file written by another version, or edited in the sqlite3 shell).
#include <string>
#include <string_view>

#include "check.hpp"
#include "netstring.hpp"

namespace cd = idem::client::detail;

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  auto headers = cd::decode_headers(text);
  if (!headers) return 0;
  std::size_t bytes = 0;
  for (const auto& h : *headers) bytes += h.name.size() + h.value.size();
  FUZZ_CHECK(bytes <= text.size(), "decoded headers are no larger than their blob");
  const std::string encoded = cd::encode_headers(*headers);
  auto again = cd::decode_headers(encoded);
  FUZZ_CHECK(again && *again == *headers, "decode(encode(h)) == h");
  // Leading zeros in lengths are the one thing encoding normalises.
  FUZZ_CHECK(encoded.size() <= text.size(), "the encoding is canonical and never longer");
  return 0;
}
