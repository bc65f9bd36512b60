#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/gateway/grpc.hpp"
#include "idem/engine.hpp"
#include "idem/error_envelope.hpp"
#include "idem/gateway/tenant.hpp"
#include "idem/gateway/webhook.hpp"

namespace idem::gateway {

/// A route's path pattern: literal segments, "*" for exactly one non-empty segment, and an
/// optional trailing "/**" for zero or more further segments. Matched against the raw path (no
/// percent-decoding, no dot-segment removal), without the query.
class PathPattern {
 public:
  /// Parses a pattern; throws std::invalid_argument with a sentence saying what is wrong.
  explicit PathPattern(std::string_view pattern);
  PathPattern() = default;

  /// Whether `path` matches. Does not allocate.
  bool matches(std::string_view path) const;
  /// The pattern as written.
  const std::string& text() const { return text_; }

 private:
  std::string text_;
  std::vector<std::string> segments_;  // "*" for a wildcard segment
  bool rest_ = false;                  // trailing "/**"
};

/// What the gateway does for a route that the engine does not decide: the envelope of its own
/// answers, its size limits, whether responses advertise the key's expiry. Defaults come from the
/// top-level keys (`errors`, `max_body`, `max_stored_response`, [idempotency] advertise_expiry).
struct RouteOptions {
  std::shared_ptr<const ErrorEnvelope> errors = ErrorEnvelope::problem_json();  ///< never null
  std::size_t max_body = 1024 * 1024;             ///< request body; above: 413
  std::size_t max_stored_response = 1024 * 1024;  ///< response body stored for replay
  bool advertise_expiry = true;                   ///< send Idempotency-Key-Expires
  /// `allow_short_lease`: a lease not longer than upstream_timeout is accepted (else refused at
  /// load: a takeover could run while the first call still executes).
  bool allow_short_lease = false;
  /// `grpc_retryable`: the gRPC statuses (bit N: status N) whose answer to a keyed call is not
  /// stored; the key is left for a retry to execute again (docs/gateway.md, gRPC). Default:
  /// UNAVAILABLE, RESOURCE_EXHAUSTED, ABORTED (DEADLINE_EXCEEDED, unless listed, leaves the key
  /// in progress: the server's handler may still be running).
  std::uint32_t grpc_retryable = grpc::kDefaultRetryable;
};

/// One [[route]]: the methods and path it applies to, and its policy.
struct Route {
  std::vector<std::string> methods;  ///< upper-case, e.g. {"POST"}
  PathPattern path;
  Policy policy;  ///< key_required = the route's `required` (default true)
  RouteOptions options;  ///< resolved: the route's own keys over the top-level defaults
  /// The route's own `tenant` table; nullopt: [tenant]'s.
  std::optional<TenantSetting> tenant;
  /// `webhook`: the route receives a provider's signed events (docs/webhooks.md); nullopt: not.
  std::optional<WebhookRoute> webhook;
};

/// Chooses the policy for a request (SPEC §3). Holds pointers into the routes and default
/// policy it was built from, which must outlive it.
class Router {
 public:
  Router(const std::vector<Route>& routes, const Policy& defaults);

  /// Route index of requests no route lists.
  static constexpr std::size_t kNoRoute = static_cast<std::size_t>(-1);

  /// What routing decided for a request.
  struct Match {
    const Policy* policy = nullptr;  ///< nullptr: passed through untouched
    std::size_t route = kNoRoute;    ///< the index of the route that matched, or kNoRoute
  };

  /// The policy of a request (policy_for) and the route it came from.
  Match match(std::string_view method, std::string_view path) const;

  /// The policy of a request, or nullptr when the gateway passes it through untouched:
  /// safe methods never are handled; the first route whose method and path match wins; POST and
  /// PATCH that no route lists get `defaults` with the key optional; anything else (PUT, DELETE,
  /// unknown methods) passes through.
  const Policy* policy_for(std::string_view method, std::string_view path) const { return match(method, path).policy; }

 private:
  const std::vector<Route>& routes_;
  Policy unlisted_;  // defaults, key optional
};

}  // namespace idem::gateway
