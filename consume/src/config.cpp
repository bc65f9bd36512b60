#include "config.hpp"

#include "idem/key.hpp"
#include "idem/open_broker.hpp"
#include "idem/open_store.hpp"

namespace idem::consume {
namespace {

// Binds every key of Config to `settings`.
void bind(sidecar::Settings& s, Config& c) {
  s.text("source", c.source, /*secret=*/true);
  s.text("deliver", c.deliver, /*secret=*/true);
  s.text("store", c.store, /*secret=*/true);
  s.listen("admin_listen", c.admin_listen);
  s.text("name", c.name);
  s.text("consumer", c.consumer);
  s.integer("workers", 1, 1024, [&c](std::int64_t v) { c.workers = static_cast<std::size_t>(v); });
  s.integer("prefetch", 1, 65535, [&c](std::int64_t v) { c.prefetch = static_cast<std::size_t>(v); });
  s.integer("max_attempts", 1, 1000, [&c](std::int64_t v) { c.max_attempts = static_cast<std::uint32_t>(v); });
  s.size("max_message_bytes", c.max_message_bytes, 1);
  s.duration("handler_timeout", c.handler_timeout);
  s.paths("sign_secret_file", c.sign_secret_file);
  s.text("handler_ca_file", c.handler_ca_file);
  s.text("handler_cert_file", c.handler_cert_file);
  s.text("handler_key_file", c.handler_key_file);
  s.text("handler_key_passphrase_file", c.handler_key_passphrase_file);
  s.duration("lease", c.lease);
  s.duration("retention", c.retention);
  s.choice("on_lease_expiry", {"reexecute", "unknown"}, [&c](const std::string& v) {
    c.on_lease_expiry = v == "unknown" ? LeaseExpiry::unknown : LeaseExpiry::reexecute;
  });
  s.choice("ordering", {"none", "key"}, [&c](const std::string& v) {
    c.ordering = v == "key" ? ConsumeOrdering::key : ConsumeOrdering::none;
  });
  s.choice("dead_letters", {"hold", "pass"}, [&c](const std::string& v) { c.hold_after_dead_letter = v == "hold"; });
  s.duration("retry_min", c.retry_min);
  s.duration("retry_max", c.retry_max);
  s.duration("drain_timeout", c.drain_timeout, /*allow_zero=*/true);
  s.duration("claim_idle", c.claim_idle);
  s.duration("connect_timeout", c.connect_timeout);
  s.choice("log_level", {"error", "warn", "info", "debug"}, [&c](const std::string& v) {
    using L = gateway::LogLevel;
    c.log_level = v == "error" ? L::error : v == "warn" ? L::warn : v == "debug" ? L::debug : L::info;
  });
}

void check(Config& c) {
  using sidecar::ConfigError;
  if (c.source.empty()) throw ConfigError("no source: give --source amqp://..., redis+stream://..., kafka://... or sqs+https://... (or source = in the file)");
  if (c.deliver.empty()) throw ConfigError("no handler: give --deliver http://HOST:PORT/PATH (or deliver = in the file)");
  if (auto problem = check_source_url(c.source)) throw ConfigError("source: " + *problem);
  if (!c.deliver.starts_with("http://") && !c.deliver.starts_with("https://")) {
    throw ConfigError("deliver: expected an http:// or https:// URL");
  }
  if (!c.deliver.starts_with("https://")) {
    // Refused rather than ignored: whoever set them expects TLS to the handler.
    for (const auto& [key, value] : {std::pair<const char*, const std::string*>{"handler_ca_file", &c.handler_ca_file},
                                     {"handler_cert_file", &c.handler_cert_file},
                                     {"handler_key_file", &c.handler_key_file},
                                     {"handler_key_passphrase_file", &c.handler_key_passphrase_file}}) {
      if (!value->empty()) throw ConfigError(std::string(key) + ": only an https:// handler uses TLS files");
    }
  }
  if (c.handler_cert_file.empty() != c.handler_key_file.empty()) {
    throw ConfigError("handler_cert_file and handler_key_file go together: give both or neither");
  }
  if (!c.handler_key_passphrase_file.empty() && c.handler_key_file.empty()) {
    throw ConfigError("handler_key_passphrase_file: only with handler_key_file");
  }
  if (auto problem = check_store_url(c.store)) throw ConfigError("store: " + *problem);
  if (c.name.empty()) c.name = source_identity(c.source);
  if (c.name.empty() || c.name.size() > 128 || !all_visible_ascii(c.name)) {
    throw ConfigError("name: \"" + c.name + "\": expected 1-128 visible ASCII characters (no spaces)");
  }
  // A delivery still running when its lease runs out could be taken over by another replica and
  // sent to the handler a second time while the first is still at it.
  if (c.lease <= c.handler_timeout) {
    throw ConfigError("lease (" + std::to_string(c.lease.count() / 1000) + "s) must be longer than handler_timeout (" +
                      std::to_string(c.handler_timeout.count() / 1000) +
                      "s): a delivery still running when its lease ran out could be sent to the handler twice");
  }
  if (c.retry_min > c.retry_max) throw ConfigError("retry_min must not be longer than retry_max");
  if (c.workers > c.prefetch) c.workers = c.prefetch;  // more would never have work
}

Config build(const std::optional<std::string_view>& toml, const std::string& source, const Flags& flags) {
  Config c;
  sidecar::Settings settings;
  bind(settings, c);
  if (toml) {
    settings.read_text(*toml, source);
  } else if (flags.config) {
    settings.read_file(*flags.config);
  }
  for (const auto& [key, value] : flags.settings) settings.set_from_flag(key, sidecar::flag_for(key), value);
  check(c);
  return c;
}

}  // namespace

Config load(const Flags& flags) { return build(std::nullopt, "", flags); }

Config parse(std::string_view toml, const Flags& flags) { return build(toml, "consume.toml", flags); }

}  // namespace idem::consume
