#pragma once

// Internal to idem-gateway's configuration loader: what its sections (config.cpp, and a file per
// section that has one, such as config_webhook.cpp) share to read TOML values and to say where a
// bad one is. Every reader throws ConfigError naming the file, the table and the key.

#include <toml++/toml.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "idem/gateway/config.hpp"
#include "idem/gateway/webhook.hpp"

namespace idem::gateway::config_toml {

/// Where in the file a value is, for error messages: "config.toml: [[route]] #2: ".
struct Context {
  std::string source;
  std::string where;  // "", "[idempotency]", "[[route]] #2", ...

  /// Throws the ConfigError: source, where, the message and, when known, the node's line.
  [[noreturn]] void fail(const toml::node* node, const std::string& message) const {
    std::string text = source + ": ";
    if (!where.empty()) text += where + ": ";
    text += message;
    if (node != nullptr && node->source().begin.line > 0) {
      text += " (line " + std::to_string(node->source().begin.line) + ")";
    }
    throw ConfigError(text);
  }
};

/// ASCII lower case.
std::string lower(std::string_view s);
/// `s` in double quotes, control bytes as \xHH (an error stays one line).
std::string quoted(std::string_view s);
/// Whether `s` is an RFC 9110 token (header names, methods).
bool is_token(std::string_view s);
/// "a string", "an integer", ...: what a node is, for "expected X, got Y".
std::string_view type_name(const toml::node& node);

/// The readers of one value each.
std::string get_string(const Context& ctx, std::string_view key, const toml::node& node);
bool get_bool(const Context& ctx, std::string_view key, const toml::node& node);
std::int64_t get_int(const Context& ctx, std::string_view key, const toml::node& node, std::int64_t min,
                     std::int64_t max);
/// A duration string ("30s"); zero only when `allow_zero`.
Millis get_duration(const Context& ctx, std::string_view key, const toml::node& node, bool allow_zero = false);
/// A size (an integer of bytes, or "1MiB"), at least `min`.
std::size_t get_size(const Context& ctx, std::string_view key, const toml::node& node, std::uint64_t min = 0);
std::vector<std::string> get_string_array(const Context& ctx, std::string_view key, const toml::node& node);
/// A string, or an array of strings (`keys = "a.json"` or `keys = ["old.pem", "new.pem"]`).
std::vector<std::string> get_strings(const Context& ctx, std::string_view key, const toml::node& node);
/// A string that is a valid header name.
std::string get_header_name(const Context& ctx, std::string_view key, const toml::node& node);

/// A route's `webhook` table (config_webhook.cpp), for the route at `path`; its secret files are
/// read here, so a bad one stops the start or the reload.
WebhookRoute parse_webhook(const Context& route_ctx, const toml::node& node, const std::string& path);

/// [tls] and [upstream_tls] (config_tls.cpp): their keys only; load_tls_contexts reads the files.
void parse_tls(const Context& parent, const toml::node& node, Config& config);
void parse_upstream_tls(const Context& parent, const toml::node& node, Config& config);
/// [http2] (config_tls.cpp, beside [tls], whose ALPN it changes).
void parse_http2(const Context& parent, const toml::node& node, Config& config);
/// A tenant table's `identity` (from = "client_cert").
CertificateIdentity parse_certificate_identity(const Context& ctx, const toml::node& node, std::string_view text);
/// Loads the certificates and keys of [tls] and of an https:// upstream into `config`, and checks
/// what depends on them (a client_cert tenant needs a listener asking for client certificates).
/// Throws ConfigError naming the file and why.
void load_tls_contexts(Config& config);

}  // namespace idem::gateway::config_toml
