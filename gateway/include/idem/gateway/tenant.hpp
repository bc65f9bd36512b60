#pragma once

#include <cstddef>
#include <expected>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "idem/auth/jwt.hpp"
#include "idem/clock.hpp"
#include "idem/http_view.hpp"
#include "idem/problem.hpp"
#include "idem/gateway/tls.hpp"
#include "idem/tenant.hpp"

namespace idem::gateway {

/// Where a request's tenant comes from: the `[tenant]` table, or a route's own `tenant` table
/// (docs/gateway.md). Read-only once loaded; shared by every event loop.
struct TenantSetting {
  /// none, header or authorization, derived by the core (idem::derive_tenant); unused with `jwt`.
  TenantRule rule;
  /// from = "jwt": the keys tokens are verified with and the options they were loaded for;
  /// null for the other sources.
  std::shared_ptr<const auth::KeySet> jwt;
  /// from = "client_cert": which name of the verified client certificate is the tenant; nullopt
  /// for the other sources.
  std::optional<CertificateIdentity> client_cert;
};

/// The 401 answering a refused token: token_missing, token_invalid or token_expired, with
/// `WWW-Authenticate: Bearer` (RFC 6750 §3).
Problem token_problem(const auth::TokenError& error);

/// One event loop's way of deriving a tenant from one TenantSetting: the core's rule, or a
/// JwtVerifier with its cache. Not thread-safe.
class TenantSource {
 public:
  /// `setting` must outlive the source; so must `clock`.
  explicit TenantSource(const TenantSetting& setting, const Clock& clock = SystemClock::instance());

  /// Whether the tenant is a verified credential's (a token, a client certificate): a request
  /// that carries no idempotency key then needs none (it passes through, or is refused for the
  /// missing key, and the upstream authenticates it as it always does).
  bool verifies_credentials() const { return verifier_.has_value() || setting_->client_cert.has_value(); }

  /// The request's tenant, or the problem to answer: 400 tenant_ambiguous (the header it comes
  /// from twice), 401 token_missing / token_invalid / token_expired, 401
  /// client_certificate_missing (from = "client_cert" on a connection without a verified
  /// certificate, or one without the name `identity` picks). `certificate` is the connection's
  /// verified client certificate, null when it has none.
  std::expected<std::string, Problem> derive(std::span<const HeaderView> headers,
                                             const ClientCertificate* certificate = nullptr);

 private:
  const TenantSetting* setting_;
  std::optional<auth::JwtVerifier> verifier_;
};

struct Route;

/// One event loop's tenant sources: [tenant]'s, and one per route with a `tenant` table of its own.
class TenantSources {
 public:
  /// `global`, `routes` and `clock` must outlive the sources.
  TenantSources(const TenantSetting& global, const std::vector<Route>& routes,
                const Clock& clock = SystemClock::instance());

  /// The source of the route at `route` (its index in the configuration), or [tenant]'s for
  /// requests no route lists (Router::kNoRoute).
  TenantSource& for_route(std::size_t route) { return sources_[route < of_route_.size() ? of_route_[route] : 0]; }

 private:
  std::vector<TenantSource> sources_;  // [0]: [tenant]
  std::vector<std::size_t> of_route_;  // route index -> sources_ index
};

}  // namespace idem::gateway
