#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "idem/encryption.hpp"
#include "idem/engine.hpp"
#include "idem/error_envelope.hpp"
#include "idem/gateway/routes.hpp"
#include "idem/gateway/tls.hpp"
#include "idem/tenant.hpp"

namespace idem::gateway {

using namespace std::chrono_literals;

/// A bad flag or configuration: the message is one line naming the problem, e.g.
/// `config.toml: [[route]] #2: unknown key "retentoin" (line 14)`. main() prints it and exits 2.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A listening address, "HOST:PORT" ("[::1]:8080" for IPv6).
struct ListenAddress {
  std::string host;
  std::uint16_t port = 0;
  /// "HOST:PORT" as it would be written in the configuration.
  std::string text() const;
};

/// The upstream service: http://HOST[:PORT] or https://HOST[:PORT] (HTTP/1.1; no path).
struct UpstreamUrl {
  std::string host;
  std::uint16_t port = 80;
  /// HOST[:PORT] as written: the Host header sent when the client sent none.
  std::string authority;
  /// https://: TLS to the upstream, verified as [upstream_tls] says.
  bool tls = false;
  /// The URL again, "http://HOST:PORT" as written.
  std::string text() const { return std::string(tls ? "https://" : "http://").append(authority); }
};

/// Where idempotency records live.
struct StoreUrl {
  enum class Kind { memory, sqlite, shared };  ///< shared: postgres://, redis://, redis+cluster://
  Kind kind = Kind::sqlite;
  /// For sqlite: the database file.
  std::string path;
  /// The URL as configured.
  std::string text;
};

/// How much the gateway says on stderr.
enum class LogLevel { error, warn, info, debug };

/// How log lines are written: `time level message` text, or one JSON object per line.
enum class LogFormat { text, json };

/// [http2]: HTTP/2 on the client listeners (docs/gateway.md, HTTP/2). The upstream side stays
/// HTTP/1.1.
struct Http2Settings {
  bool tls = false;        ///< offer h2 by ALPN on the [tls] listener (server preference: h2 first)
  bool cleartext = false;  ///< h2c with prior knowledge on the plain listener, beside HTTP/1.1
  std::uint32_t max_concurrent_streams = 100;  ///< SETTINGS_MAX_CONCURRENT_STREAMS per connection
  /// SETTINGS_INITIAL_WINDOW_SIZE: how much of a request body a client may send before the
  /// gateway has read it (per stream); the connection's window is max_concurrent_streams times it.
  std::uint32_t initial_window = 256 * 1024;

  bool any() const { return tls || cleartext; }
};

/// Everything idem-gateway runs with; defaults are written here and in docs/gateway.md.
struct Config {
  ListenAddress listen{"127.0.0.1", 8080};
  /// false: listen = "off", no plain listener (only [tls]'s).
  bool plain_listener = true;
  /// [tls]: the TLS listener's address, certificate and client-certificate policy; nullopt: none.
  std::optional<ListenerTls> tls;
  std::optional<ListenAddress> tls_listen;
  /// [tls]'s certificate and key, loaded with the configuration (a bad file stops the start or
  /// the reload, which then keeps the running one); null without [tls].
  std::shared_ptr<const TlsContext> tls_context;
  /// [http2]: off unless asked for.
  Http2Settings http2;
  /// nullopt: no admin listener (admin_listen = "off").
  std::optional<ListenAddress> admin_listen = ListenAddress{"127.0.0.1", 9090};
  UpstreamUrl upstream{"127.0.0.1", 8081, "127.0.0.1:8081"};
  /// [upstream_tls]: how an https:// upstream is verified, and the client certificate shown to it.
  UpstreamTls upstream_tls;
  /// Loaded with the configuration for an https:// upstream; null for http://.
  std::shared_ptr<const TlsContext> upstream_tls_context;
  StoreUrl store{StoreUrl::Kind::sqlite, "./var/idem.db", "sqlite:./var/idem.db"};
  /// upstream_protocol = "h2": HTTP/2 to the upstream (prior knowledge on http://, ALPN on
  /// https://), multiplexed over few connections; required for gRPC upstreams. Else HTTP/1.1.
  bool upstream_http2 = false;

  Millis upstream_timeout = 30s;          ///< request sent -> response fully received
  Millis upstream_connect_timeout = 5s;   ///< TCP connect to the upstream
  Millis upstream_idle_timeout = 4s;      ///< pooled upstream connections idle longer are closed
  /// The upstream host is resolved again this often (0: only at start-up and after failures);
  /// every second while it does not resolve or connections to it fail.
  Millis upstream_resolve_interval = 30s;
  std::size_t upstream_max_idle = 64;     ///< idle upstream connections kept, per thread
  /// Sent to the upstream with every keyed request it executes and every lookup: the claim's
  /// attempt number (1, then one more per takeover) and the key's tenant, so the upstream can
  /// refuse a write of a lower attempt than one it saw (docs/security.md, the fence contract).
  /// A client's own headers of these names are removed from every forwarded request.
  std::string upstream_attempt_header = "Idempotency-Attempt";
  std::string upstream_tenant_header = "Idempotency-Tenant";
  /// on_lease_expiry = "ask": a lookup's limit from sending to its whole answer, and how many
  /// lookups per second the gateway sends at most (beyond: 409 idempotency_outcome_unknown).
  Millis lookup_timeout = 5s;
  double lookup_rate = 100;

