#include "idem/gateway/config.hpp"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>


namespace idem::gateway {
namespace {

using namespace std::chrono_literals;

// The error message parse_config throws for `toml`, or "" if it parsed.
std::string error_of(std::string_view toml, const Overrides& overrides = {}) {
  try {
    parse_config(toml, "config.toml", overrides);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// main() prints a ConfigError as one line; the file's own line breaks must not split it (found by
// fuzz/config_fuzz: toml++ quotes the bytes it saw, a key may hold an escaped line break).
TEST(Config, ErrorsStayOneLine) {
  for (const char* toml : {"required = tru\nx = 1\n", "\"a\\nb\" = 1\n", "[[route]]\n\"m\\u0001\" = 2\n"}) {
    const std::string error = error_of(toml);
    EXPECT_FALSE(error.empty()) << toml;
    EXPECT_EQ(error.find('\n'), std::string::npos) << error;
    EXPECT_EQ(error.find('\x01'), std::string::npos) << error;
  }
}

TEST(Durations, Units) {
  EXPECT_EQ(parse_duration("1500ms"), 1500ms);
  EXPECT_EQ(parse_duration("30s"), 30s);
  EXPECT_EQ(parse_duration("5m"), 5min);
  EXPECT_EQ(parse_duration("72h"), 72h);
  EXPECT_EQ(parse_duration("7d"), 168h);
  EXPECT_EQ(parse_duration("1h30m"), 90min);
  EXPECT_EQ(parse_duration("0s"), 0ms);
}

TEST(Durations, Rejects) {
  for (const auto* bad : {"", "30", "s", "1.5s", "30 s", "30sec", "-1s", "1x", "1S", "99999999999999999999d"}) {
    EXPECT_THROW(parse_duration(bad), ConfigError) << bad;
  }
  try {
    parse_duration("1.5s");
    FAIL() << "1.5s accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no fractions"), std::string::npos) << e.what();
  }
}

TEST(Sizes, BinaryAndDecimalUnits) {
  EXPECT_EQ(parse_size("1MiB"), 1048576u);
  EXPECT_EQ(parse_size("512KiB"), 524288u);
  EXPECT_EQ(parse_size("10MB"), 10000000u);
  EXPECT_EQ(parse_size("2kb"), 2000u);
  EXPECT_EQ(parse_size("1GiB"), 1073741824u);
  EXPECT_EQ(parse_size("4096"), 4096u);
  EXPECT_EQ(parse_size("12B"), 12u);
  EXPECT_EQ(parse_size("1 MiB"), 1048576u);
}

TEST(Sizes, Rejects) {
  for (const auto* bad : {"", "MiB", "1.5MiB", "1TiB", "-1", "1Mi", "99999999999999999999"}) {
    EXPECT_THROW(parse_size(bad), ConfigError) << bad;
  }
}

TEST(ListenAddresses, Forms) {
  auto a = parse_listen_address("127.0.0.1:8080");
  EXPECT_EQ(a.host, "127.0.0.1");
  EXPECT_EQ(a.port, 8080);
  a = parse_listen_address("[::1]:0");
  EXPECT_EQ(a.host, "::1");
  EXPECT_EQ(a.port, 0);
  EXPECT_EQ(a.text(), "[::1]:0");
  a = parse_listen_address(":9000");
  EXPECT_EQ(a.host, "0.0.0.0");
  a = parse_listen_address("localhost:1");
  EXPECT_EQ(a.host, "localhost");
  for (const auto* bad : {"8080", "host:", "host:65536", "host:http", "::1:80", "[::1]80"}) {
    EXPECT_THROW(parse_listen_address(bad), ConfigError) << bad;
  }
}

TEST(UpstreamUrls, Forms) {
  auto u = parse_upstream_url("http://127.0.0.1:8081");
  EXPECT_EQ(u.host, "127.0.0.1");
  EXPECT_EQ(u.port, 8081);
  EXPECT_EQ(u.authority, "127.0.0.1:8081");
  u = parse_upstream_url("http://api.internal/");
  EXPECT_EQ(u.host, "api.internal");
  EXPECT_EQ(u.port, 80);
  u = parse_upstream_url("http://[::1]:9000");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.port, 9000);
  for (const auto* bad : {"127.0.0.1:8081", "http://", "http://h:0", "http://h:x", "http://h/api",
                          "http://u:p@h", "ftp://h", "http://h:"}) {
    EXPECT_THROW(parse_upstream_url(bad), ConfigError) << bad;
  }
  u = parse_upstream_url("https://api.partner.example");
  EXPECT_TRUE(u.tls);
  EXPECT_EQ(u.port, 443);
  EXPECT_EQ(u.text(), "https://api.partner.example");
  u = parse_upstream_url("https://10.0.0.7:8443/");
  EXPECT_TRUE(u.tls);
  EXPECT_EQ(u.port, 8443);
  EXPECT_FALSE(parse_upstream_url("http://h").tls);
  for (const auto* bad : {"https://", "https://h/api", "https://u:p@h"}) {
    EXPECT_THROW(parse_upstream_url(bad), ConfigError) << bad;
  }
}

TEST(TlsConfig, KeysAndTheirErrors) {
  // Files are read when the configuration loads (tests/gateway/test_tls.py covers good and bad
  // ones); these are the errors found before any file is opened.
  EXPECT_NE(error_of("[tls]\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\n").find("[tls]: missing key \"listen\""),
            std::string::npos);
  EXPECT_NE(error_of("[tls]\nlisten = \"127.0.0.1:8443\"\nkey_file = \"k.pem\"\n").find("missing key \"cert_file\""),
            std::string::npos);
  EXPECT_NE(error_of("[tls]\nlisten = \"127.0.0.1:8443\"\ncert_file = \"c.pem\"\n").find("missing key \"key_file\""),
            std::string::npos);
  const std::string base = "[tls]\nlisten = \"127.0.0.1:8443\"\ncert_file = \"c.pem\"\nkey_file = \"k.pem\"\n";
  EXPECT_NE(error_of(base + "min_version = \"1.1\"\n").find("expected \"1.2\" or \"1.3\""), std::string::npos);
  EXPECT_NE(error_of(base + "client_certificates = \"yes\"\n").find("expected \"off\", \"optional\" or \"required\""),
            std::string::npos);
  EXPECT_NE(error_of(base + "client_certificates = \"required\"\n").find("needs client_ca_file"), std::string::npos);
  EXPECT_NE(error_of(base + "client_ca_file = \"ca.pem\"\n").find("only with client_certificates"), std::string::npos);
  EXPECT_NE(error_of(base + "ciphers = \"ALL\"\n").find("[tls]: unknown key \"ciphers\""), std::string::npos);
  EXPECT_NE(error_of(base).find("cert_file \"c.pem\": cannot load a PEM certificate chain"), std::string::npos);
  EXPECT_NE(error_of("listen = \"off\"\n").find("listen = \"off\" needs a [tls] listener"), std::string::npos);
  EXPECT_NE(error_of("[upstream_tls]\ncert_file = \"c.pem\"\n").find("cert_file and key_file go together"),
            std::string::npos);
  EXPECT_NE(error_of("[upstream_tls]\nverify = false\n").find("unknown key \"verify\""), std::string::npos);
  EXPECT_NE(error_of("upstream = \"https://h\"\n[upstream_tls]\nca_file = \"/nonexistent/ca.pem\"\n")
                .find("[upstream_tls]: ca_file \"/nonexistent/ca.pem\": cannot load CA certificates"),
            std::string::npos);
  // The system's trust store is enough for an https:// upstream with a public certificate.
  EXPECT_EQ(error_of("upstream = \"https://api.partner.example\"\n"), "");
  // A client_cert tenant needs a listener that asks for certificates.
  EXPECT_NE(error_of("[tenant]\nfrom = \"client_cert\"\n").find("needs a [tls] listener with client_certificates"),
            std::string::npos);
  EXPECT_NE(error_of("[tenant]\nfrom = \"client_cert\"\nidentity = \"email\"\n").find("expected \"subject\", \"common_name\""),
            std::string::npos);
  EXPECT_NE(error_of("[tenant]\nheader = \"X-T\"\nidentity = \"uri\"\n").find("identity: only with from = \"client_cert\""),
            std::string::npos);
}

TEST(StoreUrls, MemoryAndSqlite) {
  EXPECT_EQ(parse_store_url("memory:").kind, StoreUrl::Kind::memory);
  auto s = parse_store_url("sqlite:./var/idem.db");
  EXPECT_EQ(s.kind, StoreUrl::Kind::sqlite);
  EXPECT_EQ(s.path, "./var/idem.db");
  EXPECT_EQ(parse_store_url("sqlite:///abs/idem.db").path, "/abs/idem.db");
  // Options are the store's; the path the gateway creates a directory for ends before them.
  EXPECT_EQ(parse_store_url("sqlite:./var/idem.db?synchronous=normal").path, "./var/idem.db");
  EXPECT_THROW(parse_store_url("sqlite:./var/idem.db?synchronous=sometimes"), ConfigError);
  EXPECT_THROW(parse_store_url("sqlite:"), ConfigError);
  EXPECT_THROW(parse_store_url("mysql://x"), ConfigError);
}

TEST(StoreUrls, SharedStoresParseAndBadOnesNeverEchoPasswords) {
  EXPECT_EQ(parse_store_url("postgres://u:secret@h/db").kind, StoreUrl::Kind::shared);
  EXPECT_EQ(parse_store_url("postgresql://u:secret@h/db").kind, StoreUrl::Kind::shared);
  for (const auto* url : {"mysql://u:secret@h/db", "sqlite:"}) {
    try {
      parse_store_url(url);
      FAIL() << url;
    } catch (const ConfigError& e) {
      EXPECT_EQ(std::string(e.what()).find("secret"), std::string::npos) << e.what();
    }
  }
}

TEST(Config, Defaults) {
  const Config c = parse_config("", "config.toml");
  EXPECT_EQ(c.listen.text(), "127.0.0.1:8080");
  ASSERT_TRUE(c.admin_listen);
  EXPECT_EQ(c.admin_listen->text(), "127.0.0.1:9090");
  EXPECT_EQ(c.upstream.authority, "127.0.0.1:8081");
  EXPECT_EQ(c.store.kind, StoreUrl::Kind::sqlite);
  EXPECT_EQ(c.store.path, "./var/idem.db");
  EXPECT_EQ(c.upstream_timeout, 30s);
  EXPECT_EQ(c.max_body, 1048576u);
  EXPECT_EQ(c.defaults.key_header, "Idempotency-Key");
  EXPECT_EQ(c.defaults.key.min_length, 16u);
  EXPECT_EQ(c.defaults.key.max_length, 256u);
  EXPECT_EQ(c.defaults.retention, 24h);
  EXPECT_EQ(c.defaults.lease, 60s);
  EXPECT_EQ(c.defaults.retry_after, 1s);
  EXPECT_FALSE(c.defaults.store_server_errors);
  EXPECT_FALSE(c.defaults.key_required);
  EXPECT_EQ(c.defaults.on_lease_expiry, LeaseExpiry::reexecute);
  EXPECT_EQ(c.tenant.rule.source, TenantRule::Source::none);
  EXPECT_FALSE(c.tenant.jwt);
  EXPECT_TRUE(c.routes.empty());
  EXPECT_TRUE(c.warnings.empty());
}

constexpr std::string_view kIssueExample = R"(
listen = "127.0.0.1:8080"
admin_listen = "127.0.0.1:9090"
upstream = "http://127.0.0.1:8081"
store = "sqlite:./var/idem.db"
upstream_timeout = "30s"
max_body = "1MiB"

[idempotency]            # defaults for every route
header = "Idempotency-Key"
key_min_length = 16
key_max_length = 256
retention = "24h"
lease = "60s"
retry_after = "1s"
store_server_errors = false
on_lease_expiry = "reexecute"    # or "unknown"

[tenant]
header = "X-Tenant-Id"           # or: from = "authorization" (hash of the credential)

[[route]]
method = "POST"
path = "/v1/payments"            # exact; "*" matches one segment; a trailing "/**" matches the rest
required = true                  # default true for listed routes
retention = "72h"                # any [idempotency] key may be overridden per route
fingerprint.json_ignore = ["/client_ts"]
fingerprint.headers = ["Content-Type"]
)";

