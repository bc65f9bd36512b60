// The Idempotency-Key parser (SPEC §2): one or two header values, SF-string or bare.
#include <fuzzer/FuzzedDataProvider.h>

#include <string>
#include <string_view>
#include <vector>

#include "check.hpp"
#include "idem/key.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  idem::KeyRules rules;
  rules.min_length = in.ConsumeIntegralInRange<std::size_t>(0, 32);
  rules.max_length = in.ConsumeIntegralInRange<std::size_t>(rules.min_length, 300);
  const bool twice = in.ConsumeBool();
  std::vector<std::string> values;
  values.push_back(in.ConsumeRandomLengthString(600));
  if (twice) values.push_back(in.ConsumeRemainingBytesAsString());
  const std::vector<std::string_view> views(values.begin(), values.end());

  auto key = idem::parse_key(views, rules);
  if (!key) {
    FUZZ_CHECK(!key.error().detail.empty(), "a refusal says why");
    return 0;
  }
  FUZZ_CHECK(views.size() == 1, "a repeated key header is refused");
  FUZZ_CHECK(key->size() >= rules.min_length && key->size() <= rules.max_length, "key within bounds");
  FUZZ_CHECK(idem::all_visible_ascii(*key), "key is visible ASCII");
  FUZZ_CHECK(key->find(',') == std::string::npos || views[0].front() == '"', "a bare key is no list");

  // Both forms of the key it accepted read back as the same key.
  std::string quoted = "\"";
  for (char c : *key) {
    if (c == '"' || c == '\\') quoted += '\\';
    quoted += c;
  }
  quoted += '"';
  const std::string_view q = quoted;
  auto again = idem::parse_key(std::span<const std::string_view>(&q, 1), rules);
  FUZZ_CHECK(again && *again == *key, "the SF-string form of an accepted key parses to it");
  if (key->front() != '"' && key->find(',') == std::string::npos) {
    const std::string_view bare = *key;
    auto b = idem::parse_key(std::span<const std::string_view>(&bare, 1), rules);
    FUZZ_CHECK(b && *b == *key, "the bare form of an accepted key parses to it");
  }
  return 0;
}
