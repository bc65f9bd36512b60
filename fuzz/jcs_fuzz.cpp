// The RFC 8785 canonicaliser: canon(canon(x)) == canon(x), and on valid JSON the same value as
// nlohmann-json's parse of the input.
#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

#include "check.hpp"
#include "idem/jcs.hpp"

namespace {

// Equal as JSON values with every number an IEEE double, as RFC 8785 reads them: JCS writes a
// number as the double nearest to it, so an integer beyond 2^53 (1234567890145678912) becomes
// 1234567890145678800 (found by this target), which nlohmann-json reads back as another exact
// integer; compared as doubles both are the same value.
bool same_value(const nlohmann::json& a, const nlohmann::json& b) {
  if (a.is_number() && b.is_number()) return a.get<double>() == b.get<double>();
  if (a.type() != b.type()) return false;
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (std::size_t i = 0; i < a.size(); ++i) {
      if (!same_value(a[i], b[i])) return false;
    }
    return true;
  }
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (auto it = a.begin(); it != a.end(); ++it) {
      const auto other = b.find(it.key());
      if (other == b.end() || !same_value(*it, *other)) return false;
    }
    return true;
  }
  return a == b;
}

}  // namespace

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
  // Numbers: JCS keeps doubles, nlohmann integers where they fit: compared as doubles, which is
  // what JCS promises to keep.
  FUZZ_CHECK(same_value(reread, reference), "the canonical form holds the input's value");
  return 0;
}