TEST(Config, TheIssueExampleParses) {
  const Config c = parse_config(kIssueExample, "config.toml");
  EXPECT_EQ(c.tenant.rule.source, TenantRule::Source::header);
  EXPECT_EQ(c.tenant.rule.header, "X-Tenant-Id");
  ASSERT_EQ(c.routes.size(), 1u);
  const Route& r = c.routes[0];
  EXPECT_EQ(r.methods, std::vector<std::string>{"POST"});
  EXPECT_TRUE(r.path.matches("/v1/payments"));
  EXPECT_TRUE(r.policy.key_required);
  EXPECT_EQ(r.policy.retention, 72h);
  EXPECT_EQ(r.policy.lease, 60s);  // inherited
  EXPECT_EQ(r.policy.fingerprint.json_ignore, std::vector<std::string>{"/client_ts"});
  EXPECT_EQ(r.policy.fingerprint.headers, std::vector<std::string>{"Content-Type"});
  EXPECT_TRUE(c.warnings.empty());
}

TEST(Config, RoutesInheritIdempotencyWhereverItIsWritten) {
  // [[route]] before [idempotency] in the file: the route still inherits.
  const Config c = parse_config(R"(
[[route]]
method = ["post", "PUT"]
path = "/v1/items/*"
required = false

[idempotency]
lease = "5s"
allow_short_lease = true
header = "X-Key"
store_server_errors = true
on_lease_expiry = "unknown"
retry_after = "1500ms"
fingerprint.headers = ["Content-Type"]
)",
                                "config.toml");
  ASSERT_EQ(c.routes.size(), 1u);
  const Policy& p = c.routes[0].policy;
  EXPECT_EQ(c.routes[0].methods, (std::vector<std::string>{"POST", "PUT"}));
  EXPECT_FALSE(p.key_required);
  EXPECT_EQ(p.lease, 5s);
  EXPECT_EQ(p.key_header, "X-Key");
  EXPECT_TRUE(p.store_server_errors);
  EXPECT_EQ(p.on_lease_expiry, LeaseExpiry::unknown);
  EXPECT_EQ(p.retry_after, 2s);  // rounded up to whole seconds
  EXPECT_EQ(p.fingerprint.headers, std::vector<std::string>{"Content-Type"});
}

