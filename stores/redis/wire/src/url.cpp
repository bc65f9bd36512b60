#include "idem/redis_wire/url.hpp"

#include <charconv>

namespace idem::redis_detail {

std::expected<std::string, std::string> percent_decode(std::string_view in, std::string_view what) {
  std::string out;
  out.reserve(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out.push_back(in[i]);
      continue;
    }
    unsigned value = 0;
    const std::string bad = "bad percent-escape in " + std::string(what);
    if (i + 2 >= in.size()) return std::unexpected(bad);
    auto [ptr, ec] = std::from_chars(in.data() + i + 1, in.data() + i + 3, value, 16);
    if (ec != std::errc{} || ptr != in.data() + i + 3) return std::unexpected(bad);
    out.push_back(static_cast<char>(value));
    i += 2;
  }
  return out;
}

std::expected<Address, std::string> parse_host_port(std::string_view text, bool port_required) {
  Address a;
  std::string_view host = text, port;
  if (text.starts_with('[')) {  // [IPv6]:port
    const auto close = text.find(']');
    if (close == std::string_view::npos) return std::unexpected("unclosed '[' in \"" + std::string(text) + "\"");
    host = text.substr(1, close - 1);
    std::string_view rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') return std::unexpected("bad address \"" + std::string(text) + "\"");
      port = rest.substr(1);
    }
  } else if (const auto colon = text.rfind(':'); colon != std::string_view::npos) {
    host = text.substr(0, colon);
    port = text.substr(colon + 1);
  }
  if (host.empty()) return std::unexpected("missing host in \"" + std::string(text) + "\"");
  a.host = std::string(host);
  if (port.empty()) {
    if (port_required) return std::unexpected("missing port in \"" + std::string(text) + "\"");
    return a;
  }
  int value = 0;
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (ec != std::errc{} || ptr != port.data() + port.size() || value <= 0 || value > 65535) {
    return std::unexpected("bad port in \"" + std::string(text) + "\"");
  }
  a.port = value;
  return a;
}

std::string Address::str() const {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

std::expected<Address, std::string> parse_address(std::string_view text) { return parse_host_port(text, true); }

std::expected<RedisUrl, std::string> parse_redis_url(std::string_view url) {
  RedisUrl out;
  std::string_view rest;
  if (url.starts_with("redis+cluster://")) {
    out.cluster = true;
    rest = url.substr(16);
  } else if (url.starts_with("redis://")) {
    rest = url.substr(8);
  } else if (url.starts_with("rediss://")) {
    return std::unexpected("TLS (rediss://) is not supported by this build");
  } else {
    return std::unexpected("the URL must start with redis:// or redis+cluster://");
  }
  if (const auto at = rest.rfind('@'); at != std::string_view::npos) {
    std::string_view userinfo = rest.substr(0, at);
    rest = rest.substr(at + 1);
    std::string_view user = userinfo, password;
    if (const auto colon = userinfo.find(':'); colon != std::string_view::npos) {
      user = userinfo.substr(0, colon);
      password = userinfo.substr(colon + 1);
    } else {
      // redis://secret@host: a lone userinfo is the password (the default user), like redis-cli.
      password = userinfo;
      user = {};
    }
    auto u = percent_decode(user);
    auto p = percent_decode(password);
    if (!u) return std::unexpected(u.error());
    if (!p) return std::unexpected(p.error());
    out.user = std::move(*u);
    out.password = std::move(*p);
  }
  std::string_view hosts = rest;
  if (const auto slash = rest.find('/'); slash != std::string_view::npos) {
    hosts = rest.substr(0, slash);
    std::string_view db = rest.substr(slash + 1);
    if (!db.empty()) {
      if (out.cluster) return std::unexpected("a Redis Cluster has only database 0; drop the /DB");
      auto [ptr, ec] = std::from_chars(db.data(), db.data() + db.size(), out.db);
      if (ec != std::errc{} || ptr != db.data() + db.size() || out.db < 0) {
        return std::unexpected("bad database number \"" + std::string(db) + "\"");
      }
    }
  }
  if (hosts.empty()) return std::unexpected("missing host");
  while (true) {
    const auto comma = hosts.find(',');
    auto address = parse_host_port(hosts.substr(0, comma), out.cluster);
    if (!address) return std::unexpected(address.error());
    out.nodes.push_back(std::move(*address));
    if (comma == std::string_view::npos) break;
    hosts = hosts.substr(comma + 1);
  }
  if (!out.cluster && out.nodes.size() != 1) {
    return std::unexpected("redis:// takes one HOST[:PORT]; use redis+cluster:// for a cluster");
  }
  return out;
}

}  // namespace idem::redis_detail
