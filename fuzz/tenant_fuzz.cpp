// Tenant derivation (SPEC §2, §12): from a header or from the Authorization credential.
#include <fuzzer/FuzzedDataProvider.h>

#include <string>
#include <vector>

#include "check.hpp"
#include "idem/key.hpp"
#include "idem/tenant.hpp"

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  FuzzedDataProvider in(data, size);
  idem::TenantRule rule;
  rule.source = in.PickValueInArray({idem::TenantRule::Source::none, idem::TenantRule::Source::header,
                                     idem::TenantRule::Source::authorization});
  const std::string& read = rule.source == idem::TenantRule::Source::authorization ? "Authorization" : rule.header;
  std::vector<std::string> names, values;
  const int count = in.ConsumeIntegralInRange(0, 4);
  for (int i = 0; i < count; ++i) {
    // Mostly the header the rule reads, in some case; sometimes another one.
    std::string name = in.ConsumeBool() ? read : in.ConsumeRandomLengthString(20);
    if (in.ConsumeBool()) {
      for (char& c : name) c = static_cast<char>(c >= 'a' && c <= 'z' ? c - 32 : c);
    }
    names.push_back(std::move(name));
    values.push_back(in.ConsumeRandomLengthString(300));
  }
  std::vector<idem::HeaderView> headers;
  int read_count = 0;
  std::string_view read_value;
  for (std::size_t i = 0; i < names.size(); ++i) {
    headers.push_back({names[i], values[i]});
    if (idem::iequals(names[i], read)) {
      ++read_count;
      read_value = values[i];
    }
  }

  auto tenant = idem::derive_tenant(rule, headers);
  if (rule.source == idem::TenantRule::Source::none) {
    FUZZ_CHECK(tenant && tenant->empty(), "no tenant rule: one shared scope");
    return 0;
  }
  if (read_count > 1) {
    FUZZ_CHECK(!tenant, "the tenant header twice is refused");
    return 0;
  }
  FUZZ_CHECK(tenant.has_value(), "one header or none always gives a tenant");
  if (read_count == 0 || read_value.empty()) {
    FUZZ_CHECK(tenant->empty(), "no header, or an empty one: the shared scope");
    return 0;
  }
  FUZZ_CHECK(tenant->size() <= 128 || tenant->starts_with("sha256:") || tenant->starts_with("auth:"),
             "a verbatim tenant is at most 128 characters");
  FUZZ_CHECK(idem::all_visible_ascii(*tenant), "a tenant is visible ASCII");
  if (rule.source == idem::TenantRule::Source::authorization) {
    FUZZ_CHECK(tenant->starts_with(idem::kCredentialTenantPrefix) && tenant->size() == 5 + 64,
               "a credential tenant is auth: + a SHA-256");
    FUZZ_CHECK(tenant->find(read_value) == std::string::npos || read_value.size() < 8,
               "the credential is never the tenant");
  } else if (*tenant != read_value) {
    FUZZ_CHECK(tenant->starts_with(idem::kHashedTenantPrefix) && tenant->size() == 7 + 64,
               "a value not used verbatim is hashed");
  } else {
    FUZZ_CHECK(!idem::has_reserved_tenant_prefix(*tenant), "no client names a derived namespace");
  }
  return 0;
}