TEST(Config, RouteFingerprintAsSubTable) {
  const Config c = parse_config(R"(
[[route]]
method = "PATCH"
path = "/a/**"
[route.fingerprint]
json_ignore = ["/x", "/y/0"]
)",
                                "config.toml");
  EXPECT_EQ(c.routes[0].policy.fingerprint.json_ignore, (std::vector<std::string>{"/x", "/y/0"}));
}

TEST(Config, TenantFromAuthorization) {
  EXPECT_EQ(parse_config("[tenant]\nfrom = \"authorization\"\n", "c").tenant.rule.source,
            TenantRule::Source::authorization);
  EXPECT_EQ(parse_config("[tenant]\nfrom = \"none\"\n", "c").tenant.rule.source, TenantRule::Source::none);
  const auto h = parse_config("[tenant]\nfrom = \"header\"\n", "c").tenant.rule;
  EXPECT_EQ(h.source, TenantRule::Source::header);
  EXPECT_EQ(h.header, "X-Tenant-Id");
}

TEST(Config, ExtraKeys) {
  const Config c = parse_config(R"(
admin_listen = "off"
upstream_connect_timeout = "2s"
upstream_idle_timeout = "0s"
upstream_resolve_interval = "0s"
upstream_max_idle = 8
max_header = "32KiB"
max_stored_response = "4MiB"
max_connections = 100
idle_timeout = "5s"
client_timeout = "10s"
drain_timeout = "3s"
store_timeout = "750ms"
threads = 3
reaper_interval = "0s"
reaper_batch = 50
log_level = "warn"
store = "memory:"
)",
                                "c");
  EXPECT_FALSE(c.admin_listen);
  EXPECT_EQ(c.upstream_connect_timeout, 2s);
  EXPECT_EQ(c.upstream_idle_timeout, 0s);
  EXPECT_EQ(c.upstream_resolve_interval, 0s);
  EXPECT_EQ(c.upstream_max_idle, 8u);
  EXPECT_EQ(c.max_header, 32768u);
  EXPECT_EQ(c.max_stored_response, 4u * 1048576);
  EXPECT_EQ(c.max_connections, 100u);
  EXPECT_EQ(c.idle_timeout, 5s);
  EXPECT_EQ(c.client_timeout, 10s);
  EXPECT_EQ(c.drain_timeout, 3s);
  EXPECT_EQ(c.store_timeout, 750ms);
  EXPECT_EQ(c.threads, 3u);
  EXPECT_EQ(c.reaper_interval, 0s);
  EXPECT_EQ(c.reaper_batch, 50u);
  EXPECT_EQ(c.log_level, LogLevel::warn);
  ASSERT_EQ(c.warnings.size(), 1u);  // the memory store
  EXPECT_NE(c.warnings[0].find("memory"), std::string::npos);
}

