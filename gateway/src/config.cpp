#include "idem/gateway/config.hpp"

#include "config_toml.hpp"
#include "idem/gateway/grpc.hpp"

#include "idem/http/lookup.hpp"
#include "idem/open_store.hpp"

#include <toml++/toml.h>

#include <cctype>
#include <fstream>
#include <limits>
#include <sstream>

namespace idem::gateway {
namespace {

constexpr std::uint64_t kMaxU64 = std::numeric_limits<std::uint64_t>::max();

std::string upper(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

// Control bytes of the file (a line break in a quoted key, in what toml++ saw) as \xHH: an
// error stays the one line main() prints (found by fuzz/config_fuzz).
std::string without_controls(std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (const char c : s) {
    const auto byte = static_cast<unsigned char>(c);
    if (byte < 0x20 || byte == 0x7f) {
      out += "\\x";
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

// The helpers every section of the file shares (config_toml.hpp).
namespace config_toml {

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Appended, not "\"" + without_controls(s): GCC 12 at -O3 warns on that (a false -Wrestrict).
std::string quoted(std::string_view s) { return std::string(1, '"').append(without_controls(s)).append(1, '"'); }

// RFC 9110 token characters: header names and methods.
bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c)) continue;
    if (std::string_view("!#$%&'*+-.^_`|~").find(ch) != std::string_view::npos) continue;
    return false;
  }
  return true;
}

std::string_view type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    default: return "a date/time";
  }
}

std::string get_string(const Context& ctx, std::string_view key, const toml::node& node) {
  if (const auto* s = node.as_string()) return s->get();
  ctx.fail(&node, std::string(key) + ": expected a string, got " + std::string(type_name(node)));
}

bool get_bool(const Context& ctx, std::string_view key, const toml::node& node) {
  if (const auto* b = node.as_boolean()) return b->get();
  ctx.fail(&node, std::string(key) + ": expected true or false, got " + std::string(type_name(node)));
}

std::int64_t get_int(const Context& ctx, std::string_view key, const toml::node& node, std::int64_t min,
                     std::int64_t max) {
  const auto* i = node.as_integer();
  if (i == nullptr) {
    ctx.fail(&node, std::string(key) + ": expected an integer, got " + std::string(type_name(node)));
  }
  const std::int64_t v = i->get();
  if (v < min || v > max) {
    ctx.fail(&node, std::string(key) + ": " + std::to_string(v) + " is outside " + std::to_string(min) + ".." +
                        std::to_string(max));
  }
  return v;
}

Millis get_duration(const Context& ctx, std::string_view key, const toml::node& node, bool allow_zero) {
  if (node.is_integer()) {
    ctx.fail(&node, std::string(key) + ": a duration needs a unit, e.g. \"30s\" (units ms, s, m, h, d)");
  }
  const std::string text = get_string(ctx, key, node);
  Millis value{};
  try {
    value = parse_duration(text);
  } catch (const ConfigError& e) {
    ctx.fail(&node, std::string(key) + ": " + quoted(text) + ": " + e.what());
  }
  if (!allow_zero && value.count() == 0) ctx.fail(&node, std::string(key) + ": must be longer than 0");
  return value;
}

std::size_t get_size(const Context& ctx, std::string_view key, const toml::node& node, std::uint64_t min) {
  std::uint64_t value = 0;
  if (const auto* i = node.as_integer()) {
    if (i->get() < 0) ctx.fail(&node, std::string(key) + ": must not be negative");
    value = static_cast<std::uint64_t>(i->get());
  } else {
    const std::string text = get_string(ctx, key, node);
    try {
      value = parse_size(text);
    } catch (const ConfigError& e) {
      ctx.fail(&node, std::string(key) + ": " + quoted(text) + ": " + e.what());
    }
  }
  if (value < min) ctx.fail(&node, std::string(key) + ": must be at least " + std::to_string(min) + " bytes");
  if (value > std::numeric_limits<std::size_t>::max() / 2) ctx.fail(&node, std::string(key) + ": too large");
  return static_cast<std::size_t>(value);
}

std::vector<std::string> get_string_array(const Context& ctx, std::string_view key, const toml::node& node) {
  const auto* arr = node.as_array();
  if (arr == nullptr) {
    ctx.fail(&node, std::string(key) + ": expected an array of strings, got " + std::string(type_name(node)));
  }
  std::vector<std::string> out;
  for (const auto& element : *arr) out.push_back(get_string(ctx, key, element));
  return out;
}

std::string get_header_name(const Context& ctx, std::string_view key, const toml::node& node) {
  std::string name = get_string(ctx, key, node);
  if (!is_token(name)) ctx.fail(&node, std::string(key) + ": " + quoted(name) + " is not a valid header name");
  return name;
}

// A string, or an array of strings (`keys = "a.json"` or `keys = ["old.pem", "new.pem"]`).
std::vector<std::string> get_strings(const Context& ctx, std::string_view key, const toml::node& node) {
  if (node.is_array()) return get_string_array(ctx, key, node);
  return {get_string(ctx, key, node)};
}

}  // namespace config_toml

using namespace config_toml;

