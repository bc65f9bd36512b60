#include "idem/gateway/tenant.hpp"

#include "idem/gateway/routes.hpp"

namespace idem::gateway {

Problem token_problem(const auth::TokenError& error) {
  Problem p;
  switch (error.refusal) {
    case auth::Refusal::missing:
      p = make_problem(401, "token_missing", "A bearer token is required",
                       error.reason +
                           "; this route scopes idempotency keys by a verified bearer token's claims: "
                           "send Authorization: Bearer <token>");
      // RFC 6750 §3.1: a request without credentials gets the scheme, no error code.
      p.www_authenticate = "Bearer";
      break;
    case auth::Refusal::invalid:
      p = make_problem(401, "token_invalid", "The bearer token is not valid", error.reason);
      p.www_authenticate = "Bearer error=\"invalid_token\"";
      break;
    case auth::Refusal::expired:
      p = make_problem(401, "token_expired", "The bearer token has expired",
                       error.reason + "; get a new token and retry with the same Idempotency-Key");
      p.www_authenticate = "Bearer error=\"invalid_token\", error_description=\"The access token expired\"";
      break;
  }
  return p;
}

TenantSource::TenantSource(const TenantSetting& setting, const Clock& clock) : setting_(&setting) {
  if (setting.jwt) verifier_.emplace(setting.jwt, clock);
}

namespace {

std::string_view identity_name(CertificateIdentity which) {
  switch (which) {
    case CertificateIdentity::common_name: return "a common name (CN)";
    case CertificateIdentity::uri: return "a URI subject alternative name";
    case CertificateIdentity::dns: return "a DNS subject alternative name";
    case CertificateIdentity::subject: break;
  }
  return "a subject";
}

}  // namespace

std::expected<std::string, Problem> TenantSource::derive(std::span<const HeaderView> headers,
                                                         const ClientCertificate* certificate) {
  if (setting_->client_cert) {
    if (certificate == nullptr) {
      return std::unexpected(make_problem(401, "client_certificate_missing", "A client certificate is required",
                                          "this route scopes idempotency keys by the client's verified TLS certificate: "
                                          "connect to the TLS listener with a certificate its CA issued"));
    }
    const std::string& identity = certificate->identity(*setting_->client_cert);
    if (identity.empty()) {
      return std::unexpected(make_problem(401, "client_certificate_missing", "A client certificate is required",
                                          "the client certificate has no " + std::string(identity_name(*setting_->client_cert)) +
                                              ", which names this route's tenant"));
    }
    return certificate_tenant(identity);
  }
  if (!verifier_) {
    auto tenant = derive_tenant(setting_->rule, headers);
    if (!tenant)
      return std::unexpected(make_problem(400, "tenant_ambiguous", "The tenant is ambiguous", tenant.error()));
    return std::move(*tenant);
  }
  const HeaderView* authorization = nullptr;
  for (const auto& h : headers) {
    if (!iequals(h.name, "Authorization")) continue;
    if (authorization != nullptr) {
      // Which credential counts would depend on the server reading it (SPEC §2, as for the
      // other sources).
      return std::unexpected(make_problem(400, "tenant_ambiguous", "The tenant is ambiguous",
                                          "the Authorization header, which names the tenant, appears more than once"));
    }
    authorization = &h;
  }
  auto verified = verifier_->verify_authorization(authorization ? authorization->value : std::string_view());
  if (!verified) return std::unexpected(token_problem(verified.error()));
  return std::move(verified->tenant);
}

TenantSources::TenantSources(const TenantSetting& global, const std::vector<Route>& routes, const Clock& clock) {
  sources_.emplace_back(global, clock);
  of_route_.reserve(routes.size());
  for (const auto& route : routes) {
    if (route.tenant) {
      of_route_.push_back(sources_.size());
      sources_.emplace_back(*route.tenant, clock);
    } else {
      of_route_.push_back(0);
    }
  }
}

}  // namespace idem::gateway