TEST(Config, UnknownKeysAreErrorsNamingTableAndKey) {
  EXPECT_EQ(error_of("listne = \"1.2.3.4:80\"\n"), "config.toml: unknown key \"listne\" (line 1)");
  EXPECT_EQ(error_of("[idempotency]\nretentoin = \"1h\"\n"),
            "config.toml: [idempotency]: unknown key \"retentoin\" (line 2)");
  EXPECT_EQ(error_of("[tenant]\nheadr = \"X\"\n"), "config.toml: [tenant]: unknown key \"headr\" (line 2)");
  EXPECT_EQ(error_of(R"(
[[route]]
method = "POST"
path = "/a"

[[route]]
method = "POST"
path = "/b"
retentoin = "72h"
)"),
            "config.toml: [[route]] #2: unknown key \"retentoin\" (line 9)");
  EXPECT_EQ(error_of("[[route]]\nmethod = \"POST\"\npath = \"/a\"\nfingerprint.json_ignor = []\n"),
            "config.toml: [[route]] #1: unknown key \"fingerprint.json_ignor\" (line 4)");
  EXPECT_EQ(error_of("[unknown]\nx = 1\n"), "config.toml: unknown key \"unknown\" (line 1)");
}

TEST(Config, TypeAndValueErrors) {
  EXPECT_EQ(error_of("upstream_timeout = 30\n"),
            "config.toml: upstream_timeout: a duration needs a unit, e.g. \"30s\" (units ms, s, m, h, d) (line 1)");
  EXPECT_NE(error_of("max_body = \"1XB\"\n").find("max_body: \"1XB\": unknown unit"), std::string::npos);
  EXPECT_NE(error_of("[idempotency]\nkey_min_length = \"16\"\n").find("key_min_length: expected an integer, got a string"),
            std::string::npos);
  EXPECT_NE(error_of("[idempotency]\nstore_server_errors = \"yes\"\n").find("expected true or false"), std::string::npos);
  EXPECT_NE(error_of("[idempotency]\non_lease_expiry = \"retry\"\n").find("expected \"reexecute\", \"unknown\" or \"ask\""),
            std::string::npos);
  EXPECT_NE(error_of("[idempotency]\nkey_min_length = 300\n").find("key_min_length (300) is greater than key_max_length (256)"),
            std::string::npos);
  EXPECT_NE(error_of("[idempotency]\nkey_min_length = 0\n").find("outside 1..4096"), std::string::npos);
  EXPECT_NE(error_of("[idempotency]\nlease = \"0s\"\n").find("lease: must be longer than 0"), std::string::npos);
  EXPECT_NE(error_of("store_timeout = \"0s\"\n").find("store_timeout: must be longer than 0"), std::string::npos);
  EXPECT_NE(error_of("[idempotency]\nheader = \"Bad Header\"\n").find("not a valid header name"), std::string::npos);
  EXPECT_NE(error_of("listen = \"nonsense\"\n").find("listen: expected HOST:PORT"), std::string::npos);
  EXPECT_NE(error_of("upstream = \"ftp://x\"\n").find("upstream: expected http://HOST[:PORT] or https://HOST[:PORT]"),
            std::string::npos);
  EXPECT_NE(error_of("store = \"mysql://u:p@h/db\"\n").find("store: unknown store URL"), std::string::npos);
  EXPECT_NE(error_of("log_level = \"loud\"\n").find("log_level"), std::string::npos);
  EXPECT_NE(error_of("threads = 1000\n").find("threads: 1000 is outside 0..256"), std::string::npos);
  EXPECT_NE(error_of("max_header = \"100B\"\n").find("max_header: must be at least 1024 bytes"), std::string::npos);
  EXPECT_NE(error_of("max_header = \"65537\"\n").find("max_header: at most 64KiB"), std::string::npos);
  EXPECT_EQ(error_of("max_header = \"64KiB\"\n"), "");
  EXPECT_NE(error_of("[tenant]\nheader = \"X-T\"\nfrom = \"authorization\"\n").find("not both"), std::string::npos);
  EXPECT_NE(error_of("[tenant]\nfrom = \"cookie\"\n").find("expected \"header\", \"authorization\", \"jwt\", \"client_cert\" or \"none\""),
            std::string::npos);
  EXPECT_NE(error_of("idempotency = 3\n").find("expected a table"), std::string::npos);
}