namespace {

// Policy keys, shared by [idempotency] and [[route]]. Returns false for keys it does not know.
struct PolicyKeys {
  bool retention_set = false;
  bool min_set = false;
  bool max_set = false;
};

// Headers SPEC 5 never fingerprints: they differ between a request and its retry by design, so
// fingerprinting one would answer every honest retry 422. Why, or nullopt for any other header.
std::optional<std::string> volatile_header(std::string_view name) {
  static constexpr std::pair<std::string_view, std::string_view> kVolatile[] = {
      {"date", "a client sets it anew on every try"},
      {"traceparent", "a tracing client makes a new span for every try"},
      {"tracestate", "it follows traceparent"},
      {"x-request-id", "it names one try, not the operation"},
      {"x-amzn-trace-id", "a tracing client makes a new one for every try"},
      {"idempotency-key", "the key is what identifies the request, not part of it"},
      {"authorization", "a refreshed token would make every retry a mismatch; scope keys with [tenant]"},
      {"cookie", "session cookies change between tries; scope keys with [tenant]"},
      {"content-length", "the body is fingerprinted itself"},
      {"connection", "hop-by-hop"},
      {"keep-alive", "hop-by-hop"},
      {"te", "hop-by-hop"},
      {"transfer-encoding", "hop-by-hop"},
      {"upgrade", "hop-by-hop"},
      {"expect", "hop-by-hop"},
      {"x-forwarded-for", "proxies add to it"},
      {"forwarded", "proxies add to it"},
      {"via", "proxies add to it"},
  };
  const std::string lowered = lower(name);
  for (const auto& [header, why] : kVolatile) {
    if (lowered == header) return std::string(why);
  }
  return std::nullopt;
}

void apply_fingerprint(const Context& ctx, const toml::node& node, FingerprintOptions& fp) {
  const auto* table = node.as_table();
  if (table == nullptr) {
    ctx.fail(&node, "fingerprint: expected a table (fingerprint.json_ignore, fingerprint.headers), got " +
                        std::string(type_name(node)));
  }
  for (const auto& [k, v] : *table) {
    const std::string_view key = k.str();
    if (key == "json_ignore") {
      fp.json_ignore = get_string_array(ctx, "fingerprint.json_ignore", v);
      for (const auto& pointer : fp.json_ignore) {
        if (pointer.empty() || pointer.front() != '/') {
          ctx.fail(&v, "fingerprint.json_ignore: " + quoted(pointer) +
                           " is not a JSON Pointer to a member (it must start with \"/\")");
        }
      }
    } else if (key == "headers") {
      fp.headers = get_string_array(ctx, "fingerprint.headers", v);
      for (const auto& name : fp.headers) {
        if (!is_token(name)) ctx.fail(&v, "fingerprint.headers: " + quoted(name) + " is not a valid header name");
        if (const auto why = volatile_header(name)) {
          ctx.fail(&v, "fingerprint.headers: " + quoted(name) + " is never fingerprinted (SPEC 5): " + *why);
        }
      }
    } else {
      ctx.fail(&v, "unknown key " + quoted("fingerprint." + std::string(key)));
    }
  }
}

bool apply_policy_key(const Context& ctx, std::string_view key, const toml::node& node, Policy& policy,
                      PolicyKeys& seen) {
  if (key == "header") {
    policy.key_header = get_header_name(ctx, key, node);
  } else if (key == "key_min_length") {
    policy.key.min_length = static_cast<std::size_t>(get_int(ctx, key, node, 1, 4096));
    seen.min_set = true;
  } else if (key == "key_max_length") {
    policy.key.max_length = static_cast<std::size_t>(get_int(ctx, key, node, 1, 4096));
    seen.max_set = true;
  } else if (key == "retention") {
    policy.retention = get_duration(ctx, key, node);
    seen.retention_set = true;
  } else if (key == "lease") {
    policy.lease = get_duration(ctx, key, node);
  } else if (key == "retry_after") {
    const Millis d = get_duration(ctx, key, node);
    // Retry-After carries whole seconds; round up so a client never retries early.
    policy.retry_after = std::max<std::chrono::seconds>(std::chrono::ceil<std::chrono::seconds>(d), 1s);
  } else if (key == "store_server_errors") {
    policy.store_server_errors = get_bool(ctx, key, node);
  } else if (key == "on_lease_expiry") {
    const std::string v = get_string(ctx, key, node);
    if (v == "reexecute") {
      policy.on_lease_expiry = LeaseExpiry::reexecute;
    } else if (v == "unknown") {
      policy.on_lease_expiry = LeaseExpiry::unknown;
    } else if (v == "ask") {
      policy.on_lease_expiry = LeaseExpiry::ask;
    } else {
      ctx.fail(&node, "on_lease_expiry: " + quoted(v) + ": expected \"reexecute\", \"unknown\" or \"ask\"");
    }
  } else if (key == "fingerprint") {
    apply_fingerprint(ctx, node, policy.fingerprint);
  } else {
    return false;
  }
  return true;
}

void check_key_bounds(const Context& ctx, const toml::node* node, const Policy& policy) {
  if (policy.key.min_length > policy.key.max_length) {
    ctx.fail(node, "key_min_length (" + std::to_string(policy.key.min_length) + ") is greater than key_max_length (" +
                       std::to_string(policy.key.max_length) + ")");
  }
}

void warn_retention(Config& config, const std::string& where, Millis retention) {
  if (retention < 1h || retention > 24h * 7) {
    config.warnings.push_back(where + "retention of " + std::to_string(retention.count()) +
                              " ms is outside 1h-7d (SPEC 4.3): clients retrying later than that re-execute");
  }
}

const toml::table& expect_table(const Context& ctx, std::string_view key, const toml::node& node) {
  const auto* table = node.as_table();
  if (table == nullptr) ctx.fail(&node, quoted(key) + ": expected a table [" + std::string(key) + "]");
  return *table;
}

// `errors`: "problem+json", "stripe", or { template = "FILE", content_type = "..." }. A template
// is read and checked here: one that does not render JSON stops the start (or a reload).
std::shared_ptr<const ErrorEnvelope> get_errors(const Context& ctx, const toml::node& node) {
  if (const auto* s = node.as_string()) {
    if (s->get() == "problem+json") return ErrorEnvelope::problem_json();
    if (s->get() == "stripe") return ErrorEnvelope::stripe();
    ctx.fail(&node, "errors: " + quoted(s->get()) +
                        ": expected \"problem+json\", \"stripe\" or a table { template = \"FILE\", content_type = \"...\" }");
  }
  const auto* table = node.as_table();
  if (table == nullptr) {
    ctx.fail(&node, "errors: expected \"problem+json\", \"stripe\" or a table, got " + std::string(type_name(node)));
  }
  std::string file;
  std::string content_type = "application/json";
  for (const auto& [k, v] : *table) {
    if (k.str() == "template") {
      file = get_string(ctx, "errors.template", v);
    } else if (k.str() == "content_type") {
      content_type = get_string(ctx, "errors.content_type", v);
    } else {
      ctx.fail(&v, "unknown key " + quoted("errors." + std::string(k.str())));
    }
  }
  if (file.empty()) ctx.fail(&node, "errors: a table needs template = \"FILE\" (a JSON file with placeholders)");
  auto envelope = ErrorEnvelope::load_template(file, std::move(content_type));
  if (!envelope) ctx.fail(&node, "errors: " + envelope.error());
  return std::move(*envelope);
}

void parse_idempotency(const Context& parent, const toml::node& node, Config& config) {
  const Context ctx{parent.source, "[idempotency]"};
  const auto& table = expect_table(parent, "idempotency", node);
  PolicyKeys seen;
  for (const auto& [k, v] : table) {
    if (k.str() == "advertise_expiry") {
      config.advertise_expiry = get_bool(ctx, "advertise_expiry", v);
    } else if (k.str() == "allow_short_lease") {
      config.allow_short_lease = get_bool(ctx, "allow_short_lease", v);
    } else if (k.str() == "ask") {
      ctx.fail(&v, "ask: only in a [[route]]: the lookup is the route's own (on_lease_expiry = \"ask\")");
    } else if (!apply_policy_key(ctx, k.str(), v, config.defaults, seen)) {
      ctx.fail(&v, "unknown key " + quoted(k.str()));
    }
  }
  if (config.defaults.on_lease_expiry == LeaseExpiry::ask) {
    ctx.fail(table.get("on_lease_expiry"),
             "on_lease_expiry = \"ask\" only in a [[route]], with its lookup (ask = \"GET /...{key}\"): requests no "
             "route lists have no lookup");
  }
  check_key_bounds(ctx, &node, config.defaults);
}

// The keys of a tenant table that only from = "jwt" takes.
constexpr std::string_view kJwtKeys[] = {"claims", "keys",   "secret_file", "algorithms",
                                         "audience", "issuer", "leeway",      "cache_size"};

bool is_jwt_key(std::string_view key) {
  for (const auto k : kJwtKeys) {
    if (k == key) return true;
  }
  return false;
}

std::vector<auth::Algorithm> get_algorithms(const Context& ctx, const toml::node& node) {
  std::vector<auth::Algorithm> out;
  for (const auto& name : get_string_array(ctx, "algorithms", node)) {
    if (lower(name) == "none") {
      ctx.fail(&node, "algorithms: never \"none\": an unsigned token proves nothing");
    }
    const auto a = auth::parse_algorithm(name);
    if (!a) {
      ctx.fail(&node, "algorithms: " + quoted(name) +
                          ": expected RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, ES512, HS256, HS384 or HS512");
    }
    out.push_back(*a);
  }
  if (out.empty()) ctx.fail(&node, "algorithms: list at least one algorithm, e.g. [\"RS256\"]");
  return out;
}

// A [tenant] table, or a route's (already merged with [tenant]'s, see parse_route).
TenantSetting parse_tenant_table(const Context& ctx, const toml::table& table, const toml::node* where,
                                 Config& config) {
  std::optional<std::string> header;
  std::optional<std::string> from;
  const toml::node* from_node = nullptr;
  const toml::node* jwt_node = nullptr;  // the first key only from = "jwt" takes
  std::string jwt_key;
  auth::JwtOptions jwt;
  std::optional<std::string> identity;  // from = "client_cert"
  const toml::node* identity_node = nullptr;
  for (const auto& [k, v] : table) {
    const std::string_view key = k.str();
    if (is_jwt_key(key) && jwt_node == nullptr) {
      jwt_node = &v;
      jwt_key = std::string(key);
    }
    if (key == "header") {
      header = get_header_name(ctx, "header", v);
    } else if (key == "from") {
      from = get_string(ctx, "from", v);
      from_node = &v;
    } else if (key == "identity") {
      identity = get_string(ctx, key, v);
      identity_node = &v;
    } else if (key == "claims") {
      jwt.claims = get_strings(ctx, key, v);
    } else if (key == "keys") {
      jwt.key_files = get_strings(ctx, key, v);
      if (jwt.key_files.empty()) ctx.fail(&v, "keys: list at least one file");
    } else if (key == "secret_file") {
      jwt.secret_file = get_string(ctx, key, v);
      if (jwt.secret_file.empty()) ctx.fail(&v, "secret_file: must not be empty");
    } else if (key == "algorithms") {
      jwt.algorithms = get_algorithms(ctx, v);
    } else if (key == "audience") {
      jwt.audience = get_string(ctx, key, v);
    } else if (key == "issuer") {
      jwt.issuer = get_string(ctx, key, v);
    } else if (key == "leeway") {
      jwt.leeway = get_duration(ctx, key, v, /*allow_zero=*/true);
    } else if (key == "cache_size") {
      jwt.cache_size = static_cast<std::size_t>(get_int(ctx, key, v, 0, 10'000'000));
    } else {
      ctx.fail(&v, "unknown key " + quoted(key));
    }
  }
  TenantSetting setting;
  if (from && *from == "jwt") {
    if (header) ctx.fail(from_node, "from = \"jwt\" takes no header: the token is read from Authorization");
    std::vector<std::string> warnings;
    auto keys = auth::KeySet::load(std::move(jwt), &warnings);
    if (!keys) {
      // The message starts with the key it is about ("keys \"FILE\": ..."): point at its line.
      const std::string& e = keys.error();
      const toml::node* at = where;
      for (const auto k : kJwtKeys) {
        if (e.starts_with(k) && e.size() > k.size() && (e[k.size()] == ' ' || e[k.size()] == ':')) {
          if (const toml::node* n = table.get(k)) at = n;
          break;
        }
      }
      ctx.fail(at, e);
    }
    for (auto& w : warnings) config.warnings.push_back(ctx.where + ": " + w);
    if ((*keys)->options().leeway > 5min) {
      config.warnings.push_back(ctx.where + ": leeway of " + std::to_string((*keys)->options().leeway.count()) +
                                " ms accepts tokens that expired that long ago; a minute or two covers clock skew");
    }
    setting.jwt = std::move(*keys);
    return setting;
  }
  if (jwt_node != nullptr) ctx.fail(jwt_node, jwt_key + ": only with from = \"jwt\"");
  if (from && *from == "client_cert") {
    if (header) ctx.fail(from_node, "from = \"client_cert\" takes no header: the tenant is the verified client certificate's");
    setting.client_cert = identity ? parse_certificate_identity(ctx, *identity_node, *identity)
                                   : CertificateIdentity::subject;
    return setting;
  }
  if (identity_node != nullptr) ctx.fail(identity_node, "identity: only with from = \"client_cert\"");
  if (from && *from == "authorization") {
    if (header) ctx.fail(from_node, "use either header = \"...\" or from = \"authorization\", not both");
    setting.rule.source = TenantRule::Source::authorization;
  } else if (from && *from == "none") {
    if (header) ctx.fail(from_node, "from = \"none\" takes no header");
    setting.rule.source = TenantRule::Source::none;
  } else if (from && *from != "header") {
    ctx.fail(from_node, "from: " + quoted(*from) +
                            ": expected \"header\", \"authorization\", \"jwt\", \"client_cert\" or \"none\"");
  } else if (header || from) {
    setting.rule.source = TenantRule::Source::header;
    if (header) setting.rule.header = *header;
  }
  return setting;
}

void parse_tenant(const Context& parent, const toml::node& node, Config& config) {
  const Context ctx{parent.source, "[tenant]"};
  const auto& table = expect_table(parent, "tenant", node);
  config.tenant = parse_tenant_table(ctx, table, &node, config);
}

// [encryption]: the key file is read here, so a missing, malformed or world-readable one stops
// the start (exit 2) instead of failing the first request that completes.
void parse_encryption(const Context& parent, const toml::node& node, Config& config) {
  const Context ctx{parent.source, "[encryption]"};
  const auto& table = expect_table(parent, "encryption", node);
  const toml::node* file_node = nullptr;
  for (const auto& [k, v] : table) {
    if (k.str() == "key_file") {
      config.encryption_key_file = get_string(ctx, "key_file", v);
      if (config.encryption_key_file.empty()) ctx.fail(&v, "key_file: must not be empty");
      file_node = &v;
    } else {
      ctx.fail(&v, "unknown key " + quoted(k.str()));
    }
  }
  if (file_node == nullptr) ctx.fail(&node, "missing key \"key_file\" (leave [encryption] out to store responses unencrypted)");
  std::vector<std::string> warnings;
  auto keys = KeyRing::load(config.encryption_key_file, &warnings);
  // No "(line N)" of the TOML file: the message names the key file, and its own line.
  if (!keys) ctx.fail(nullptr, "key_file: " + keys.error());
  for (auto& w : warnings) config.warnings.push_back("[encryption]: " + w);
  config.encryption_keys = std::move(*keys);
}

std::string describe(const Route& route) {
  std::string methods;
  for (const auto& m : route.methods) methods += (methods.empty() ? "" : ",") + m;
  return methods + " " + route.path.text();
}

// A route's `tenant` table overrides [tenant]'s keys one by one, like the policy keys; one that
// names its own source (from or header) starts afresh instead, so that [tenant]'s JWT keys, say,
// do not follow a route that takes its tenant from a header.
TenantSetting parse_route_tenant(const Context& route_ctx, const toml::node& node, const toml::table* global,
                                 Config& config) {
  const Context ctx{route_ctx.source, route_ctx.where + ": tenant"};
  const auto* own = node.as_table();
  if (own == nullptr) ctx.fail(&node, "expected a table (tenant.from = \"...\", or [route.tenant])");
  toml::table merged;
  if (global != nullptr && !own->contains("from") && !own->contains("header")) merged = *global;
  for (const auto& [k, v] : *own) merged.insert_or_assign(k, toml::node_view<const toml::node>(v));
  return parse_tenant_table(ctx, merged, &node, config);
}

void parse_route(const Context& ctx, const toml::table& table, const toml::table* global_tenant, Config& config) {
  Route route;
  route.policy = config.defaults;
  route.policy.key_required = true;
  route.options = default_route_options(config);
  PolicyKeys seen;
  bool have_path = false;
  const toml::node* ask_node = nullptr;
  const toml::node* webhook_node = nullptr;
  for (const auto& [k, v] : table) {
    const std::string_view key = k.str();
    if (key == "method") {
      std::vector<std::string> methods;
      if (v.is_array()) {
        methods = get_string_array(ctx, "method", v);
      } else {
        methods.push_back(get_string(ctx, "method", v));
      }
      if (methods.empty()) ctx.fail(&v, "method: list at least one method");
      for (auto& m : methods) {
        if (!is_token(m)) ctx.fail(&v, "method: " + quoted(m) + " is not an HTTP method");
        m = upper(m);
        if (is_safe_method(m)) {
          ctx.fail(&v, "method: " + m + " is never handled (safe methods always pass through, SPEC 3); remove the route");
        }
      }
      route.methods = std::move(methods);
    } else if (key == "path") {
      const std::string text = get_string(ctx, "path", v);
      try {
        route.path = PathPattern(text);
      } catch (const std::invalid_argument& e) {
        ctx.fail(&v, "path " + quoted(text) + ": " + e.what());
      }
      have_path = true;
    } else if (key == "required") {
      route.policy.key_required = get_bool(ctx, "required", v);
    } else if (key == "tenant") {
      route.tenant = parse_route_tenant(ctx, v, global_tenant, config);
    } else if (key == "errors") {
      route.options.errors = get_errors(ctx, v);
    } else if (key == "max_body") {
      route.options.max_body = get_size(ctx, key, v);
    } else if (key == "max_stored_response") {
      route.options.max_stored_response = get_size(ctx, key, v);
    } else if (key == "advertise_expiry") {
      route.options.advertise_expiry = get_bool(ctx, key, v);
    } else if (key == "allow_short_lease") {
      route.options.allow_short_lease = get_bool(ctx, key, v);
    } else if (key == "grpc_retryable") {
      route.options.grpc_retryable = 0;
      for (const std::string& text : get_string_array(ctx, key, v)) {
        const auto code = grpc::parse_code(text);
        if (!code) ctx.fail(&v, "grpc_retryable: " + quoted(text) + " is not a gRPC status (e.g. \"UNAVAILABLE\")");
        if (*code == grpc::Code::ok) ctx.fail(&v, "grpc_retryable: OK is a success, always stored");
        route.options.grpc_retryable |= 1u << static_cast<unsigned>(*code);
      }
    } else if (key == "ask") {
      const std::string text = get_string(ctx, key, v);
      if (auto lookup = http::parse_lookup(text); !lookup) ctx.fail(&v, "ask: " + quoted(text) + ": " + lookup.error());
      route.policy.lookup = text;
      ask_node = &v;
    } else if (key == "webhook") {
      webhook_node = &v;  // parsed once the path is known (the default tenant is named after it)
    } else if (!apply_policy_key(ctx, key, v, route.policy, seen)) {
      ctx.fail(&v, "unknown key " + quoted(key));
    }
  }
  if (route.methods.empty()) ctx.fail(&table, "missing key \"method\"");
  if (!have_path) ctx.fail(&table, "missing key \"path\"");
  if (route.policy.on_lease_expiry == LeaseExpiry::ask && ask_node == nullptr) {
    ctx.fail(table.get("on_lease_expiry"),
             "on_lease_expiry = \"ask\" needs the upstream's lookup: ask = \"GET /v1/things/by-idempotency-key/{key}\"");
  }
  if (ask_node != nullptr && route.policy.on_lease_expiry != LeaseExpiry::ask) {
    ctx.fail(ask_node, "ask: only with on_lease_expiry = \"ask\" (this route's is another)");
  }
  if (webhook_node != nullptr) {
    if (route.tenant) ctx.fail(table.get("tenant"), "tenant: a webhook route's tenant is webhook.tenant");
    if (table.contains("required")) {
      ctx.fail(table.get("required"), "required: a webhook route always has a key (the verified event's id)");
    }
    route.webhook = parse_webhook(ctx, *webhook_node, route.path.text());
    // Providers retry for up to three days: a week of memory outlasts them. Event ids are the
    // provider's, not client-made random keys, so any length the key rules allow is accepted.
    if (!seen.retention_set) route.policy.retention = 24h * 7;
    if (!seen.min_set) route.policy.key.min_length = 1;
  }
  check_key_bounds(ctx, &table, route.policy);
  if (seen.retention_set) warn_retention(config, ctx.where + " (" + describe(route) + "): ", route.policy.retention);
  config.routes.push_back(std::move(route));
}

template <class F>
auto wrap(const Context& ctx, const toml::node* node, std::string_view key, const std::string& text, F&& parse) {
  try {
    return parse(text);
  } catch (const ConfigError& e) {
    ctx.fail(node, std::string(key) + ": " + e.what());
  }
}

void parse_top(const Context& ctx, const toml::table& root, Config& config) {
  for (const auto& [k, v] : root) {
    const std::string_view key = k.str();
    if (key == "listen") {
      const std::string text = get_string(ctx, key, v);
      config.plain_listener = text != "off";
      if (config.plain_listener) config.listen = wrap(ctx, &v, key, text, parse_listen_address);
    } else if (key == "admin_listen") {
      const std::string text = get_string(ctx, key, v);
      if (text == "off") {
        config.admin_listen.reset();
      } else {
        config.admin_listen = wrap(ctx, &v, key, text, parse_listen_address);
      }
    } else if (key == "upstream") {
      config.upstream = wrap(ctx, &v, key, get_string(ctx, key, v), parse_upstream_url);
    } else if (key == "store") {
      config.store = wrap(ctx, &v, key, get_string(ctx, key, v), parse_store_url);
    } else if (key == "upstream_protocol") {
      const std::string protocol = get_string(ctx, key, v);
      if (protocol == "h2") {
        config.upstream_http2 = true;
      } else if (protocol == "http/1.1") {
        config.upstream_http2 = false;
      } else {
        ctx.fail(&v, "upstream_protocol: " + quoted(protocol) + ": expected \"http/1.1\" or \"h2\"");
      }
    } else if (key == "upstream_timeout") {
      config.upstream_timeout = get_duration(ctx, key, v);
    } else if (key == "upstream_connect_timeout") {
      config.upstream_connect_timeout = get_duration(ctx, key, v);
    } else if (key == "upstream_idle_timeout") {
      config.upstream_idle_timeout = get_duration(ctx, key, v, /*allow_zero=*/true);
    } else if (key == "upstream_resolve_interval") {
      config.upstream_resolve_interval = get_duration(ctx, key, v, /*allow_zero=*/true);
    } else if (key == "upstream_attempt_header") {
      config.upstream_attempt_header = get_header_name(ctx, key, v);
    } else if (key == "upstream_tenant_header") {
      config.upstream_tenant_header = get_header_name(ctx, key, v);
    } else if (key == "lookup_timeout") {
      config.lookup_timeout = get_duration(ctx, key, v);
    } else if (key == "lookup_rate") {
      config.lookup_rate = static_cast<double>(get_int(ctx, key, v, 1, 1'000'000));
    } else if (key == "upstream_max_idle") {
      config.upstream_max_idle = static_cast<std::size_t>(get_int(ctx, key, v, 0, 100000));
    } else if (key == "max_body") {
      config.max_body = get_size(ctx, key, v);
    } else if (key == "max_header") {
      config.max_header = get_size(ctx, key, v, 1024);
      // Beast keeps a header field's length in 16 bits and throws (out of the event loop, the
      // connection dropped unanswered) for a longer field; a header block of at most 64 KiB
      // cannot hold one, so a longer field is answered 431 instead.
      if (config.max_header > 64 * 1024) {
        ctx.fail(&v, "max_header: at most 64KiB (the HTTP parser cannot hold a longer header field)");
      }
    } else if (key == "max_stored_response") {
      config.max_stored_response = get_size(ctx, key, v);
    } else if (key == "max_connections") {
      config.max_connections = static_cast<std::size_t>(get_int(ctx, key, v, 1, 10'000'000));
    } else if (key == "idle_timeout") {
      config.idle_timeout = get_duration(ctx, key, v);
    } else if (key == "client_timeout") {
      config.client_timeout = get_duration(ctx, key, v);
    } else if (key == "store_timeout") {
      config.store_timeout = get_duration(ctx, key, v);
    } else if (key == "drain_timeout") {
      config.drain_timeout = get_duration(ctx, key, v, /*allow_zero=*/true);
    } else if (key == "threads") {
      config.threads = static_cast<unsigned>(get_int(ctx, key, v, 0, 256));
    } else if (key == "reaper_interval") {
      config.reaper_interval = get_duration(ctx, key, v, /*allow_zero=*/true);
    } else if (key == "reaper_batch") {
      config.reaper_batch = static_cast<std::size_t>(get_int(ctx, key, v, 1, 1'000'000));
    } else if (key == "log_level") {
      const std::string level = get_string(ctx, key, v);
      if (level == "error") {
        config.log_level = LogLevel::error;
      } else if (level == "warn") {
        config.log_level = LogLevel::warn;
      } else if (level == "info") {
        config.log_level = LogLevel::info;
      } else if (level == "debug") {
        config.log_level = LogLevel::debug;
      } else {
        ctx.fail(&v, "log_level: " + quoted(level) + ": expected \"error\", \"warn\", \"info\" or \"debug\"");
      }
    } else if (key == "log_format") {
      const std::string format = get_string(ctx, key, v);
      if (format == "text") {
        config.log_format = LogFormat::text;
      } else if (format == "json") {
        config.log_format = LogFormat::json;
      } else {
        ctx.fail(&v, "log_format: " + quoted(format) + ": expected \"text\" or \"json\"");
      }
    } else if (key == "errors") {
      config.errors = get_errors(ctx, v);
    } else if (key == "encryption") {
      parse_encryption(ctx, v, config);
    } else if (key == "tls") {
      parse_tls(ctx, v, config);
    } else if (key == "http2") {
      parse_http2(ctx, v, config);
    } else if (key == "upstream_tls") {
      parse_upstream_tls(ctx, v, config);
    } else if (key == "idempotency" || key == "tenant" || key == "route") {
      // Parsed after every top-level key, so routes inherit the finished [idempotency].
    } else {
      ctx.fail(&v, "unknown key " + quoted(key));
    }
  }
  if (const auto* node = root.get("idempotency")) parse_idempotency(ctx, *node, config);
  warn_retention(config, "[idempotency]: ", config.defaults.retention);
  if (const auto* node = root.get("tenant")) parse_tenant(ctx, *node, config);
  if (const auto* node = root.get("route")) {
    const auto* routes = node->as_array();
    if (routes == nullptr || !routes->is_array_of_tables()) {
      ctx.fail(node, "\"route\": expected an array of tables, written [[route]]");
    }
    int n = 0;
    for (const auto& element : *routes) {
      ++n;
      const Context route_ctx{ctx.source, "[[route]] #" + std::to_string(n)};
      const toml::node* global_tenant = root.get("tenant");
      parse_route(route_ctx, *element.as_table(), global_tenant ? global_tenant->as_table() : nullptr, config);
    }
  }
}

void apply_overrides(const Overrides& o, Config& config) {
  auto flag = [](std::string_view name, const std::string& text, auto parse) {
    try {
      return parse(text);
    } catch (const ConfigError& e) {
      // Store URLs may carry a password: echo them redacted.
      throw ConfigError(std::string(name) + " " + quoted(redact_url(text)) + ": " + e.what());
    }
  };
  if (o.listen) config.listen = flag("--listen", *o.listen, parse_listen_address);
  if (o.upstream) config.upstream = flag("--upstream", *o.upstream, parse_upstream_url);
  if (o.store) config.store = flag("--store", *o.store, parse_store_url);
  if (o.admin_listen) {
    if (*o.admin_listen == "off") {
      config.admin_listen.reset();
    } else {
      config.admin_listen = flag("--admin-listen", *o.admin_listen, parse_listen_address);
    }
  }
}

// The headers the gateway sets on forwarded requests must not be ones it reads a key from.
void check_upstream_headers(const Config& config) {
  if (lower(config.upstream_attempt_header) == lower(config.upstream_tenant_header)) {
    throw ConfigError("upstream_attempt_header and upstream_tenant_header are both " +
                      quoted(config.upstream_attempt_header) + ": give them different names");
  }
  auto check = [&](const Policy& policy, const std::string& where) {
    for (const auto* name : {&config.upstream_attempt_header, &config.upstream_tenant_header}) {
      if (lower(*name) == lower(policy.key_header)) {
        throw ConfigError(where + "header " + quoted(policy.key_header) +
                          " is also the header the gateway sends the upstream the attempt or tenant in (" +
                          quoted(*name) + "); rename one");
      }
    }
  };
  // While the first call may still execute (up to upstream_timeout), its key must stay held:
  // a shorter lease lets a retry take it over and execute alongside.
  auto check_lease = [&](const Policy& policy, bool allowed, const std::string& where) {
    if (allowed || policy.lease > config.upstream_timeout) return;
    throw ConfigError(where + "lease (" + std::to_string(policy.lease.count()) +
                      " ms) is not longer than upstream_timeout (" + std::to_string(config.upstream_timeout.count()) +
                      " ms): a retry could take the key over while the first call still executes; raise lease, "
                      "lower upstream_timeout, or set allow_short_lease = true");
  };
  check(config.defaults, "[idempotency]: ");
  check_lease(config.defaults, config.allow_short_lease, "[idempotency]: ");
  for (std::size_t i = 0; i < config.routes.size(); ++i) {
    const Policy& policy = config.routes[i].policy;
    const std::string where = "[[route]] #" + std::to_string(i + 1) + ": ";
    check(policy, where);
    check_lease(policy, config.routes[i].options.allow_short_lease, where);
    // The asking retry holds the key for a lease: a lookup outliving it would let a second
    // retry take the key over and ask (or execute) at the same time.
    if (policy.on_lease_expiry == LeaseExpiry::ask && policy.lease <= config.lookup_timeout) {
      throw ConfigError(where + "lease (" + std::to_string(policy.lease.count()) +
                        " ms) must be longer than lookup_timeout (" + std::to_string(config.lookup_timeout.count()) +
                        " ms) on a route with on_lease_expiry = \"ask\"");
    }
  }
}

void finish(Config& config) {
  check_upstream_headers(config);
  if (!config.plain_listener && !config.tls) throw ConfigError("listen = \"off\" needs a [tls] listener: the gateway would listen nowhere");
  load_tls_contexts(config);
  if (config.store.kind == StoreUrl::Kind::memory) {
    config.warnings.push_back(
        "store memory: records live in this process only; a restart forgets every key (use sqlite:PATH in production)");
  }
  if (config.max_stored_response < 1024) {
    config.warnings.push_back("max_stored_response below 1KiB: most responses will not be replayable");
  }
}

}  // namespace

