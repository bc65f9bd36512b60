// [tls] (the TLS listener) and [upstream_tls] (an https:// upstream) of the gateway's configuration
// (docs/gateway.md, TLS). The certificate and key files are read when the configuration is
// loaded: a bad one stops the start (exit 2), or fails a reload, which keeps the running ones.
#include <stdexcept>

#include "config_toml.hpp"

namespace idem::gateway::config_toml {
namespace {

std::string get_file(const Context& ctx, std::string_view key, const toml::node& node) {
  std::string file = get_string(ctx, key, node);
  if (file.empty()) ctx.fail(&node, std::string(key) + ": must not be empty");
  return file;
}

// cert_file, key_file, key_passphrase_file; false for another key.
bool apply_certificate_key(const Context& ctx, std::string_view key, const toml::node& node, CertificateFiles& files) {
  if (key == "cert_file") {
    files.cert_file = get_file(ctx, key, node);
  } else if (key == "key_file") {
    files.key_file = get_file(ctx, key, node);
  } else if (key == "key_passphrase_file") {
    files.key_passphrase_file = get_file(ctx, key, node);
  } else {
    return false;
  }
  return true;
}

bool uses_client_cert(const TenantSetting& setting) { return setting.client_cert.has_value(); }

}  // namespace

void parse_tls(const Context& parent, const toml::node& node, Config& config) {
  const Context ctx{parent.source, "[tls]"};
  const auto* table = node.as_table();
  if (table == nullptr) parent.fail(&node, "\"tls\": expected a table [tls]");
  ListenerTls tls;
  for (const auto& [k, v] : *table) {
    const std::string_view key = k.str();
    if (apply_certificate_key(ctx, key, v, tls.certificate)) continue;
    if (key == "listen") {
      tls.listen_text = get_string(ctx, key, v);
      try {
        config.tls_listen = parse_listen_address(tls.listen_text);
      } catch (const ConfigError& e) {
        ctx.fail(&v, "listen: " + std::string(e.what()));
      }
    } else if (key == "min_version") {
      const std::string version = get_string(ctx, key, v);
      if (version == "1.2") {
        tls.min_version = TlsVersion::v1_2;
      } else if (version == "1.3") {
        tls.min_version = TlsVersion::v1_3;
      } else {
        ctx.fail(&v, "min_version: " + quoted(version) + ": expected \"1.2\" or \"1.3\" (TLS 1.0 and 1.1 are never offered)");
      }
    } else if (key == "client_certificates") {
      const std::string mode = get_string(ctx, key, v);
      if (mode == "off") {
        tls.client_certificates = ClientCertificates::off;
      } else if (mode == "optional") {
        tls.client_certificates = ClientCertificates::optional;
      } else if (mode == "required") {
        tls.client_certificates = ClientCertificates::required;
      } else {
        ctx.fail(&v, "client_certificates: " + quoted(mode) + ": expected \"off\", \"optional\" or \"required\"");
      }
    } else if (key == "client_ca_file") {
      tls.client_ca_file = get_file(ctx, key, v);
    } else {
      ctx.fail(&v, "unknown key " + quoted(key));
    }
  }
  if (!config.tls_listen) ctx.fail(&node, "missing key \"listen\" (the TLS listener's HOST:PORT)");
  if (tls.certificate.cert_file.empty()) ctx.fail(&node, "missing key \"cert_file\" (the server certificate, PEM)");
  if (tls.certificate.key_file.empty()) ctx.fail(&node, "missing key \"key_file\" (the certificate's private key, PEM)");
  if (tls.client_certificates != ClientCertificates::off && tls.client_ca_file.empty()) {
    ctx.fail(&node, "client_certificates = \"optional\" or \"required\" needs client_ca_file (the CAs to verify them against)");
  }
  if (tls.client_certificates == ClientCertificates::off && !tls.client_ca_file.empty()) {
    ctx.fail(table->get("client_ca_file"), "client_ca_file: only with client_certificates = \"optional\" or \"required\"");
  }
  config.tls = std::move(tls);
}

void parse_upstream_tls(const Context& parent, const toml::node& node, Config& config) {
  const Context ctx{parent.source, "[upstream_tls]"};
  const auto* table = node.as_table();
  if (table == nullptr) parent.fail(&node, "\"upstream_tls\": expected a table [upstream_tls]");
  UpstreamTls tls;
  for (const auto& [k, v] : *table) {
    const std::string_view key = k.str();
    if (apply_certificate_key(ctx, key, v, tls.client)) continue;
    if (key == "ca_file") {
      tls.ca_file = get_file(ctx, key, v);
    } else if (key == "server_name") {
      tls.server_name = get_string(ctx, key, v);
      if (tls.server_name.empty() || tls.server_name.find_first_of(" /\t\r\n") != std::string::npos) {
        ctx.fail(&v, "server_name: expected a host name");
      }
    } else {
      ctx.fail(&v, "unknown key " + quoted(key));
    }
  }
  if (tls.client.cert_file.empty() != tls.client.key_file.empty()) {
    ctx.fail(&node, "cert_file and key_file go together (the client certificate shown to the upstream, and its key)");
  }
  config.upstream_tls = std::move(tls);
}

CertificateIdentity parse_certificate_identity(const Context& ctx, const toml::node& node, std::string_view text) {
  if (text == "subject") return CertificateIdentity::subject;
  if (text == "common_name") return CertificateIdentity::common_name;
  if (text == "uri") return CertificateIdentity::uri;
  if (text == "dns") return CertificateIdentity::dns;
  ctx.fail(&node, "identity: " + quoted(text) + ": expected \"subject\", \"common_name\", \"uri\" or \"dns\"");
}

void parse_http2(const Context& parent, const toml::node& node, Config& config) {
  const Context ctx{parent.source, "[http2]"};
  const auto* table = node.as_table();
  if (table == nullptr) parent.fail(&node, "\"http2\": expected a table [http2]");
  Http2Settings http2;
  for (const auto& [k, v] : *table) {
    const std::string_view key = k.str();
    if (key == "tls") {
      http2.tls = get_bool(ctx, key, v);
    } else if (key == "cleartext") {
      http2.cleartext = get_bool(ctx, key, v);
    } else if (key == "max_concurrent_streams") {
      http2.max_concurrent_streams = static_cast<std::uint32_t>(get_int(ctx, key, v, 1, 10000));
    } else if (key == "initial_window") {
      const std::size_t window = get_size(ctx, key, v, 1024);
      if (window > 0x7fffffffu) ctx.fail(&v, "initial_window: at most 2147483647 bytes (HTTP/2's largest window)");
      http2.initial_window = static_cast<std::uint32_t>(window);
    } else {
      ctx.fail(&v, "unknown key " + quoted(key));
    }
  }
  config.http2 = http2;
}

void load_tls_contexts(Config& config) {
  bool client_cert_tenant = uses_client_cert(config.tenant);
  for (const auto& route : config.routes) {
    if (route.tenant && uses_client_cert(*route.tenant)) client_cert_tenant = true;
  }
  if (client_cert_tenant && (!config.tls || config.tls->client_certificates == ClientCertificates::off)) {
    throw ConfigError("tenant from = \"client_cert\" needs a [tls] listener with client_certificates = \"optional\" or \"required\"");
  }
  if (client_cert_tenant && config.plain_listener) {
    config.warnings.push_back("tenant from = \"client_cert\": requests with a key on the plain listener (" +
                              config.listen.text() + ") carry no certificate and are refused 401; set listen = \"off\" "
                              "to serve TLS only");
  }
  if (config.http2.tls && !config.tls) {
    config.warnings.push_back("[http2] tls = true has no effect: there is no [tls] listener");
  }
  if (config.http2.cleartext && !config.plain_listener) {
    config.warnings.push_back("[http2] cleartext = true has no effect: the plain listener is off");
  }
  if (config.tls) config.tls->offer_h2 = config.http2.tls;
  try {
    if (config.tls) config.tls_context = TlsContext::for_listener(*config.tls, &config.warnings);
  } catch (const std::runtime_error& e) {
    throw ConfigError(std::string("[tls]: ") + e.what());
  }
  const bool has_upstream_tls = !config.upstream_tls.ca_file.empty() || !config.upstream_tls.client.empty() ||
                                !config.upstream_tls.server_name.empty();
  if (!config.upstream.tls) {
    if (has_upstream_tls) {
      config.warnings.push_back("[upstream_tls] has no effect: the upstream " + config.upstream.text() + " is plain HTTP");
    }
    return;
  }
  try {
    config.upstream_tls_context = TlsContext::for_upstream(config.upstream_tls, config.upstream.host, &config.warnings);
  } catch (const std::runtime_error& e) {
    throw ConfigError(std::string("[upstream_tls]: ") + e.what());
  }
}

}  // namespace idem::gateway::config_toml
