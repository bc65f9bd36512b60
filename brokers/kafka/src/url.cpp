// parse_kafka_url: kafka://[USER[:PASSWORD]@]HOST[:PORT][,HOST[:PORT]...]/TOPIC[?PARAMETERS].
// No message here quotes the userinfo or a password parameter: a mistyped URL's password must
// not reach a log, so errors name the part that is wrong, and the URL they are prefixed with
// went through redact_kafka_url.

#include <algorithm>
#include <cctype>
#include <charconv>
#include <optional>
#include <set>

#include "idem/kafka_broker.hpp"
#include "idem/redact.hpp"
#include "idem/url_decode.hpp"

namespace idem {
namespace {

constexpr int kDefaultPort = 9092;
constexpr std::size_t kMaxTopicLength = 249;  // Kafka's own limit on topic names

bool is_password_parameter(std::string_view name) {
  std::string n(name);
  std::transform(n.begin(), n.end(), n.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return n == "sasl_password" || n == "ssl_key_password";
}

// Kafka's rule for topic names: 1-249 of [a-zA-Z0-9._-], and not "." or "..".
std::optional<std::string> topic_problem(std::string_view topic, std::string_view what) {
  if (topic.empty()) return std::string(what) + " is empty";
  if (topic.size() > kMaxTopicLength) return std::string(what) + " is longer than Kafka's 249 characters";
  if (topic == "." || topic == "..") return std::string(what) + " cannot be \".\" or \"..\"";
  const bool legal = std::all_of(topic.begin(), topic.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
  if (!legal) return std::string(what) + " \"" + std::string(topic) + "\" has characters Kafka does not allow (only a-z A-Z 0-9 . _ -)";
  return std::nullopt;
}

bool visible_ascii(std::string_view text) {
  return std::all_of(text.begin(), text.end(), [](char c) { return c > ' ' && c < 127; });
}

std::expected<std::pair<std::string, int>, std::string> parse_host_port(std::string_view text) {
  std::string_view host = text, port;
  if (text.starts_with('[')) {  // [IPv6]:port
    const auto close = text.find(']');
    if (close == std::string_view::npos) return std::unexpected("unclosed '[' in a broker address");
    host = text.substr(1, close - 1);
    const std::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return std::unexpected("junk after the IPv6 address " + std::string(host));
      port = rest.substr(1);
      if (port.empty()) return std::unexpected("empty port after ':' in broker " + std::string(text));
    }
  } else if (const auto colon = text.rfind(':'); colon != std::string_view::npos) {
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (port.empty()) return std::unexpected("empty port after ':' in broker " + std::string(text));
  }
  if (host.empty()) return std::unexpected("a broker address without a host (give HOST[:PORT], comma-separated)");
  if (!visible_ascii(host) || host.find_first_of("/?#@,") != std::string_view::npos) {
    return std::unexpected("bad broker host \"" + std::string(host) + "\"");
  }
  int value = kDefaultPort;
  if (!port.empty()) {
    auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc{} || ptr != port.data() + port.size() || value <= 0 || value > 65535) {
      return std::unexpected("bad port in broker " + std::string(text) + ": give a number 1-65535");
    }
  }
  return std::pair<std::string, int>{std::string(host), value};
}

std::expected<std::chrono::milliseconds, std::string> parse_millis(std::string_view name, std::string_view value,
                                                                   std::int64_t min, std::int64_t max) {
  std::int64_t ms = 0;
  auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), ms);
  if (value.empty() || ec != std::errc{} || ptr != value.data() + value.size() || ms < min || ms > max) {
    return std::unexpected(std::string(name) + "=" + std::string(value) + ": give whole milliseconds, " + std::to_string(min) +
                           "-" + std::to_string(max));
  }
  return std::chrono::milliseconds(ms);
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
}

std::string upper(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  return text;
}