RouteOptions default_route_options(const Config& config) {
  RouteOptions options;
  options.errors = config.errors;
  options.max_body = config.max_body;
  options.max_stored_response = config.max_stored_response;
  options.advertise_expiry = config.advertise_expiry;
  options.allow_short_lease = config.allow_short_lease;
  return options;
}

std::string ListenAddress::text() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

Millis parse_duration(std::string_view text) {
  static const char* kHint = "expected a duration like \"30s\" or \"1h30m\" (units ms, s, m, h, d)";
  if (text.empty()) throw ConfigError(kHint);
  std::uint64_t total = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    if (!std::isdigit(static_cast<unsigned char>(text[i]))) throw ConfigError(kHint);
    std::uint64_t n = 0;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      if (n > (kMaxU64 - 9) / 10) throw ConfigError("duration too large");
      n = n * 10 + static_cast<std::uint64_t>(text[i] - '0');
      ++i;
    }
    const std::size_t unit_start = i;
    while (i < text.size() && std::isalpha(static_cast<unsigned char>(text[i]))) ++i;
    const std::string_view unit = text.substr(unit_start, i - unit_start);
    std::uint64_t scale = 0;
    if (unit == "ms") {
      scale = 1;
    } else if (unit == "s") {
      scale = 1000;
    } else if (unit == "m") {
      scale = 60'000;
    } else if (unit == "h") {
      scale = 3'600'000;
    } else if (unit == "d") {
      scale = 86'400'000;
    } else if (unit.empty() && i < text.size() && (text[i] == '.' || text[i] == ',')) {
      throw ConfigError("no fractions (write \"1500ms\", not \"1.5s\"); " + std::string(kHint));
    } else if (unit.empty()) {
      throw ConfigError("missing unit; " + std::string(kHint));
    } else {
      throw ConfigError("unknown unit " + quoted(unit) + "; " + kHint);
    }
    if (n > (kMaxU64 / 4) / scale || total > kMaxU64 / 4 - n * scale) throw ConfigError("duration too large");
    total += n * scale;
  }
  if (total > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max() / 4)) {
    throw ConfigError("duration too large");
  }
  return Millis{static_cast<std::int64_t>(total)};
}