  /// Request body; above: 413. The default of every route (a route's own `max_body` wins).
  std::size_t max_body = 1024 * 1024;
  std::size_t max_header = 16 * 1024;             ///< request line + headers; above: 431
  /// Response body stored for replay; the default of every route, like max_body.
  std::size_t max_stored_response = 1024 * 1024;
  std::size_t max_connections = 10000;            ///< client connections; above: refused

  Millis idle_timeout = 60s;    ///< a keep-alive client connection waiting for its next request
  Millis client_timeout = 30s;  ///< reading one request (headers + body); each write to a client
  Millis drain_timeout = 30s;   ///< SIGTERM: how long in-flight requests may take to finish
  /// The longest a request waits for one store call; above it: 503 for a claim. Above the
  /// stores' own timeouts, it only fires for a store that hangs (docs/gateway.md).
  Millis store_timeout = 15s;

  unsigned threads = 0;              ///< event loops; 0: one per core
  Millis reaper_interval = 60s;      ///< 0: no reaper
  std::size_t reaper_batch = 1000;   ///< records deleted per purge call

  LogLevel log_level = LogLevel::info;
  LogFormat log_format = LogFormat::text;

  /// `errors`: the envelope of every answer the gateway makes itself, for routes without their own
  /// and for requests refused before a route is known (400 malformed, 431). Never null.
  std::shared_ptr<const ErrorEnvelope> errors = ErrorEnvelope::problem_json();
  /// [idempotency] advertise_expiry: executed and replayed keyed responses carry
  /// Idempotency-Key-Expires (the default of every route).
  bool advertise_expiry = true;
  /// [idempotency] allow_short_lease (the default of every route): see RouteOptions.
  bool allow_short_lease = false;

  /// [idempotency]: the policy of POST/PATCH requests no route lists (key optional) and the base
  /// every route overrides.
  Policy defaults;
  /// [tenant]: whose keys they are, for every route without a `tenant` table of its own. With
  /// from = "jwt" its keys are loaded when the configuration is (a bad key file is a ConfigError).
  TenantSetting tenant;
  std::vector<Route> routes;

  /// [encryption] key_file: encrypts stored responses at rest (docs/security.md); empty: off.
  std::string encryption_key_file;
  /// The keys read from encryption_key_file when the configuration was loaded (a bad file is a
  /// ConfigError); null when encryption is off.
  std::shared_ptr<const KeyRing> encryption_keys;

  /// Things worth saying at start-up that do not stop it (retention outside 1h-7d, ...).
  std::vector<std::string> warnings;
};

/// What a request's answer depends on besides its Policy, for a route or for requests no route
/// lists (Config's top-level values).
RouteOptions default_route_options(const Config& config);

/// Values given on the command line; each replaces the file's.
struct Overrides {
  std::optional<std::string> listen;
  std::optional<std::string> upstream;
  std::optional<std::string> store;
  std::optional<std::string> admin_listen;
};

/// Reads the TOML file at `path` (or only defaults when nullopt) and applies `overrides`.
/// Unknown keys, wrong types and bad values are ConfigErrors naming the file, the table and key.
Config load_config(const std::optional<std::string>& path, const Overrides& overrides = {});

/// load_config for text already in memory; `source` names it in errors (e.g. "config.toml").
Config parse_config(std::string_view toml, std::string_view source, const Overrides& overrides = {});

/// "30s", "1500ms", "1h30m", "7d": integers with units ms, s, m, h, d (summed when several).
/// Throws ConfigError (message without context) for anything else.
Millis parse_duration(std::string_view text);

/// "1MiB", "512KiB", "10MB", "4096": bytes, with B, KiB/MiB/GiB (1024-based) or KB/MB/GB
/// (1000-based) units, case-insensitive. Throws ConfigError for anything else.
std::uint64_t parse_size(std::string_view text);

/// "HOST:PORT", "[v6]:PORT". Throws ConfigError.
ListenAddress parse_listen_address(std::string_view text);

/// "http://HOST[:PORT]" with an optional trailing "/". Throws ConfigError.
UpstreamUrl parse_upstream_url(std::string_view text);

/// Any URL open_store accepts (memory:, sqlite:PATH[?opts], postgres://, redis://,
/// redis+cluster://), checked without connecting. Throws ConfigError.
StoreUrl parse_store_url(std::string_view text);

}  // namespace idem::gateway
