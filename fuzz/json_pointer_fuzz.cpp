// JSON-pointer fingerprint options (json_ignore): the fingerprint of a body with a pointer left
// out is the fingerprint of the body without that member.
#include <fuzzer/FuzzedDataProvider.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "check.hpp"
#include "idem/fingerprint.hpp"
#include "idem/jcs.hpp"

namespace {

std::string fingerprint_of(const std::string& body, const std::vector<std::string>& ignore) {
  const idem::HeaderView headers[] = {{"Content-Type", "application/json"}};
  idem::RequestView view;
  view.method = "POST";
  view.path = "/p";
  view.headers = headers;
  view.body = body;
  idem::FingerprintOptions options;
  options.json_ignore = ignore;
  return idem::fingerprint(view, options);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  std::vector<std::string> pointers;
  const int count = in.ConsumeIntegralInRange(0, 3);
  for (int i = 0; i < count; ++i) pointers.push_back(in.ConsumeRandomLengthString(40));
  const std::string body = in.ConsumeRemainingBytesAsString();

  const std::string with = fingerprint_of(body, pointers);
  FUZZ_CHECK(with.size() == 64, "a fingerprint is a hex SHA-256");
  FUZZ_CHECK(fingerprint_of(body, pointers) == with, "the fingerprint is deterministic");

  auto canon = idem::canonicalize_json(body, pointers);
  if (!canon) {
    // Invalid JSON is hashed raw: the pointers cannot matter.
    FUZZ_CHECK(with == fingerprint_of(body, {}), "pointers do not change a raw body's fingerprint");
    return 0;
  }
  auto again = idem::canonicalize_json(*canon);
  FUZZ_CHECK(again && *again == *canon, "what is left is canonical JSON");

  // The reference: nlohmann-json erasing the one pointer, when there is one and it resolves to
  // an object member (erasing array elements one by one would shift later indices).
  if (pointers.size() != 1 || pointers[0].empty()) return 0;
  auto doc = nlohmann::json::parse(body, nullptr, false);
  if (doc.is_discarded()) return 0;
  nlohmann::json::json_pointer ptr;
  try {
    ptr = nlohmann::json::json_pointer(pointers[0]);
  } catch (const nlohmann::json::exception&) {
    return 0;  // malformed: JCS ignores it
  }
  if (!doc.contains(ptr)) {
    auto whole = idem::canonicalize_json(body);
    FUZZ_CHECK(whole && *whole == *canon, "a pointer that matches nothing changes nothing");
    return 0;
  }
  const auto parent_ptr = ptr.parent_pointer();
  auto& parent = doc.at(parent_ptr);
  if (!parent.is_object()) return 0;
  parent.erase(ptr.back());
  const std::string erased = doc.dump();
  auto expected = idem::canonicalize_json(erased);
  FUZZ_CHECK(expected && *expected == *canon, "leaving a member out is erasing it");
  FUZZ_CHECK(fingerprint_of(erased, {}) == with, "the fingerprint ignores the member");
  return 0;
}
