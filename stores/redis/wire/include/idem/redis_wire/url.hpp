#pragma once

// RedisOptions::url: redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] and
// redis+cluster://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]; and the pieces other Redis URLs
// (the stream broker's redis+stream://) are parsed with, so every Redis URL reads the same.

#include <compare>
#include <expected>
#include <string>
#include <string_view>
#include <vector>

namespace idem::redis_detail {

/// A node's address.
struct Address {
  std::string host;
  int port = 6379;
  /// "host:port" ("[v6]:port" for IPv6), as Redis prints it in MOVED and CLUSTER SLOTS.
  std::string str() const;
  auto operator<=>(const Address&) const = default;
};

/// A parsed store URL.
struct RedisUrl {
  bool cluster = false;
  std::vector<Address> nodes;  ///< the server, or the cluster's seed nodes
  std::string user;            ///< ACL user for AUTH; empty: the default user
  std::string password;        ///< empty: no AUTH
  int db = 0;                  ///< SELECTed on each connection (standalone only)
};

/// Parses a store URL; the error says what is wrong (without echoing the password).
std::expected<RedisUrl, std::string> parse_redis_url(std::string_view url);

/// Parses "host:port" (Redis's form in MOVED/ASK replies).
std::expected<Address, std::string> parse_address(std::string_view text);

/// Parses "host[:port]" or "[v6]:port"; the port defaults to 6379 unless `port_required`.
std::expected<Address, std::string> parse_host_port(std::string_view text, bool port_required);

/// Decodes %XX escapes (userinfo, query values); the error names `what` ("bad percent-escape in
/// credentials") and never echoes the text, which may be a password.
std::expected<std::string, std::string> percent_decode(std::string_view in, std::string_view what = "credentials");

}  // namespace idem::redis_detail