const std::set<std::string, std::less<>>& source_only() {
  static const std::set<std::string, std::less<>> names = {
      "group", "dead_letter_topic", "id_from", "start", "session_timeout_ms", "heartbeat_interval_ms",
      "commit_interval_ms", "revoke_timeout_ms", "requeue_delay_ms"};
  return names;
}

std::expected<KafkaUrl, std::string> parse(std::string_view url, KafkaUrlRole role) {
  KafkaUrl out;
  if (!url.starts_with("kafka://")) return std::unexpected("the URL must start with kafka://");
  std::string_view rest = url.substr(8);
  if (rest.find('#') != std::string_view::npos) {
    return std::unexpected("a fragment ('#') has no meaning here; percent-encode '#' as %23");
  }

  std::string_view query;
  if (const auto q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  const auto slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  const std::string_view path = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
  // An '@' after the authority means a password with a raw '/' or '?' in it: say so rather
  // than parse half of it as a topic (and quote it in the error).
  if (path.find('@') != std::string_view::npos && authority.find('@') == std::string_view::npos) {
    return std::unexpected("'@' after the hosts: percent-encode '/', '?' and '@' in the user and password (%2F, %3F, %40)");
  }

  bool userinfo_given = false;
  if (const auto at = authority.rfind('@'); at != std::string_view::npos) {
    const std::string_view userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
    const auto colon = userinfo.find(':');
    auto user = percent_decode(userinfo.substr(0, colon), "user name");
    if (!user) return std::unexpected(user.error());
    std::string password;
    if (colon != std::string_view::npos) {
      auto p = percent_decode(userinfo.substr(colon + 1), "password");
      if (!p) return std::unexpected(p.error());
      password = std::move(*p);
    }
    if (user->empty()) return std::unexpected("an empty user name before '@'");
    if (user->find('\0') != std::string::npos || password.find('\0') != std::string::npos) {
      return std::unexpected("the user name and password cannot contain NUL (%00)");
    }
    out.sasl_username = std::move(*user);
    out.sasl_password = std::move(password);
    userinfo_given = true;
  }

  if (authority.empty()) return std::unexpected("no broker: give kafka://HOST[:PORT][,HOST[:PORT]...]/TOPIC");
  while (!authority.empty()) {
    const auto comma = authority.find(',');
    const std::string_view one = authority.substr(0, comma);
    authority = comma == std::string_view::npos ? std::string_view{} : authority.substr(comma + 1);
    if (one.empty()) return std::unexpected("an empty broker address in the list (two commas, or a trailing one)");
    auto hp = parse_host_port(one);
    if (!hp) return std::unexpected(hp.error());
    out.brokers.push_back(std::move(*hp));
    if (comma != std::string_view::npos && authority.empty()) {
      return std::unexpected("an empty broker address in the list (two commas, or a trailing one)");
    }
  }

  if (path.empty()) return std::unexpected("no topic: give kafka://HOSTS/TOPIC");
  auto topic = percent_decode(path, "topic");
  if (!topic) return std::unexpected(topic.error());
  if (auto problem = topic_problem(*topic, "the topic")) return std::unexpected(*problem);
  out.topic = std::move(*topic);

  bool dead_letter_set = false;
  std::string id_from = "header";
  auto parameters = query_parameters(query);
  if (!parameters) return std::unexpected(parameters.error());
  for (auto& [name, value] : *parameters) {
    if (role == KafkaUrlRole::sink && source_only().contains(name)) {
      return std::unexpected("parameter " + name + " is for source URLs; a sink takes id_header, client_id and the " +
                             "security parameters");
    }

    auto plain_text = [&](std::string& into) -> std::expected<void, std::string> {
      if (value.empty()) return std::unexpected("parameter " + name + " is empty");
      if (value.find('\0') != std::string::npos) return std::unexpected("parameter " + name + " cannot contain NUL (%00)");
      into = std::move(value);
      return {};
    };
    std::expected<void, std::string> ok;
    if (name == "group") {
      if (!visible_ascii(value) || value.empty() || value.size() > 255) {
        return std::unexpected("group=" + value + ": give 1-255 visible ASCII characters");
      }
      out.group = std::move(value);
    } else if (name == "dead_letter_topic") {
      if (auto problem = topic_problem(value, "dead_letter_topic")) return std::unexpected(*problem);
      out.dead_letter_topic = std::move(value);
      dead_letter_set = true;
    } else if (name == "id_from") {
      if (value != "header" && value != "key") return std::unexpected("id_from=" + value + ": give header or key");
      id_from = value;
    } else if (name == "start") {
      if (value != "earliest" && value != "latest") return std::unexpected("start=" + value + ": give earliest or latest");
      out.start_at_earliest = value == "earliest";
    } else if (name == "id_header") {
      if (!visible_ascii(value) || value.empty()) return std::unexpected("id_header=" + value + ": give a header name");
      out.id_header = std::move(value);
    } else if (name == "client_id") {
      if (!visible_ascii(value) || value.empty()) return std::unexpected("client_id=" + value + ": give visible ASCII characters");
      out.client_id = std::move(value);
    } else if (name == "session_timeout_ms") {
      auto ms = parse_millis(name, value, 1000, 3'600'000);
      if (!ms) return std::unexpected(ms.error());
      out.session_timeout = *ms;
    } else if (name == "heartbeat_interval_ms") {
      auto ms = parse_millis(name, value, 100, 3'600'000);
      if (!ms) return std::unexpected(ms.error());
      out.heartbeat_interval = *ms;
    } else if (name == "commit_interval_ms") {
      auto ms = parse_millis(name, value, 0, 3'600'000);
      if (!ms) return std::unexpected(ms.error());
      out.commit_interval = *ms;
    } else if (name == "revoke_timeout_ms") {
      auto ms = parse_millis(name, value, 0, 600'000);
      if (!ms) return std::unexpected(ms.error());
      out.revoke_timeout = *ms;
    } else if (name == "requeue_delay_ms") {
      auto ms = parse_millis(name, value, 0, 3'600'000);
      if (!ms) return std::unexpected(ms.error());
      out.requeue_delay = *ms;
    } else if (name == "security_protocol") {
      const std::string p = lower(value);
      if (p != "plaintext" && p != "ssl" && p != "sasl_plaintext" && p != "sasl_ssl") {
        return std::unexpected("security_protocol=" + value + ": give plaintext, ssl, sasl_plaintext or sasl_ssl");
      }
      out.security_protocol = p;
    } else if (name == "sasl_mechanism") {
      const std::string m = upper(value);
      if (m != "PLAIN" && m != "SCRAM-SHA-256" && m != "SCRAM-SHA-512") {
        return std::unexpected("sasl_mechanism=" + value + ": give PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512");
      }
      out.sasl_mechanism = m;
    } else if (name == "sasl_username") {
      if (userinfo_given) return std::unexpected("the user is given twice: in the URL (USER:PASSWORD@) and as sasl_username");
      ok = plain_text(out.sasl_username);
    } else if (name == "sasl_password") {
      if (userinfo_given) return std::unexpected("the password is given twice: in the URL (USER:PASSWORD@) and as sasl_password");
      ok = plain_text(out.sasl_password);
    } else if (name == "ssl_ca_location") {
      ok = plain_text(out.ssl_ca_location);
    } else if (name == "ssl_certificate_location") {
      ok = plain_text(out.ssl_certificate_location);
    } else if (name == "ssl_key_location") {
      ok = plain_text(out.ssl_key_location);
    } else if (name == "ssl_key_password") {
      ok = plain_text(out.ssl_key_password);
    } else {
      return std::unexpected("unknown parameter " + name);
    }
    if (!ok) return std::unexpected(ok.error());
  }

  // Credentials decide the defaults, and a protocol that would not use them is a mistake.
  const bool credentials = !out.sasl_username.empty() || !out.sasl_password.empty();
  const bool protocol_given = std::any_of(parameters->begin(), parameters->end(),
                                          [](const UrlParameter& p) { return p.name == "security_protocol"; });
  if (credentials && out.sasl_username.empty()) return std::unexpected("a SASL password without a user name (sasl_username)");
  if (credentials && !protocol_given) out.security_protocol = "sasl_ssl";
  const bool sasl = out.security_protocol.starts_with("sasl_");
  if (credentials && !sasl) {
    return std::unexpected("credentials need security_protocol=sasl_ssl or sasl_plaintext, not " + out.security_protocol);
  }
  if (sasl && !credentials) return std::unexpected("security_protocol=" + out.security_protocol + " needs a user and password");
  if (!out.sasl_mechanism.empty() && !sasl) return std::unexpected("sasl_mechanism needs a sasl_* security_protocol");
  if (sasl && out.sasl_mechanism.empty()) out.sasl_mechanism = "PLAIN";
  const bool tls = out.security_protocol == "ssl" || out.security_protocol == "sasl_ssl";
  if (!tls && (!out.ssl_ca_location.empty() || !out.ssl_certificate_location.empty() || !out.ssl_key_location.empty() ||
               !out.ssl_key_password.empty())) {
    return std::unexpected("ssl_* parameters need security_protocol=ssl or sasl_ssl");
  }
  if (out.ssl_certificate_location.empty() != out.ssl_key_location.empty()) {
    return std::unexpected("a client certificate needs both ssl_certificate_location and ssl_key_location");
  }

  if (role == KafkaUrlRole::source) {
    out.id_from = id_from == "key" ? KafkaIdFrom::key : KafkaIdFrom::header;
    if (out.group.empty()) return std::unexpected("a source needs ?group=GROUP");
    if (!dead_letter_set) {
      out.dead_letter_topic = out.topic + ".dead-letter";
      if (out.dead_letter_topic.size() > kMaxTopicLength) {
        return std::unexpected("the default dead_letter_topic (<topic>.dead-letter) is longer than 249 characters: name one");
      }
    }
    if (out.dead_letter_topic == out.topic) return std::unexpected("dead_letter_topic cannot be the topic consumed");
    if (out.heartbeat_interval >= out.session_timeout) {
      return std::unexpected("heartbeat_interval_ms must be shorter than session_timeout_ms (a third of it is usual)");
    }
  }
  return out;
}

}  // namespace

std::string KafkaUrl::bootstrap_servers() const {
  std::string out;
  for (const auto& [host, port] : brokers) {
    if (!out.empty()) out += ',';
    out += host.find(':') != std::string::npos ? "[" + host + "]" : host;
    out += ':' + std::to_string(port);
  }
  return out;
}

std::string redact_kafka_url(std::string_view url) {
  std::string out = redact_url(url);
  // redact_url knows `password=` but not librdkafka's names for the two passwords.
  const auto q = out.find('?');
  if (q == std::string::npos) return out;
  std::size_t pos = q + 1;
  while (pos < out.size()) {
    std::size_t end = out.find('&', pos);
    if (end == std::string::npos) end = out.size();
    const std::size_t eq = out.find('=', pos);
    if (eq != std::string::npos && eq < end && eq > pos) {
      std::string name = out.substr(pos, eq - pos);
      // "%73asl_password" names it as well: compare decoded, case-insensitively.
      auto decoded = percent_decode(name, "name");
      if (is_password_parameter(decoded ? *decoded : name) && end > eq + 1) {
        out.replace(eq + 1, end - eq - 1, "***");
        end = eq + 4;
      }
    }
    pos = end + 1;
  }
  return out;
}

BrokerResult<KafkaUrl> parse_kafka_url(std::string_view url, KafkaUrlRole role) {
  auto parsed = parse(url, role);
  if (!parsed) return std::unexpected(BrokerError{BrokerErrc::invalid, redact_kafka_url(url) + ": " + parsed.error(), false});
  return std::move(*parsed);
}

}  // namespace idem
