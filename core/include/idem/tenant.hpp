#pragma once

#include <expected>
#include <span>
#include <string>

#include "idem/http_view.hpp"

namespace idem {

/// Where a request's tenant comes from (SPEC §2). Keys are scoped by tenant.
struct TenantRule {
  enum class Source { none, header, authorization };
  Source source = Source::none;
  /// For Source::header: the header naming the tenant.
  std::string header = "X-Tenant-Id";
};

/// The tenant of a request. `none` gives "" (one shared scope). `header` gives the header's value
/// when it is 1-128 visible ASCII characters and "" when absent; any other value is hashed
/// ("sha256:<hex>") so it stays a safe identifier. `authorization` gives
/// "auth:<hex of SHA-256 of the header value>" (never the credential itself) and "" when absent.
///
/// The header it reads appearing more than once is an error (one line saying so): the tenant
/// would depend on which one a server picks, and a proxy in front that appends its own value
/// instead of replacing the client's would let a client choose another tenant's scope.
std::expected<std::string, std::string> derive_tenant(const TenantRule& rule, std::span<const HeaderView> headers);

}  // namespace idem