TEST(Config, RouteErrors) {
  EXPECT_EQ(error_of("[[route]]\npath = \"/a\"\n"), "config.toml: [[route]] #1: missing key \"method\" (line 1)");
  EXPECT_EQ(error_of("[[route]]\nmethod = \"POST\"\n"), "config.toml: [[route]] #1: missing key \"path\" (line 1)");
  EXPECT_NE(error_of("[[route]]\nmethod = \"GET\"\npath = \"/a\"\n").find("GET is never handled"), std::string::npos);
  EXPECT_NE(error_of("[[route]]\nmethod = \"head\"\npath = \"/a\"\n").find("HEAD is never handled"), std::string::npos);
  EXPECT_NE(error_of("[[route]]\nmethod = []\npath = \"/a\"\n").find("at least one method"), std::string::npos);
  EXPECT_NE(error_of("[[route]]\nmethod = \"PO ST\"\npath = \"/a\"\n").find("is not an HTTP method"), std::string::npos);
  EXPECT_NE(error_of("[[route]]\nmethod = \"POST\"\npath = \"a\"\n").find("path \"a\": must start with \"/\""),
            std::string::npos);
  EXPECT_NE(error_of("[[route]]\nmethod = \"POST\"\npath = \"/a/**/b\"\n").find("only be the last segment"),
            std::string::npos);
  EXPECT_NE(error_of("[[route]]\nmethod = \"POST\"\npath = \"/a\"\nrequired = 1\n").find("required: expected true or false"),
            std::string::npos);
  EXPECT_NE(error_of("[[route]]\nmethod = \"POST\"\npath = \"/a\"\nfingerprint.json_ignore = [\"x\"]\n")
                .find("not a JSON Pointer"),
            std::string::npos);
  EXPECT_NE(error_of("[route]\nmethod = \"POST\"\n").find("written [[route]]"), std::string::npos);
}

TEST(Config, TomlSyntaxErrorsNameFileLineAndColumn) {
  const std::string e = error_of("listen = \"127.0.0.1:8080\"\nthis is not toml\n");
  EXPECT_EQ(e.rfind("config.toml:2:", 0), 0u) << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

TEST(Config, RetentionOutsideOneHourToSevenDaysWarns) {
  Config c = parse_config("[idempotency]\nretention = \"10s\"\n", "c");
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("[idempotency]"), std::string::npos);
  EXPECT_NE(c.warnings[0].find("outside 1h-7d"), std::string::npos);
  c = parse_config("[[route]]\nmethod = \"POST\"\npath = \"/p\"\nretention = \"8d\"\n", "c");
  ASSERT_EQ(c.warnings.size(), 1u);
  EXPECT_NE(c.warnings[0].find("[[route]] #1 (POST /p)"), std::string::npos);
  EXPECT_TRUE(parse_config("[idempotency]\nretention = \"1h\"\n", "c").warnings.empty());
  EXPECT_TRUE(parse_config("[idempotency]\nretention = \"7d\"\n", "c").warnings.empty());
}

TEST(Config, FlagsOverrideTheFile) {
  Overrides o;
  o.listen = "127.0.0.1:0";
  o.upstream = "http://localhost:9999";
  o.store = "memory:";
  o.admin_listen = "off";
  const Config c = parse_config("listen = \"1.2.3.4:1\"\nstore = \"sqlite:/x.db\"\n", "c", o);
  EXPECT_EQ(c.listen.text(), "127.0.0.1:0");
  EXPECT_EQ(c.upstream.host, "localhost");
  EXPECT_EQ(c.upstream.port, 9999);
  EXPECT_EQ(c.store.kind, StoreUrl::Kind::memory);
  EXPECT_FALSE(c.admin_listen);
}

TEST(Config, BadFlagsNameTheFlag) {
  Overrides o;
  o.listen = "nope";
  EXPECT_EQ(error_of("", o).rfind("--listen \"nope\": expected HOST:PORT", 0), 0u) << error_of("", o);
  Overrides s;
  s.store = "nosuch:x";
  EXPECT_NE(error_of("", s).find("--store \"nosuch:x\": unknown store URL"), std::string::npos);
}

