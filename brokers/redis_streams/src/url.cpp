// parse_redis_stream_url: the redis+stream:// forms of idem/redis_stream_broker.hpp, read with
// the same pieces as the store's redis:// URLs (idem/redis_wire/url.hpp) so that userinfo,
// hosts and percent-escapes mean the same in both.
#include "idem/redis_wire/url.hpp"

#include <charconv>
#include <set>

#include "idem/redis_stream_broker.hpp"

namespace idem {
namespace {

constexpr std::string_view kScheme = "redis+stream://";

BrokerError invalid(std::string message) {
  return {BrokerErrc::invalid, "redis+stream URL: " + std::move(message), false};
}

template <class Int>
bool parse_number(std::string_view text, Int& out) {
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc{} && ptr == text.data() + text.size() && !text.empty();
}

// One query parameter, applied to `out`. Names are compared as written: they are ours, and a
// percent-encoded name is as likely a typo as anything else.
BrokerResult<Done> apply_parameter(std::string_view name, std::string value, RedisStreamRole role,
                                   RedisStreamUrl& out) {
  const bool source = role == RedisStreamRole::source;
  auto for_role = [&](bool ok) -> BrokerResult<Done> {
    if (ok) return Done{};
    return std::unexpected(invalid("parameter '" + std::string(name) + "' is for a " + (source ? "sink" : "source") +
                                   " URL, not a " + (source ? "source" : "sink") + "'s"));
  };
  if (name == "db") {
    if (!parse_number(value, out.db) || out.db < 0) {
      return std::unexpected(invalid("db must be a database number (0, 1, ...)"));
    }
    return Done{};
  }
  if (name == "group") {
    if (auto ok = for_role(source); !ok) return ok;
    if (value.empty()) return std::unexpected(invalid("group is empty"));
    out.group = std::move(value);
    return Done{};
  }
  if (name == "dead_letter") {
    if (auto ok = for_role(source); !ok) return ok;
    if (value.empty()) return std::unexpected(invalid("dead_letter is empty"));
    out.dead_letter = std::move(value);
    return Done{};
  }
  if (name == "start") {
    if (auto ok = for_role(source); !ok) return ok;
    if (value != "0" && value != "$") {
      return std::unexpected(invalid("start must be 0 (the stream's first entry) or $ (entries added from now on)"));
    }
    out.start = std::move(value);
    return Done{};
  }
  if (name == "maxlen") {
    if (auto ok = for_role(!source); !ok) return ok;
    std::uint64_t n = 0;
    if (!parse_number(value, n) || n == 0) {
      return std::unexpected(invalid("maxlen must be a positive number of entries"));
    }
    out.maxlen = n;
    return Done{};
  }
  return std::unexpected(invalid("unknown parameter '" + std::string(name) + "'"));
}

}  // namespace

BrokerResult<RedisStreamUrl> parse_redis_stream_url(std::string_view url, RedisStreamRole role) {
  using redis_detail::percent_decode;
  if (!url.starts_with(kScheme)) {
    if (url.starts_with("rediss+stream://")) {
      return std::unexpected(invalid("TLS (rediss+stream://) is not supported by this build"));
    }
    return std::unexpected(invalid("the URL must start with redis+stream://"));
  }
  RedisStreamUrl out;
  std::string_view rest = url.substr(kScheme.size());
  // The userinfo ends at the last '@', as redact_url and the store's parser read it: a password
  // with a raw '@' is read, and hidden, whole.
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
    const std::string_view userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    std::string_view user, password = userinfo;
    if (const auto colon = userinfo.find(':'); colon != std::string_view::npos) {
      user = userinfo.substr(0, colon);
      password = userinfo.substr(colon + 1);
    }
    auto u = percent_decode(user);
    auto p = percent_decode(password);
    if (!u) return std::unexpected(invalid(u.error()));
    if (!p) return std::unexpected(invalid(p.error()));
    if (!u->empty() && p->empty()) return std::unexpected(invalid("user '" + *u + "' has an empty password"));
    out.user = std::move(*u);
    out.password = std::move(*p);
  }

  std::string_view query;
  if (const auto q = rest.find('?'); q != std::string_view::npos) {
    query = rest.substr(q + 1);
    rest = rest.substr(0, q);
  }
  const auto slash = rest.find('/');
  if (slash == std::string_view::npos) return std::unexpected(invalid("missing /STREAM after the host"));
  auto address = redis_detail::parse_host_port(rest.substr(0, slash), /*port_required=*/false);
  if (!address) return std::unexpected(invalid(address.error()));
  out.host = std::move(address->host);
  out.port = address->port;
  auto stream = percent_decode(rest.substr(slash + 1), "the stream name");
  if (!stream) return std::unexpected(invalid(stream.error()));
  if (stream->empty()) return std::unexpected(invalid("missing stream name after the host"));
  out.stream = std::move(*stream);

  std::set<std::string, std::less<>> seen;
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view item = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    if (item.empty()) continue;
    const auto eq = item.find('=');
    const std::string_view name = item.substr(0, eq);
    if (eq == std::string_view::npos) {
      return std::unexpected(invalid("parameter '" + std::string(name) + "' has no value"));
    }
    if (!seen.insert(std::string(name)).second) {
      return std::unexpected(invalid("parameter '" + std::string(name) + "' is given twice"));
    }
    auto value = percent_decode(item.substr(eq + 1), "parameter '" + std::string(name) + "'");
    if (!value) return std::unexpected(invalid(value.error()));
    if (auto ok = apply_parameter(name, std::move(*value), role, out); !ok) return std::unexpected(ok.error());
  }

  if (role == RedisStreamRole::source) {
    if (out.group.empty()) return std::unexpected(invalid("a source needs ?group=GROUP (its consumer group)"));
    if (out.dead_letter.empty()) out.dead_letter = out.stream + ":dead-letter";
    if (out.dead_letter == out.stream) {
      return std::unexpected(invalid("dead_letter names the stream itself: dead letters would be delivered again"));
    }
  }
  return out;
}

}  // namespace idem
