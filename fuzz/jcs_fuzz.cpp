// The RFC 8785 canonicaliser: canon(canon(x)) == canon(x), and on valid JSON the same value as
// nlohmann-json's parse of the input.
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "check.hpp"
#include "idem/jcs.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  auto canon = idem::canonicalize_json(input);
  const auto reference = nlohmann::json::parse(input, nullptr, /*allow_exceptions=*/false);
  if (!canon) {
    FUZZ_CHECK(canon.error().offset <= input.size(), "the error offset lies within the input");
    return 0;
  }
  // Whatever JCS accepts is RFC 8259 JSON, which nlohmann-json reads too.
  FUZZ_CHECK(!reference.is_discarded(), "JSON the canonicaliser accepted is JSON to nlohmann-json");
  auto twice = idem::canonicalize_json(*canon);
  FUZZ_CHECK(twice.has_value(), "a canonical form is valid JSON");
  FUZZ_CHECK(*twice == *canon, "canonicalising is idempotent");
  const auto reread = nlohmann::json::parse(*canon, nullptr, false);
  FUZZ_CHECK(!reread.is_discarded(), "nlohmann-json reads the canonical form");
  // Numbers: JCS keeps doubles, nlohmann integers where they fit; its == compares them as
  // doubles, which is what JCS promises to keep.
  FUZZ_CHECK(reread == reference, "the canonical form holds the input's value");
  return 0;
}