TEST(Config, LoadConfigReadsFilesAndNamesMissingOnes) {
  const std::string path = testing::TempDir() + "idem_gateway_config_test.toml";
  {
    std::ofstream out(path);
    out << "listen = \"127.0.0.1:1234\"\n";
  }
  EXPECT_EQ(load_config(path).listen.port, 1234);
  std::remove(path.c_str());
  try {
    load_config(path);
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), path + ": cannot read the file");
  }
  EXPECT_EQ(load_config(std::nullopt).listen.port, 8080);
}

// [encryption]: the key file is read with the configuration, so any problem with it is exit 2.
class EncryptionConfig : public ::testing::Test {
 protected:
  std::string dir = ::testing::TempDir() + "idem-enc-config-" + std::to_string(::getpid());
  std::string path = dir + "/keys";
  // 32 bytes of 0x01 and of 0x02, and 16 bytes of 'x', in base64 (fixed test keys).
  const std::string key = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE=";
  const std::string key2 = "AgICAgICAgICAgICAgICAgICAgICAgICAgICAgICAgI=";
  const std::string short_key = "eHh4eHh4eHh4eHh4eHh4eA==";
  void SetUp() override { std::filesystem::create_directories(dir); }
  void TearDown() override { std::filesystem::remove_all(dir); }
  void write(const std::string& text, std::filesystem::perms mode = std::filesystem::perms::owner_read |
                                                                    std::filesystem::perms::owner_write) {
    std::ofstream(path, std::ios::trunc) << text;
    std::filesystem::permissions(path, mode);
  }
  std::string toml() const { return "[encryption]\nkey_file = \"" + path + "\"\n"; }
};

TEST_F(EncryptionConfig, OffUnlessConfigured) {
  const Config config = parse_config("", "config.toml");
  EXPECT_EQ(config.encryption_keys, nullptr);
  EXPECT_TRUE(config.encryption_key_file.empty());
}

TEST_F(EncryptionConfig, LoadsTheKeyFile) {
  write("# keys\nold " + key + " \nnew " + key2 + " decrypt-only\n");
  const Config config = parse_config(toml(), "config.toml");
  ASSERT_NE(config.encryption_keys, nullptr);
  EXPECT_EQ(config.encryption_key_file, path);
  EXPECT_EQ(*config.encryption_keys->sealing_key_id(), "old");
  EXPECT_EQ(config.encryption_keys->keys().size(), 2u);
}

TEST_F(EncryptionConfig, EveryKeyDecryptOnlyWarns) {
  write("old " + key + " decrypt-only\n");
  const Config config = parse_config(toml(), "config.toml");
  ASSERT_EQ(config.warnings.size(), 1u);
  EXPECT_NE(config.warnings[0].find("[encryption]: " + path + ": every key is decrypt-only"), std::string::npos)
      << config.warnings[0];
}

TEST_F(EncryptionConfig, BadKeyFilesAreOneLineErrorsWithoutKeyMaterial) {
  write("k1 " + short_key + "\n");
  EXPECT_EQ(error_of(toml()), "config.toml: [encryption]: key_file: " + path +
                                  ": line 1: key \"k1\": the key is 16 bytes, expected 32; make one with `openssl rand "
                                  "-base64 32`");
  write("k1 " + key + "\nk1 " + key + "\n");
  const std::string twice = error_of(toml());
  EXPECT_NE(twice.find("key id \"k1\" is listed twice"), std::string::npos) << twice;
  EXPECT_EQ(twice.find(key), std::string::npos) << twice;
  write(key + " k1\n");  // columns swapped: the key is where the id belongs
  const std::string swapped = error_of(toml());
  EXPECT_NE(swapped.find("the key id must be"), std::string::npos) << swapped;
  EXPECT_EQ(swapped.find(key), std::string::npos) << swapped;
  write("k1 " + key + "\n", std::filesystem::perms::owner_read | std::filesystem::perms::owner_write |
                                std::filesystem::perms::others_read);
  EXPECT_NE(error_of(toml()).find("lets other users read or change it; chmod 600"), std::string::npos);
  std::filesystem::remove(path);
  EXPECT_NE(error_of(toml()).find("cannot read the key file"), std::string::npos);
  EXPECT_NE(error_of("[encryption]\n").find("missing key \"key_file\""), std::string::npos);
  EXPECT_NE(error_of("[encryption]\nkey_file = \"\"\n").find("must not be empty"), std::string::npos);
  EXPECT_NE(error_of("[encryption]\nkeyfile = \"x\"\n").find("unknown key \"keyfile\""), std::string::npos);
  EXPECT_NE(error_of("encryption = \"x\"\n").find("expected a table [encryption]"), std::string::npos);
}

}  // namespace
// on_lease_expiry = "ask" (docs/gateway.md): the lookup is a route's own, parsed at load.
TEST(Config, AskNeedsItsLookupOnTheRoute) {
  const Config c = parse_config(
      "[[route]]\nmethod = \"POST\"\npath = \"/v1/payments\"\non_lease_expiry = \"ask\"\n"
      "ask = \"GET /v1/payments/by-idempotency-key/{key}\"\n",
      "config.toml");
  ASSERT_EQ(c.routes.size(), 1u);
  EXPECT_EQ(c.routes[0].policy.on_lease_expiry, LeaseExpiry::ask);
  EXPECT_EQ(c.routes[0].policy.lookup, "GET /v1/payments/by-idempotency-key/{key}");
  EXPECT_EQ(c.upstream_attempt_header, "Idempotency-Attempt");
  EXPECT_EQ(c.upstream_tenant_header, "Idempotency-Tenant");

  const std::string route = "[[route]]\nmethod = \"POST\"\npath = \"/p\"\n";
  EXPECT_NE(error_of(route + "on_lease_expiry = \"ask\"\n").find("needs the upstream's lookup"), std::string::npos);
  EXPECT_NE(error_of(route + "ask = \"GET /x/{key}\"\n").find("only with on_lease_expiry = \"ask\""),
            std::string::npos);
  EXPECT_NE(error_of(route + "on_lease_expiry = \"ask\"\nask = \"POST /x/{key}\"\n").find("ask:"),
            std::string::npos);
  EXPECT_NE(error_of("[idempotency]\non_lease_expiry = \"ask\"\n").find("only in a [[route]]"), std::string::npos);
  EXPECT_NE(error_of("[idempotency]\nask = \"GET /x/{key}\"\n").find("only in a [[route]]"), std::string::npos);
  // The asking retry holds the key for a lease, which must outlast the lookup.
  EXPECT_NE(error_of("lookup_timeout = \"5s\"\n" + route +
                     "lease = \"5s\"\nallow_short_lease = true\non_lease_expiry = \"ask\"\nask = \"GET /x/{key}\"\n")
                .find("must be longer than lookup_timeout"),
            std::string::npos);
}

