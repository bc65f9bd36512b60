#pragma once

// What the PostgreSQL tests share: the server from the environment (IDEM_TEST_POSTGRES_URL,
// set by scripts/test; missing → every test fails under CI=true and skips loudly otherwise),
// throw-away schemas, a raw libpq connection for the tests' own checks, a private server that a
// test may stop and start, and a TCP proxy that can cut or freeze connections.

#include <libpq-fe.h>

#include <atomic>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "idem/postgres_store.hpp"

namespace idem::pgtest {

/// IDEM_TEST_POSTGRES_URL (the global test environment has checked it is set).
std::string server_url();

/// A schema name no other test (or test process) uses; dropped when the test program ends.
std::string fresh_schema(const std::string& prefix = "idem_t");

/// Options for a store over `schema` on the test server.
PostgresOptions options_for(const std::string& schema, const std::string& url = server_url());

/// Opens a store or throws.
std::unique_ptr<PostgresStore> open_store(PostgresOptions options);

/// "schema".table, for the tests' own SQL on a store's schema.
inline std::string qualified(const std::string& schema, const std::string& table) {
  return "\"" + schema + "\"." + table;
}

/// A blocking libpq connection for the tests' own SQL; throws on errors.
class RawConn {
 public:
  explicit RawConn(const std::string& url = server_url());
  ~RawConn();
  RawConn(const RawConn&) = delete;
  RawConn& operator=(const RawConn&) = delete;
  /// Runs SQL (one or more statements); returns the first column of the first row, if any.
  std::optional<std::string> exec(const std::string& sql);
  /// Runs SQL and returns every row's first column.
  std::vector<std::string> column(const std::string& sql);
  PGconn* get() const { return conn_; }

 private:
  PGconn* conn_;
};

/// Runs a shell command (as the postgres user when we are root); returns its exit status.
int run_as_postgres(const std::string& command);

/// A PostgreSQL server of the test's own, in a temporary directory, on a free loopback port,
/// that the test may stop and start (the shared server must keep serving other tests).
class PrivateServer {
 public:
  PrivateServer();  // initdb + start; throws if IDEM_TEST_POSTGRES_BIN is unset or it fails
  ~PrivateServer();
  std::string url() const;
  void stop();   // pg_ctl stop -m fast, waits until it is down
  void start();  // pg_ctl start, waits until it accepts connections
  int port() const { return port_; }

 private:
  std::string bin_, dir_;
  int port_ = 0;
};

/// A loopback TCP proxy to a server: connections through it can be cut (both sides closed) or
/// frozen (bytes held back, sockets left open), to make a connection fail at a chosen moment.
class Proxy {
 public:
  Proxy(std::string target_host, int target_port);
  ~Proxy();
  int port() const { return port_; }
  /// A URL like `url` (postgres://user@host:port/db) that goes through the proxy.
  std::string url_via(const std::string& url) const;
  /// Closes every connection open now; new ones are accepted as before.
  void cut();
  /// Stops forwarding (and accepting) until thaw().
  void freeze();
  void thaw();

 private:
  void loop();
  int listen_fd_ = -1;
  int port_ = 0;
  std::string host_;
  int target_port_;
  std::atomic<bool> stop_{false}, frozen_{false}, cut_{false};
  std::thread thread_;
};

/// The port of a postgres://...:PORT/... URL.
int port_of(const std::string& url);

}  // namespace idem::pgtest