std::uint64_t parse_size(std::string_view text) {
  static const char* kHint = "expected a size like \"1MiB\", \"512KiB\" or \"10MB\" (units B, KiB, MiB, GiB, KB, MB, GB)";
  std::size_t i = 0;
  std::uint64_t n = 0;
  if (text.empty() || !std::isdigit(static_cast<unsigned char>(text[0]))) throw ConfigError(kHint);
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    if (n > (kMaxU64 - 9) / 10) throw ConfigError("size too large");
    n = n * 10 + static_cast<std::uint64_t>(text[i] - '0');
    ++i;
  }
  while (i < text.size() && text[i] == ' ') ++i;
  const std::string unit = lower(text.substr(i));
  std::uint64_t scale = 0;
  if (unit.empty() || unit == "b") {
    scale = 1;
  } else if (unit == "kib") {
    scale = 1024;
  } else if (unit == "mib") {
    scale = 1024 * 1024;
  } else if (unit == "gib") {
    scale = 1024ull * 1024 * 1024;
  } else if (unit == "kb") {
    scale = 1000;
  } else if (unit == "mb") {
    scale = 1000 * 1000;
  } else if (unit == "gb") {
    scale = 1000ull * 1000 * 1000;
  } else {
    throw ConfigError("unknown unit " + quoted(text.substr(i)) + "; " + kHint);
  }
  if (n > kMaxU64 / scale) throw ConfigError("size too large");
  return n * scale;
}