// Issue 19: a lease not longer than upstream_timeout lets a takeover run beside the first call.
TEST(Config, ALeaseNotLongerThanTheUpstreamTimeoutIsRefusedUnlessAllowed) {
  EXPECT_NE(error_of("[idempotency]\nlease = \"30s\"\n").find("is not longer than upstream_timeout"),
            std::string::npos);
  EXPECT_NE(error_of("upstream_timeout = \"10s\"\n[[route]]\nmethod = \"POST\"\npath = \"/p\"\nlease = \"10s\"\n")
                .find("[[route]] #1: lease (10000 ms) is not longer than upstream_timeout (10000 ms)"),
            std::string::npos);
  EXPECT_EQ(error_of("upstream_timeout = \"10s\"\n[[route]]\nmethod = \"POST\"\npath = \"/p\"\nlease = \"11s\"\n"), "");
  EXPECT_EQ(error_of("[idempotency]\nlease = \"1s\"\nallow_short_lease = true\n[[route]]\nmethod = \"POST\"\npath = \"/p\"\n"),
            "");  // routes inherit the allowance with the lease
  EXPECT_EQ(error_of("[[route]]\nmethod = \"POST\"\npath = \"/p\"\nlease = \"1s\"\nallow_short_lease = true\n"), "");
}

TEST(Config, UpstreamHeadersMustDifferFromTheKeyHeader) {
  EXPECT_NE(error_of("upstream_attempt_header = \"Idempotency-Key\"\n").find("rename one"), std::string::npos);
  EXPECT_NE(error_of("upstream_attempt_header = \"X-A\"\nupstream_tenant_header = \"x-a\"\n").find("different"),
            std::string::npos);
  EXPECT_EQ(error_of("upstream_attempt_header = \"X-Attempt\"\nupstream_tenant_header = \"X-Tenant\"\n"), "");
}

TEST(Config, Http2UpstreamProtocolAndGrpcRetryable) {
  const Config c = parse_config("upstream_protocol = \"h2\"\n[http2]\ncleartext = true\nmax_concurrent_streams = 8\n"
                                "[[route]]\nmethod = \"POST\"\npath = \"/p.S/M\"\n"
                                "grpc_retryable = [\"unavailable\", \"4\"]\n",
                                "config.toml", {});
  EXPECT_TRUE(c.upstream_http2);
  EXPECT_TRUE(c.http2.cleartext);
  EXPECT_FALSE(c.http2.tls);
  EXPECT_EQ(c.http2.max_concurrent_streams, 8u);
  ASSERT_EQ(c.routes.size(), 1u);
  EXPECT_EQ(c.routes[0].options.grpc_retryable, (1u << 14) | (1u << 4));
  EXPECT_FALSE(parse_config("", "config.toml", {}).upstream_http2);
  EXPECT_NE(error_of("upstream_protocol = \"h3\"\n").find("expected \"http/1.1\" or \"h2\""), std::string::npos);
  EXPECT_NE(error_of("[[route]]\nmethod = \"POST\"\npath = \"/x\"\ngrpc_retryable = [\"SOMETIMES\"]\n")
                .find("is not a gRPC status"),
            std::string::npos);
  EXPECT_NE(error_of("[[route]]\nmethod = \"POST\"\npath = \"/x\"\ngrpc_retryable = [\"OK\"]\n").find("always stored"),
            std::string::npos);
  EXPECT_NE(error_of("[http2]\nmax_concurrent_streams = 0\n").find("max_concurrent_streams"), std::string::npos);
  EXPECT_NE(error_of("[http2]\nwindow = 1\n").find("unknown key"), std::string::npos);
}

