// The `webhook` table of a [[route]] (docs/webhooks.md): the provider, its secret files and, for
// provider = "custom", the template.
#include "config_toml.hpp"

namespace idem::gateway::config_toml {

using namespace std::chrono_literals;

// A route's `webhook` table (docs/webhooks.md). The secret files are read here, so a missing,
// empty or world-readable one stops the start (exit 2) or the reload (the running secrets stay).
WebhookRoute parse_webhook(const Context& route_ctx, const toml::node& node, const std::string& path) {
  const Context ctx{route_ctx.source, route_ctx.where + ": webhook"};
  const auto* table = node.as_table();
  if (table == nullptr) ctx.fail(&node, "expected a table (webhook.provider = \"stripe\", or [route.webhook])");
  WebhookSettings settings;
  WebhookRoute out;
  out.tenant = "webhook " + path;
  const toml::node* provider = nullptr;
  const toml::node* tolerance = nullptr;
  std::vector<const toml::node*> template_nodes;  // keys only the custom provider takes
  WebhookTemplate& t = settings.custom;
  for (const auto& [k, v] : *table) {
    const std::string_view key = k.str();
    if (key == "provider") {
      const std::string name = get_string(ctx, key, v);
      if (name == "stripe") {
        settings.profile = WebhookProfile::stripe;
      } else if (name == "standard") {
        settings.profile = WebhookProfile::standard;
      } else if (name == "github") {
        settings.profile = WebhookProfile::github;
      } else if (name == "custom") {
        settings.profile = WebhookProfile::custom;
      } else {
        ctx.fail(&v, "provider: expected \"stripe\", \"standard\", \"github\" or \"custom\", got " + quoted(name));
      }
      provider = &v;
    } else if (key == "secret_file") {
      settings.secret_files = get_strings(ctx, key, v);
      if (settings.secret_files.empty()) ctx.fail(&v, "secret_file: list at least one file");
    } else if (key == "tolerance") {
      const Millis value = get_duration(ctx, key, v);
      if (value < 1s) ctx.fail(&v, "tolerance: at least \"1s\"");
      settings.tolerance = std::chrono::duration_cast<std::chrono::seconds>(value);
      tolerance = &v;
    } else if (key == "tenant") {
      out.tenant = get_string(ctx, key, v);
      if (out.tenant.empty() || out.tenant.size() > 256) ctx.fail(&v, "tenant: 1 to 256 characters");
    } else if (key == "key_header") {
      t.key_header = get_header_name(ctx, key, v);
      template_nodes.push_back(&v);
    } else if (key == "key_pointer") {
      t.key_pointer = get_string(ctx, key, v);
      if (auto tokens = split_json_pointer(t.key_pointer); !tokens) {
        ctx.fail(&v, "key_pointer: " + quoted(t.key_pointer) + ": " + tokens.error());
      }
      template_nodes.push_back(&v);
    } else if (key == "signature_header") {
      t.signature_header = get_header_name(ctx, key, v);
      template_nodes.push_back(&v);
    } else if (key == "signed") {
      t.signed_payload = get_string(ctx, key, v);
      if (t.signed_payload.find("{body}") == std::string::npos) {
        ctx.fail(&v, "signed: must contain {body} (a signature that does not cover the body proves nothing of it)");
      }
      template_nodes.push_back(&v);
    } else if (key == "algorithm") {
      const std::string name = lower(get_string(ctx, key, v));
      if (name == "hmac-sha256") {
        t.algorithm = WebhookTemplate::Algorithm::hmac_sha256;
      } else if (name == "hmac-sha512") {
        t.algorithm = WebhookTemplate::Algorithm::hmac_sha512;
      } else {
        ctx.fail(&v, "algorithm: expected \"hmac-sha256\" or \"hmac-sha512\", got " + quoted(name));
      }
      template_nodes.push_back(&v);
    } else if (key == "encoding") {
      const std::string name = get_string(ctx, key, v);
      if (name == "hex") {
        t.encoding = WebhookTemplate::Encoding::hex;
      } else if (name == "base64") {
        t.encoding = WebhookTemplate::Encoding::base64;
      } else {
        ctx.fail(&v, "encoding: expected \"hex\" or \"base64\", got " + quoted(name));
      }
      template_nodes.push_back(&v);
    } else if (key == "prefix") {
      t.prefix = get_string(ctx, key, v);
      template_nodes.push_back(&v);
    } else if (key == "timestamp_header") {
      t.timestamp_header = get_header_name(ctx, key, v);
      template_nodes.push_back(&v);
    } else {
      ctx.fail(&v, "unknown key " + quoted(key));
    }
  }
  if (provider == nullptr) ctx.fail(&node, "missing key \"provider\" (stripe, standard, github or custom)");
  if (settings.secret_files.empty()) ctx.fail(&node, "missing key \"secret_file\"");
  if (settings.profile != WebhookProfile::custom && !template_nodes.empty()) {
    ctx.fail(template_nodes.front(), "only provider = \"custom\" takes key_header, key_pointer, signature_header, "
                                     "signed, algorithm, encoding, prefix and timestamp_header");
  }
  if (settings.profile == WebhookProfile::custom) {
    if (t.signature_header.empty()) ctx.fail(&node, "provider = \"custom\" needs signature_header");
    if (t.key_header.empty() == t.key_pointer.empty()) {
      ctx.fail(&node, "provider = \"custom\" needs exactly one of key_header and key_pointer");
    }
    if (t.signed_payload.find("{key}") != std::string::npos && t.key_header.empty()) {
      ctx.fail(&node, "signed: {key} only with key_header (a key in the body is read after the signature is checked)");
    }
    if (t.signed_payload.find("{timestamp}") != std::string::npos && t.timestamp_header.empty()) {
      ctx.fail(&node, "signed: {timestamp} needs timestamp_header");
    }
  }
  const bool has_timestamp = settings.profile == WebhookProfile::stripe ||
                             settings.profile == WebhookProfile::standard || !t.timestamp_header.empty();
  if (tolerance != nullptr && !has_timestamp) {
    ctx.fail(tolerance, "tolerance: this provider signs no timestamp (GitHub does not; custom: set timestamp_header)");
  }
  auto verifier = WebhookVerifier::load(settings);
  // No "(line N)": the message names the secret file, never a secret.
  if (!verifier) ctx.fail(nullptr, "secret_file: " + verifier.error());
  out.verifier = std::move(*verifier);
  return out;
}

}  // namespace idem::gateway::config_toml
