#pragma once

// What the live stream tests share: the test server from IDEM_TEST_REDIS_URL (without it every
// test is skipped, loudly, or fails under CI=true), fresh stream names, a plain blocking client
// for the tests' own commands, and a private redis-server a test may stop and start.

#include <sys/types.h>

#include <string>
#include <vector>

#include "idem/redis_wire/connection.hpp"

namespace idem::redis_streams::test {

/// The standalone test server; throws (failing the test) when IDEM_TEST_REDIS_URL is not set.
redis_detail::Address server();

/// A redis+stream:// URL for `stream` on `address`, with `query` ("group=g&...") and userinfo
/// ("user:pass", empty for none).
std::string stream_url(const redis_detail::Address& address, const std::string& stream, const std::string& query = "",
                       const std::string& userinfo = "");

/// A stream name no other test (or run) uses.
std::string unique_stream(const std::string& what);

/// A blocking connection for the tests' own commands.
class RawRedis {
 public:
  explicit RawRedis(const redis_detail::Address& address);
  /// The reply (error replies included); throws for a broken connection.
  redis_detail::Reply call(const std::vector<std::string>& args);
  /// An integer reply; throws on anything else.
  long long integer(const std::vector<std::string>& args);

 private:
  redis_detail::Address address_;
  redis_detail::Connection connection_;
};

/// A redis-server of the test's own on a free loopback port, AOF with fsync on every write,
/// under a temporary directory removed at the end; stopped by its PID.
class PrivateRedis {
 public:
  PrivateRedis();
  ~PrivateRedis();
  PrivateRedis(const PrivateRedis&) = delete;
  PrivateRedis& operator=(const PrivateRedis&) = delete;

  redis_detail::Address address() const { return {"127.0.0.1", port_}; }
  /// SIGTERM (Redis writes its AOF and exits), then waits for the process.
  void stop();
  /// Starts it again on the same port and data; returns once it answers PING.
  void start();

 private:
  std::string dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace idem::redis_streams::test
