#include "idem/tenant.hpp"

#include <algorithm>

#include "idem/fingerprint.hpp"

namespace idem {
namespace {

constexpr std::size_t kMaxVerbatimTenant = 128;

bool is_safe_identifier(std::string_view s) {
  return !s.empty() && s.size() <= kMaxVerbatimTenant &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= 0x21 && c <= 0x7e; });
}

}  // namespace

std::string derive_tenant(const TenantRule& rule, std::span<const HeaderView> headers) {
  switch (rule.source) {
    case TenantRule::Source::none:
      return {};
    case TenantRule::Source::header: {
      const std::string_view value = find_header(headers, rule.header);
      if (value.empty()) return {};
      if (is_safe_identifier(value)) return std::string(value);
      return "sha256:" + sha256_hex(value);
    }
    case TenantRule::Source::authorization: {
      // The credential itself is never stored or logged: only its hash scopes the keys.
      const std::string_view value = find_header(headers, "Authorization");
      if (value.empty()) return {};
      return "auth:" + sha256_hex(value);
    }
  }
  return {};
}

}  // namespace idem
