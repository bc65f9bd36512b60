#pragma once

// What the Redis tests share: the servers' addresses from the environment (scripts/lib/servers.sh
// writes them), a global environment that fails (CI) or skips loudly (elsewhere) when they are
// missing, and a plain blocking client for the tests' own commands.

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "idem/redis_wire/connection.hpp"
#include "idem/redis_wire/url.hpp"

namespace idem::redis_test {

inline std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

inline std::string standalone_url() { return env("IDEM_TEST_REDIS_URL"); }
inline std::string cluster_url() { return env("IDEM_TEST_REDIS_CLUSTER_URL"); }

/// Every cluster node, masters and replicas.
inline std::vector<redis_detail::Address> cluster_nodes() {
  std::vector<redis_detail::Address> out;
  std::stringstream list(env("IDEM_TEST_REDIS_CLUSTER_NODES"));
  for (std::string item; std::getline(list, item, ',');) {
    if (auto a = redis_detail::parse_address(item)) out.push_back(*a);
  }
  return out;
}

/// Fails every test (CI=true) or skips them all, loudly, when the servers are not configured.
class ServersEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    if (!standalone_url().empty() && !cluster_url().empty() && !cluster_nodes().empty()) return;
    const char* message =
        "IDEM_TEST_REDIS_URL, IDEM_TEST_REDIS_CLUSTER_URL and IDEM_TEST_REDIS_CLUSTER_NODES are not set: start "
        "the servers with `bash scripts/lib/servers.sh start DIR` and `source DIR/env` (scripts/test does this)";
    if (env("CI") == "true") {
      FAIL() << message;
    } else {
      std::fprintf(stderr, "\n*** SKIPPING ALL REDIS TESTS: %s ***\n\n", message);
      GTEST_SKIP() << message;
    }
  }
};

/// A plain blocking connection for the tests' own commands (CONFIG, CLUSTER, SCRIPT, ...).
class RawRedis {
 public:
  explicit RawRedis(const redis_detail::Address& address, Millis timeout = Millis{5000}) : address_(address) {
    redis_detail::ConnectSettings settings;
    settings.connect_timeout = timeout;
    settings.command_timeout = timeout;
    auto conn = redis_detail::Connection::open(address, settings, /*nonblocking=*/false);
    if (!conn) throw std::runtime_error("connect " + address.str() + ": " + conn.error().detail);
    conn_.emplace(std::move(*conn));
  }

  /// The reply, or an exception for a broken connection. Error replies are returned as such.
  redis_detail::Reply call(const std::vector<std::string>& args) {
    auto reply = conn_->call(args);
    if (!reply) throw std::runtime_error(address_.str() + " " + args.front() + ": " + reply.error().detail);
    return std::move(*reply);
  }

  /// A text reply (bulk or status); throws on anything else.
  std::string text(const std::vector<std::string>& args) {
    auto r = call(args);
    if (!r.is_text()) throw std::runtime_error(address_.str() + " " + args.front() + ": " + r.str);
    return r.str;
  }

  /// CONFIG GET name.
  std::string config(const std::string& name) {
    auto r = call({"CONFIG", "GET", name});
    if (!r.is_array() || r.elements.size() != 2) throw std::runtime_error("CONFIG GET " + name);
    return r.elements[1].str;
  }

 private:
  redis_detail::Address address_;
  std::optional<redis_detail::Connection> conn_;
};

/// Whether something listens on `address` and answers PING.
inline bool answers(const redis_detail::Address& address) {
  try {
    RawRedis r(address, Millis{300});
    return r.call({"PING"}).is_text();
  } catch (const std::exception&) {
    return false;
  }
}

/// A key prefix no other test run uses: fresh, empty storage for each store a test makes.
inline std::string unique_prefix(const std::string& what) {
  static std::atomic<int> counter{0};
  return "idem-test-" + what + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + ":";
}

}  // namespace idem::redis_test
