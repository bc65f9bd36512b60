#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "idem/gateway/config.hpp"
#include "idem/gateway/routes.hpp"

namespace idem::gateway {

/// One immutable configuration as requests use it: the Config, its Router and what each route
/// answers with. A reload (SIGHUP) builds a new Runtime and swaps it in; a request keeps the one
/// it started with until it is answered, so no request ever sees half of two configurations.
class Runtime {
 public:
  /// `config` must not be null. `generation` numbers the configurations of one process (1 at
  /// start-up, +1 per applied reload).
  Runtime(std::shared_ptr<const Config> config, std::uint64_t generation);
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const Config& config() const { return *config_; }
  const std::shared_ptr<const Config>& config_ptr() const { return config_; }
  const Router& router() const { return router_; }
  std::uint64_t generation() const { return generation_; }

  /// The options of the route at `route` (Router::Match::route), or the top-level ones for
  /// requests no route lists (Router::kNoRoute).
  const RouteOptions& options(std::size_t route) const {
    return route < config_->routes.size() ? config_->routes[route].options : unlisted_;
  }
  /// The largest max_body of any route or the default: the body limit a request is read with
  /// before it is routed (its own route's limit is applied once its head is known).
  std::size_t largest_max_body() const { return largest_max_body_; }

 private:
  std::shared_ptr<const Config> config_;
  Router router_;
  RouteOptions unlisted_;
  std::size_t largest_max_body_ = 0;
  std::uint64_t generation_;
};

/// What a reload cannot change while the process runs, compared between the running
/// configuration and a new one: one line per difference, e.g. `listen: 127.0.0.1:8080 ->
/// 0.0.0.0:8080 needs a restart; still 127.0.0.1:8080`. Listen and admin addresses, the store, the
/// number of threads, and turning [encryption] on or off (its keys reload).
std::vector<std::string> restart_needed(const Config& running, const Config& next);

/// `next` with every setting restart_needed() names put back to the running one's, so that the
/// configuration a reload publishes is the one in force.
std::shared_ptr<const Config> keep_restart_settings(const Config& running, Config next);

/// One line describing a configuration after a reload (routes, upstream, envelope, log level),
/// never a secret: the store URL is redacted.
std::string describe_reload(const Config& config);

}  // namespace idem::gateway