ListenAddress parse_listen_address(std::string_view text) {
  static const char* kHint = "expected HOST:PORT, e.g. \"127.0.0.1:8080\" or \"[::1]:8080\"";
  ListenAddress out;
  std::string_view port;
  if (!text.empty() && text.front() == '[') {
    const auto close = text.find(']');
    if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      throw ConfigError(kHint);
    }
    out.host = std::string(text.substr(1, close - 1));
    port = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string_view::npos) throw ConfigError(kHint);
    out.host = std::string(text.substr(0, colon));
    if (out.host.find(':') != std::string::npos) throw ConfigError("IPv6 hosts go in brackets: \"[::1]:8080\"");
    port = text.substr(colon + 1);
  }
  if (out.host.empty()) out.host = "0.0.0.0";
  if (port.empty() || port.size() > 5) throw ConfigError(kHint);
  unsigned value = 0;
  for (const char c : port) {
    if (!std::isdigit(static_cast<unsigned char>(c))) throw ConfigError(kHint);
    value = value * 10 + static_cast<unsigned>(c - '0');
  }
  if (value > 65535) throw ConfigError("port " + std::string(port) + " is outside 0..65535");
  out.port = static_cast<std::uint16_t>(value);
  return out;
}

UpstreamUrl parse_upstream_url(std::string_view text) {
  static const char* kHint = "expected http://HOST[:PORT] or https://HOST[:PORT]";
  UpstreamUrl out;
  std::string_view rest;
  if (text.starts_with("https://")) {
    out.tls = true;
    out.port = 443;
    rest = text.substr(8);
  } else if (text.starts_with("http://")) {
    rest = text.substr(7);
  } else {
    throw ConfigError(kHint);
  }
  if (rest.ends_with('/')) rest.remove_suffix(1);
  if (rest.find_first_of("/?#@") != std::string_view::npos) {
    throw ConfigError("the upstream URL takes no path, query or credentials; " + std::string(kHint));
  }
  if (rest.empty()) throw ConfigError(kHint);
  out.authority = std::string(rest);
  std::string_view port;
  if (rest.front() == '[') {
    const auto close = rest.find(']');
    if (close == std::string_view::npos) throw ConfigError(kHint);
    out.host = std::string(rest.substr(1, close - 1));
    if (close + 1 < rest.size()) {
      if (rest[close + 1] != ':') throw ConfigError(kHint);
      port = rest.substr(close + 2);
    }
  } else {
    const auto colon = rest.find(':');
    out.host = std::string(rest.substr(0, colon));
    if (colon != std::string_view::npos) port = rest.substr(colon + 1);
  }
  if (out.host.empty()) throw ConfigError(kHint);
  if (!port.empty() || rest.ends_with(':')) {
    if (port.empty() || port.size() > 5) throw ConfigError(kHint);
    unsigned value = 0;
    for (const char c : port) {
      if (!std::isdigit(static_cast<unsigned char>(c))) throw ConfigError(kHint);
      value = value * 10 + static_cast<unsigned>(c - '0');
    }
    if (value == 0 || value > 65535) throw ConfigError("port " + std::string(port) + " is outside 1..65535");
    out.port = static_cast<std::uint16_t>(value);
  }
  return out;
}

