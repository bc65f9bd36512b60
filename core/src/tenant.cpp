#include "idem/tenant.hpp"

#include <optional>
#include <string_view>

#include "idem/fingerprint.hpp"
#include "idem/key.hpp"

namespace idem {
namespace {

constexpr std::size_t kMaxVerbatimTenant = 128;

bool is_safe_identifier(std::string_view s) {
  return !s.empty() && s.size() <= kMaxVerbatimTenant && all_visible_ascii(s) && !has_reserved_tenant_prefix(s);
}

bool starts_with_icase(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && iequals(s.substr(0, prefix.size()), prefix);
}

// The value of the one header `name`; "" when absent; nullopt when it appears more than once.
std::optional<std::string_view> single_header(std::span<const HeaderView> headers, std::string_view name) {
  std::optional<std::string_view> found;
  for (const auto& h : headers) {
    if (!iequals(h.name, name)) continue;
    if (found) return std::nullopt;
    found = h.value;
  }
  return found.value_or(std::string_view());
}

std::unexpected<std::string> repeated(std::string_view name) {
  return std::unexpected("the " + std::string(name) + " header, which names the tenant, appears more than once");
}

}  // namespace

bool has_reserved_tenant_prefix(std::string_view value) {
  return starts_with_icase(value, kCredentialTenantPrefix) || starts_with_icase(value, kClaimsTenantPrefix) ||
         starts_with_icase(value, kHashedTenantPrefix) || starts_with_icase(value, kCertificateTenantPrefix);
}

std::string certificate_tenant(std::string_view identity) {
  if (!identity.empty() && identity.size() <= kMaxVerbatimTenant && all_visible_ascii(identity) &&
      !starts_with_icase(identity, kHashedTenantPrefix)) {
    return std::string(kCertificateTenantPrefix).append(identity);
  }
  return std::string(kCertificateTenantPrefix).append(kHashedTenantPrefix).append(sha256_hex(identity));
}

std::string claims_tenant(std::string_view canonical_claims) {
  return std::string(kClaimsTenantPrefix) + sha256_hex(canonical_claims);
}

std::expected<std::string, std::string> derive_tenant(const TenantRule& rule, std::span<const HeaderView> headers) {
  switch (rule.source) {
    case TenantRule::Source::none:
      return std::string();
    case TenantRule::Source::header: {
      const auto value = single_header(headers, rule.header);
      if (!value) return repeated(rule.header);
      if (value->empty()) return std::string();
      if (is_safe_identifier(*value)) return std::string(*value);
      // Also where a client names a derived namespace ("auth:...", "jwt:..."): hashed, its value
      // lands in the header namespace's own hashed part, never in another's.
      return std::string(kHashedTenantPrefix) + sha256_hex(*value);
    }
    case TenantRule::Source::authorization: {
      // The credential itself is never stored or logged: only its hash scopes the keys.
      const auto value = single_header(headers, "Authorization");
      if (!value) return repeated("Authorization");
      if (value->empty()) return std::string();
      return std::string(kCredentialTenantPrefix) + sha256_hex(*value);
    }
  }
  return std::string();
}

}  // namespace idem
