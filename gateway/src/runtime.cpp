#include "idem/gateway/runtime.hpp"

#include <algorithm>

#include "idem/gateway/log.hpp"
#include "idem/redact.hpp"

namespace idem::gateway {
namespace {

std::string listen_text(const std::optional<ListenAddress>& address) { return address ? address->text() : "off"; }

}  // namespace

Runtime::Runtime(std::shared_ptr<const Config> config, std::uint64_t generation)
    : config_(std::move(config)),
      router_(config_->routes, config_->defaults),
      unlisted_(default_route_options(*config_)),
      generation_(generation) {
  largest_max_body_ = unlisted_.max_body;
  for (const auto& route : config_->routes) largest_max_body_ = std::max(largest_max_body_, route.options.max_body);
}

std::vector<std::string> restart_needed(const Config& running, const Config& next) {
  std::vector<std::string> out;
  auto note = [&](std::string_view key, const std::string& before, const std::string& after) {
    if (before == after) return;
    out.push_back(std::string(key) + ": " + before + " -> " + after + " needs a restart; still " + before);
  };
  note("listen", running.plain_listener ? running.listen.text() : "off", next.plain_listener ? next.listen.text() : "off");
  note("[tls] listen", listen_text(running.tls_listen), listen_text(next.tls_listen));
  note("admin_listen", listen_text(running.admin_listen), listen_text(next.admin_listen));
  // Store URLs may carry a password: only ever shown redacted.
  note("store", redact_url(running.store.text), redact_url(next.store.text));
  if (running.store.text != next.store.text && redact_url(running.store.text) == redact_url(next.store.text)) {
    out.push_back("store: its credentials changed, which needs a restart; still the running store's");
  }
  note("threads", std::to_string(running.threads), std::to_string(next.threads));
  const bool was_encrypting = !running.encryption_key_file.empty();
  const bool encrypts = !next.encryption_key_file.empty();
  if (was_encrypting != encrypts) {
    out.push_back(std::string("[encryption]: turning it ") + (encrypts ? "on" : "off") + " needs a restart; still " +
                  (was_encrypting ? "encrypting" : "not encrypting"));
  }
  return out;
}

std::shared_ptr<const Config> keep_restart_settings(const Config& running, Config next) {
  next.listen = running.listen;
  next.plain_listener = running.plain_listener;
  next.tls_listen = running.tls_listen;
  // The TLS listener keeps serving TLS: a reload without [tls] keeps the running certificate.
  if (running.tls && !next.tls) {
    next.tls = running.tls;
    next.tls_context = running.tls_context;
  }
  if (!running.tls) {
    next.tls.reset();
    next.tls_context.reset();
  }
  next.admin_listen = running.admin_listen;
  next.store = running.store;
  next.threads = running.threads;
  if (running.encryption_key_file.empty() != next.encryption_key_file.empty()) {
    next.encryption_key_file = running.encryption_key_file;
    next.encryption_keys = running.encryption_keys;
  }
  return std::make_shared<const Config>(std::move(next));
}

std::string describe_reload(const Config& config) {
  std::string line = std::to_string(config.routes.size()) + " route" + (config.routes.size() == 1 ? "" : "s") +
                     ", upstream " + config.upstream.text() + ", errors " + config.errors->name() +
                     ", log_level " + std::string(log::level_name(config.log_level)) + ", log_format " +
                     (config.log_format == LogFormat::json ? "json" : "text");
  if (config.encryption_keys) {
    line += ", " + std::to_string(config.encryption_keys->keys().size()) + " encryption key(s)";
  }
  // Counts only: the secrets themselves never reach a log line.
  for (const auto& route : config.routes) {
    if (!route.webhook) continue;
    line += std::string(", webhook ").append(route.path.text()).append(" (");
    line.append(to_string(route.webhook->verifier->profile())).append(", ");
    line += std::to_string(route.webhook->verifier->secret_count()) + " secret(s))";
  }
  return line;
}

}  // namespace idem::gateway
