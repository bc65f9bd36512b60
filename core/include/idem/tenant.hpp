#pragma once

#include <expected>
#include <span>
#include <string>
#include <string_view>

#include "idem/http_view.hpp"

namespace idem {

/// Where a request's tenant comes from (SPEC §2). Keys are scoped by tenant.
struct TenantRule {
  enum class Source { none, header, authorization };
  Source source = Source::none;
  /// For Source::header: the header naming the tenant.
  std::string header = "X-Tenant-Id";
};

// Tenant namespaces (SPEC §12: tenants from headers, credential hashes and token claims never
// share one). Every tenant idem derives itself starts with one of these prefixes; a header value
// that starts with one (in any case) is hashed like an unsafe value, so no client of a header-
// scoped route can name a derived tenant. Message consumers' tenants are "consumer NAME": the
// space keeps them out of every namespace below. A new derived namespace adds its prefix here.

/// Tenants of `from = "authorization"`: "auth:" + hex SHA-256 of the whole header value.
inline constexpr std::string_view kCredentialTenantPrefix = "auth:";
/// Tenants of verified token claims (`from = "jwt"`): "jwt:" + hex SHA-256 of the claims.
inline constexpr std::string_view kClaimsTenantPrefix = "jwt:";
/// Header values that cannot be used verbatim: "sha256:" + hex SHA-256 of the value.
inline constexpr std::string_view kHashedTenantPrefix = "sha256:";
/// Tenants of verified client certificates (`from = "client_cert"`): "cert:" + the identity.
inline constexpr std::string_view kCertificateTenantPrefix = "cert:";

/// Whether `value` starts with a derived namespace's prefix (ASCII case-insensitively, so that
/// a store comparing case-insensitively could not be fooled either).
bool has_reserved_tenant_prefix(std::string_view value);

/// The tenant of verified token claims: "jwt:" + lowercase hex SHA-256 of `canonical_claims`,
/// the RFC 8785 form of a JSON object holding the claims that scope keys, e.g.
/// {"iss":"https://auth.example","sub":"user-1"}. An operator can recompute it:
/// printf '%s' '{"sub":"user-1"}' | sha256sum.
std::string claims_tenant(std::string_view canonical_claims);

/// The tenant of a verified client certificate's identity (its subject, or one of its names):
/// "cert:" + the identity when it is 1-128 visible ASCII characters not starting with "sha256:",
/// else "cert:sha256:" + lowercase hex SHA-256 of it. A renewed certificate naming the same
/// identity has the same tenant.
std::string certificate_tenant(std::string_view identity);

/// The tenant of a request. `none` gives "" (one shared scope). `header` gives the header's value
/// when it is 1-128 visible ASCII characters not starting with a reserved prefix (above) and ""
/// when absent; any other value is hashed ("sha256:<hex>") so it stays a safe identifier in its
/// own namespace. `authorization` gives "auth:<hex of SHA-256 of the header value>" (never the
/// credential itself) and "" when absent.
///
/// The header it reads appearing more than once is an error (one line saying so): the tenant
/// would depend on which one a server picks, and a proxy in front that appends its own value
/// instead of replacing the client's would let a client choose another tenant's scope.
std::expected<std::string, std::string> derive_tenant(const TenantRule& rule, std::span<const HeaderView> headers);

}  // namespace idem