// SPEC 5: volatile headers are never fingerprinted; naming one is a mistake said at load.
TEST(Config, VolatileFingerprintHeadersAreRefused) {
  for (const char* name : {"Date", "traceparent", "X-Request-Id", "Authorization", "cookie", "Idempotency-Key"}) {
    const std::string error = error_of(std::string("[idempotency]\nfingerprint.headers = [\"") + name + "\"]\n");
    EXPECT_NE(error.find("is never fingerprinted"), std::string::npos) << name << ": " << error;
  }
  EXPECT_EQ(error_of("[idempotency]\nfingerprint.headers = [\"Content-Type\", \"X-Api-Version\"]\n"), "");
}


class WebhookConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/idem-gw-webhook-config-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    secret_ = dir_ + "/stripe.secret";
    std::ofstream(secret_) << "whsec_config_test_secret\n";
    std::filesystem::permissions(secret_, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string route(const std::string& webhook) const {
    return "[[route]]\nmethod = \"POST\"\npath = \"/hooks/stripe\"\n[route.webhook]\n" + webhook;
  }
  std::string dir_, secret_;
};

TEST_F(WebhookConfig, AWebhookRouteKeepsEventsAWeekInItsOwnTenant) {
  const Config c = parse_config(route("provider = \"stripe\"\nsecret_file = \"" + secret_ + "\"\n"), "config.toml");
  ASSERT_EQ(c.routes.size(), 1u);
  ASSERT_TRUE(c.routes[0].webhook.has_value());
  EXPECT_EQ(c.routes[0].webhook->tenant, "webhook /hooks/stripe");
  EXPECT_EQ(c.routes[0].webhook->verifier->profile(), WebhookProfile::stripe);
  EXPECT_EQ(c.routes[0].webhook->verifier->secret_count(), 1u);
  EXPECT_EQ(c.routes[0].policy.retention, 24h * 7);
  EXPECT_EQ(c.routes[0].policy.key.min_length, 1u);
  EXPECT_TRUE(c.routes[0].policy.key_required);
  // A route's own retention and tenant win.
  const Config own = parse_config("[[route]]\nmethod = \"POST\"\npath = \"/h\"\nretention = \"72h\"\n"
                                  "webhook = { provider = \"stripe\", secret_file = \"" + secret_ + "\", tenant = \"acct-1\" }\n",
                                  "config.toml");
  EXPECT_EQ(own.routes[0].policy.retention, 72h);
  EXPECT_EQ(own.routes[0].webhook->tenant, "acct-1");
}

TEST_F(WebhookConfig, MistakesAreOneLineErrorsWithoutSecrets) {
  EXPECT_NE(error_of(route("provider = \"paypal\"\nsecret_file = \"" + secret_ + "\"\n")).find("provider: expected"),
            std::string::npos);
  EXPECT_NE(error_of(route("provider = \"stripe\"\n")).find("missing key \"secret_file\""), std::string::npos);
  EXPECT_NE(error_of(route("secret_file = \"" + secret_ + "\"\n")).find("missing key \"provider\""), std::string::npos);
  EXPECT_NE(error_of(route("provider = \"stripe\"\nsecret_file = \"" + secret_ + "\"\nprefix = \"x\"\n"))
                .find("only provider = \"custom\""),
            std::string::npos);
  EXPECT_NE(error_of(route("provider = \"github\"\nsecret_file = \"" + secret_ + "\"\ntolerance = \"1m\"\n"))
                .find("signs no timestamp"),
            std::string::npos);
  EXPECT_NE(error_of(route("provider = \"custom\"\nsecret_file = \"" + secret_ + "\"\nsignature_header = \"X-S\"\n"))
                .find("exactly one of key_header and key_pointer"),
            std::string::npos);
  EXPECT_NE(error_of(route("provider = \"custom\"\nsecret_file = \"" + secret_ +
                           "\"\nsignature_header = \"X-S\"\nkey_pointer = \"/id\"\nsigned = \"{key}.{body}\"\n"))
                .find("{key} only with key_header"),
            std::string::npos);
  EXPECT_NE(error_of(route("provider = \"custom\"\nsecret_file = \"" + secret_ +
                           "\"\nsignature_header = \"X-S\"\nkey_header = \"X-Id\"\nsigned = \"{key}\"\n"))
                .find("must contain {body}"),
            std::string::npos);
  // A secret file others can read stops the start, naming the file and never its contents.
  std::filesystem::permissions(secret_, std::filesystem::perms::others_read, std::filesystem::perm_options::add);
  const std::string open = error_of(route("provider = \"stripe\"\nsecret_file = \"" + secret_ + "\"\n"));
  EXPECT_NE(open.find("chmod 600"), std::string::npos) << open;
  EXPECT_EQ(open.find("whsec_config_test_secret"), std::string::npos) << open;
  // A webhook route's tenant is its own.
  EXPECT_NE(error_of("[[route]]\nmethod = \"POST\"\npath = \"/h\"\ntenant.from = \"authorization\"\n"
                     "webhook = { provider = \"stripe\", secret_file = \"x\" }\n")
                .find("webhook.tenant"),
            std::string::npos);
}

}  // namespace idem::gateway
