// The form-urlencoded canonicaliser (query strings and form bodies).
#include <string>
#include <string_view>

#include "check.hpp"
#include "idem/fingerprint.hpp"

namespace {
bool unreserved(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
         c == '_' || c == '~';
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const std::string canon = idem::canonical_form_urlencoded(input);
  FUZZ_CHECK(idem::canonical_form_urlencoded(canon) == canon, "canonicalising is idempotent");
  for (std::size_t i = 0; i < canon.size(); ++i) {
    const char c = canon[i];
    if (c == '%') {
      FUZZ_CHECK(i + 2 < canon.size(), "an escape has two digits");
      const auto hex = [](char h) { return (h >= '0' && h <= '9') || (h >= 'A' && h <= 'F'); };
      FUZZ_CHECK(hex(canon[i + 1]) && hex(canon[i + 2]), "escapes are uppercase hex");
      i += 2;
    } else {
      FUZZ_CHECK(unreserved(c) || c == '&' || c == '=', "only unreserved bytes stay literal");
    }
  }
  // Pair order never matters: the pairs reversed canonicalise the same.
  std::string reversed;
  std::string_view rest = input;
  while (true) {
    const auto amp = rest.rfind('&');
    const std::string_view pair = amp == std::string_view::npos ? rest : rest.substr(amp + 1);
    if (!reversed.empty()) reversed += '&';
    reversed += pair;
    if (amp == std::string_view::npos) break;
    rest = rest.substr(0, amp);
  }
  FUZZ_CHECK(idem::canonical_form_urlencoded(reversed) == canon, "pair order does not change the form");
  return 0;
}
