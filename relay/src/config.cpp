#include "config.hpp"

#include "idem/open_broker.hpp"

namespace idem::relay {
namespace {

void bind(sidecar::Settings& s, Config& c) {
  s.text("outbox", c.outbox, /*secret=*/true);
  s.text("sink", c.sink, /*secret=*/true);
  s.listen("admin_listen", c.admin_listen);
  s.text("name", c.name);
  s.integer("batch", 1, 10'000, [&c](std::int64_t v) { c.batch = static_cast<std::size_t>(v); });
  s.duration("poll_interval", c.poll_interval);
  s.integer("max_attempts", 1, 100'000, [&c](std::int64_t v) { c.max_attempts = static_cast<std::uint32_t>(v); });
  s.duration("retry_min", c.retry_min);
  s.duration("retry_max", c.retry_max);
  s.duration("lease", c.lease);
  s.duration("retention", c.retention);
  s.duration("webhook_timeout", c.webhook_timeout);
  s.paths("webhook_secret_file", c.webhook_secret_file);
  s.text("webhook_ca_file", c.webhook_ca_file);
  s.text("webhook_cert_file", c.webhook_cert_file);
  s.text("webhook_key_file", c.webhook_key_file);
  s.text("webhook_key_passphrase_file", c.webhook_key_passphrase_file);
  s.duration("connect_timeout", c.connect_timeout);
  s.duration("confirm_timeout", c.confirm_timeout);
  s.choice("dead_rows", {"hold", "pass"}, [&c](const std::string& v) { c.dead_rows = v; });
  s.text("dead_rows_pass", c.dead_rows_pass);
  s.choice("log_level", {"error", "warn", "info", "debug"}, [&c](const std::string& v) {
    using L = gateway::LogLevel;
    c.log_level = v == "error" ? L::error : v == "warn" ? L::warn : v == "debug" ? L::debug : L::info;
  });
}

void check(Config& c) {
  using sidecar::ConfigError;
  if (c.outbox.empty()) throw ConfigError("no outbox: give --outbox sqlite:PATH or postgres://... (or outbox = in the file)");
  if (c.sink.empty()) {
    throw ConfigError("no sink: give --sink amqp://...?exchange=E, redis+stream://HOST:PORT/STREAM, kafka://HOST:PORT/TOPIC, sqs+https://HOST/ACCOUNT/QUEUE or http://... (or sink = in the file)");
  }
  if (!c.outbox.starts_with("sqlite:") && !c.outbox.starts_with("postgres://") &&
      !c.outbox.starts_with("postgresql://")) {
    throw ConfigError("outbox: expected sqlite:PATH or postgres://...: the outbox lives in the service's SQLite or PostgreSQL database");
  }
  const bool webhook = c.sink.starts_with("http://") || c.sink.starts_with("https://");
  if (!webhook) {
    if (auto problem = check_sink_url(c.sink)) throw ConfigError("sink: " + *problem);
    // Refused rather than ignored: whoever set it expects signed events, and a broker sink sends none.
    if (!c.webhook_secret_file.empty()) throw ConfigError("webhook_secret_file: only a webhook sink (http:// or https://) signs");
  }
  if (!c.sink.starts_with("https://")) {
    // Refused rather than ignored: whoever set them expects TLS to the webhook (an amqps://
    // sink takes its files in the URL: cacertfile=, certfile=, keyfile=).
    for (const auto& [key, value] : {std::pair<const char*, const std::string*>{"webhook_ca_file", &c.webhook_ca_file},
                                     {"webhook_cert_file", &c.webhook_cert_file},
                                     {"webhook_key_file", &c.webhook_key_file},
                                     {"webhook_key_passphrase_file", &c.webhook_key_passphrase_file}}) {
      if (!value->empty()) throw ConfigError(std::string(key) + ": only an https:// webhook sink uses TLS files");
    }
  }
  if (c.webhook_cert_file.empty() != c.webhook_key_file.empty()) {
    throw ConfigError("webhook_cert_file and webhook_key_file go together: give both or neither");
  }
  if (!c.webhook_key_passphrase_file.empty() && c.webhook_key_file.empty()) {
    throw ConfigError("webhook_key_passphrase_file: only with webhook_key_file");
  }
  if (c.name.empty()) c.name = sidecar::host_and_pid();
  if (c.retry_min > c.retry_max) throw ConfigError("retry_min must not be longer than retry_max");
  // A relay still publishing a batch when its lease runs out could see another relay publish the
  // same rows meanwhile: harmless (consumers dedupe), but the lease should cover a batch.
  if (c.lease <= c.webhook_timeout || c.lease <= c.confirm_timeout) {
    throw ConfigError("lease must be longer than webhook_timeout and confirm_timeout: a batch still publishing when its "
                      "lease ran out would be published by another relay too");
  }
}

Config build(const std::optional<std::string_view>& toml, const Flags& flags) {
  Config c;
  sidecar::Settings settings;
  bind(settings, c);
  if (toml) {
    settings.read_text(*toml, "relay.toml");
  } else if (flags.config) {
    settings.read_file(*flags.config);
  }
  for (const auto& [key, value] : flags.settings) settings.set_from_flag(key, sidecar::flag_for(key), value);
  check(c);
  return c;
}

}  // namespace

Config load(const Flags& flags) { return build(std::nullopt, flags); }
Config parse(std::string_view toml, const Flags& flags) { return build(toml, flags); }

}  // namespace idem::relay
