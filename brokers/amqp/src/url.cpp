// parse_amqp_url: amqp[s]://[USER[:PASSWORD]@]HOST[:PORT][/VHOST][?PARAMETERS], as RabbitMQ's URI
// spec reads it, plus idem's query parameters (and RabbitMQ's names for the TLS files:
// cacertfile, certfile, keyfile). No message here quotes the userinfo: a mistyped
// URL's password must not reach a log, so errors name the part that is wrong, and the URL they
// are prefixed with went through redact_url.

#include <charconv>
#include <set>

#include "idem/amqp_broker.hpp"
#include "idem/redact.hpp"
#include "idem/url_decode.hpp"

namespace idem {
namespace {

constexpr std::size_t kMaxShortString = 255;  // AMQP shortstr: queue, exchange and routing key names

std::expected<bool, std::string> parse_bool(std::string_view name, std::string_view value) {
  if (value == "true") return true;
  if (value == "false") return false;
  return std::unexpected(std::string(name) + "=" + std::string(value) + ": give true or false");
}

struct Authority {
  std::string host;
  int port = 5672;
};

std::expected<Authority, std::string> parse_host_port(std::string_view text, int default_port) {
  Authority a;
  a.port = default_port;
  std::string_view host = text, port;
  if (text.starts_with('[')) {  // [IPv6]:port
    const auto close = text.find(']');
    if (close == std::string_view::npos) return std::unexpected("unclosed '[' in the host");
    host = text.substr(1, close - 1);
    const std::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return std::unexpected("junk after the IPv6 address");
      port = rest.substr(1);
      if (port.empty()) return std::unexpected("empty port after ':'");
    }
  } else if (const auto colon = text.rfind(':'); colon != std::string_view::npos) {
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
    if (port.empty()) return std::unexpected("empty port after ':'");
  }
  if (!host.empty()) a.host = std::string(host);
  if (!port.empty()) {
    int value = 0;
    auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (ec != std::errc{} || ptr != port.data() + port.size() || value <= 0 || value > 65535) {
      return std::unexpected("bad port: give a number 1-65535");
    }
    a.port = value;
  }
  return a;
}

std::expected<AmqpUrl, std::string> parse(std::string_view url, AmqpUrlRole role) {
  AmqpUrl out;
  std::string_view rest;
  if (url.starts_with("amqp://")) {
    rest = url.substr(7);
  } else if (url.starts_with("amqps://")) {
    rest = url.substr(8);
    out.tls = true;
    out.port = 5671;
  } else {
    return std::unexpected("the URL must start with amqp:// or amqps://");
  }
  if (const auto hash = rest.find('#'); hash != std::string_view::npos) {
    return std::unexpected("a fragment ('#') has no meaning here; percent-encode '#' in names as %23");
  }

  // The authority ends at the first '/' or '?' (RFC 3986). A '@' after that means a password
  // with a raw '/' or '?' in it: say so rather than connect to a host named after half of it.
  std::string_view query;
  if (const auto q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  const auto slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  const std::string_view path = slash == std::string_view::npos ? std::string_view{} : rest.substr(slash + 1);
  // (In the query only before the first '=': `?queue=a@b` is a queue name, `u:p?x@host` is not.)
  const bool at_in_path = path.find('@') != std::string_view::npos;
  const bool at_in_query = query.substr(0, query.find('@')).find('=') == std::string_view::npos &&
                           query.find('@') != std::string_view::npos;
  if ((at_in_path || at_in_query) && authority.find('@') == std::string_view::npos) {
    return std::unexpected("'@' after the host: percent-encode '/', '?' and '@' in the user and password (%2F, %3F, %40)");
  }

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
    // librabbitmq takes both as C strings (SASL PLAIN separates them with NUL bytes).
    if (user->find('\0') != std::string::npos || password.find('\0') != std::string::npos) {
      return std::unexpected("the user name and password cannot contain NUL (%00)");
    }
    out.user = std::move(*user);
    out.password = std::move(password);
  }
  auto hp = parse_host_port(authority, out.port);
  if (!hp) return std::unexpected(hp.error());
  if (!hp->host.empty()) out.host = std::move(hp->host);
  out.port = hp->port;

  if (path.find('/') != std::string_view::npos) {
    return std::unexpected("a raw '/' in the vhost: write it as %2f (the vhost \"/\" is %2f)");
  }
  if (!path.empty()) {
    auto vhost = percent_decode(path, "vhost");
    if (!vhost) return std::unexpected(vhost.error());
    if (vhost->find('\0') != std::string::npos) return std::unexpected("the vhost cannot contain NUL (%00)");
    out.vhost = vhost->empty() ? "/" : std::move(*vhost);
  }

  bool dead_letter_queue_set = false;
  auto parameters = query_parameters(query);
  if (!parameters) return std::unexpected(parameters.error());
  for (auto& [name, value] : *parameters) {

    const bool source = role == AmqpUrlRole::source;
    const auto not_here = [&](std::string_view kind) -> std::unexpected<std::string> {
      return std::unexpected("parameter " + name + " is for " + std::string(kind) + " URLs; a " +
                             (source ? "source takes queue, dead_letter_exchange, dead_letter_queue, declare, single_active_consumer, "
                                              "heartbeat and (amqps://) cacertfile, certfile, keyfile, passphrasefile"
                                     : "sink takes exchange, routing_key, declare, heartbeat and (amqps://) cacertfile, "
                                       "certfile, keyfile, passphrasefile"));
    };
    auto name_value = [&](std::string& into) -> std::expected<void, std::string> {
      if (value.size() > kMaxShortString) return std::unexpected(name + " is longer than AMQP's 255 bytes");
      into = std::move(value);
      return {};
    };
    std::expected<void, std::string> ok;
    if (name == "queue") {
      if (!source) return not_here("source");
      ok = name_value(out.queue);
    } else if (name == "dead_letter_exchange") {
      if (!source) return not_here("source");
      ok = name_value(out.dead_letter_exchange);
    } else if (name == "dead_letter_queue") {
      if (!source) return not_here("source");
      ok = name_value(out.dead_letter_queue);
      dead_letter_queue_set = true;
    } else if (name == "exchange") {
      if (source) return not_here("sink");
      ok = name_value(out.exchange);
    } else if (name == "routing_key") {
      if (source) return not_here("sink");
      ok = name_value(out.routing_key);
    } else if (name == "declare") {
      auto b = parse_bool(name, value);
      if (!b) return std::unexpected(b.error());
      out.declare = *b;
    } else if (name == "single_active_consumer") {
      if (!source) return not_here("source");
      auto b = parse_bool(name, value);
      if (!b) return std::unexpected(b.error());
      out.single_active_consumer = *b;
    } else if (name == "cacertfile" || name == "certfile" || name == "keyfile" || name == "passphrasefile") {
      if (!out.tls) return std::unexpected(name + "= is for amqps:// (TLS) URLs");
      if (value.empty()) return std::unexpected(name + "= needs a file path");
      if (value.find('\0') != std::string::npos) return std::unexpected(name + "= cannot contain NUL (%00)");
      (name == "cacertfile" ? out.ca_file
       : name == "certfile" ? out.cert_file
       : name == "keyfile"  ? out.key_file
                            : out.key_passphrase_file) = std::move(value);
    } else if (name == "heartbeat") {
      unsigned seconds = 0;
      auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), seconds);
      if (value.empty() || ec != std::errc{} || ptr != value.data() + value.size() || seconds > 65535) {
        return std::unexpected("heartbeat=" + value + ": give whole seconds, 0-65535 (0: none)");
      }
      out.heartbeat = std::chrono::seconds(seconds);
    } else {
      return std::unexpected("unknown parameter " + name);
    }
    if (!ok) return std::unexpected(ok.error());
  }

  if (out.cert_file.empty() != out.key_file.empty()) {
    return std::unexpected("certfile= and keyfile= go together (a client certificate and its key): give both or neither");
  }
  if (!out.key_passphrase_file.empty() && out.key_file.empty()) return std::unexpected("passphrasefile= needs keyfile=");

  if (role == AmqpUrlRole::source) {
    if (out.queue.empty()) return std::unexpected("a source needs ?queue=NAME");
    // The default exchange routes by queue name: the copy would go back to the source queue.
    if (out.dead_letter_exchange.empty()) return std::unexpected("dead_letter_exchange cannot be the default exchange (empty)");
    if (!dead_letter_queue_set) {
      out.dead_letter_queue = out.queue + ".dead-letter";
      if (out.dead_letter_queue.size() > kMaxShortString) {
        return std::unexpected("the default dead_letter_queue (<queue>.dead-letter) is longer than 255 bytes: name one");
      }
    }
    if (out.dead_letter_queue.empty()) return std::unexpected("dead_letter_queue cannot be empty");
    if (out.dead_letter_queue == out.queue) return std::unexpected("dead_letter_queue cannot be the source queue");
  }
  return out;
}

}  // namespace

BrokerResult<AmqpUrl> parse_amqp_url(std::string_view url, AmqpUrlRole role) {
  auto parsed = parse(url, role);
  if (!parsed) return std::unexpected(BrokerError{BrokerErrc::invalid, redact_url(url) + ": " + parsed.error(), false});
  return std::move(*parsed);
}

}  // namespace idem
