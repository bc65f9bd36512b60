#pragma once

// RedisOptions::url: redis://[[USER]:PASSWORD@]HOST[:PORT][/DB] and
// redis+cluster://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...].

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

}  // namespace idem::redis_detail