StoreUrl parse_store_url(std::string_view text) {
  // The one list of store URLs is open_store's; its messages never echo a password.
  if (auto problem = check_store_url(text)) throw ConfigError(*problem);
  StoreUrl out;
  out.text = std::string(text);
  if (text.starts_with("memory")) {
    out.kind = StoreUrl::Kind::memory;
  } else if (auto path = sqlite_path_of(text)) {
    out.kind = StoreUrl::Kind::sqlite;
    out.path = std::move(*path);
  } else {
    out.kind = StoreUrl::Kind::shared;
  }
  return out;
}

Config parse_config(std::string_view text, std::string_view source, const Overrides& overrides) {
  Config config;
  const Context ctx{std::string(source), ""};
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    std::string message = std::string(source);
    if (e.source().begin.line > 0) {
      message += ":" + std::to_string(e.source().begin.line) + ":" + std::to_string(e.source().begin.column);
    }
    // toml++ quotes what it saw, which can be a line break of the file.
    throw ConfigError(message + ": " + without_controls(e.description()));
  }
  parse_top(ctx, root, config);
  apply_overrides(overrides, config);
  finish(config);
  return config;
}

Config load_config(const std::optional<std::string>& path, const Overrides& overrides) {
  if (!path) {
    Config config;
    apply_overrides(overrides, config);
    finish(config);
    return config;
  }
  std::ifstream in(*path, std::ios::binary);
  if (!in) throw ConfigError(*path + ": cannot read the file");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return parse_config(buffer.str(), *path, overrides);
}

}  // namespace idem::gateway
