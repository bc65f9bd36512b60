#include "test_support.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <stdexcept>

#include "idem/testing/loopback_listener.hpp"

namespace idem::pgtest {
namespace {

std::mutex schemas_mutex;
std::vector<std::string>& created_schemas() {
  static std::vector<std::string> schemas;
  return schemas;
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

const char* const kNoServer =
    "IDEM_TEST_POSTGRES_URL is not set, so there is no PostgreSQL server to test against. scripts/test starts "
    "one; by hand: `bash scripts/lib/servers.sh start DIR && source DIR/env`.";

bool in_ci() {
  const char* ci = env("CI");
  return ci && std::string_view(ci) == "true";
}

// Checks for the server once per test program and drops the schemas the tests made. Without a
// server: under CI=true every test runs and fails on server_url(); otherwise all are skipped
// (the "[  SKIPPED ]" line makes ctest report them as skipped, not passed).
class PostgresEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    if (env("IDEM_TEST_POSTGRES_URL")) return;
    if (in_ci()) {
      std::fprintf(stderr, "\n*** FAILING every PostgreSQL test: %s (CI=true: they never skip in CI) ***\n\n", kNoServer);
      return;
    }
    std::printf("\n[  SKIPPED ] *** every PostgreSQL test: %s ***\n\n", kNoServer);
    std::fflush(stdout);
    GTEST_SKIP() << kNoServer;
  }

  void TearDown() override {
    std::vector<std::string> schemas;
    {
      std::lock_guard lock(schemas_mutex);
      schemas.swap(created_schemas());
    }
    if (schemas.empty() || !env("IDEM_TEST_POSTGRES_URL")) return;
    try {
      RawConn conn;
      for (const auto& s : schemas) conn.exec("DROP SCHEMA IF EXISTS \"" + s + "\" CASCADE");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "warning: could not drop test schemas: %s\n", e.what());
    }
  }
};

[[maybe_unused]] ::testing::Environment* const registered =
    ::testing::AddGlobalTestEnvironment(new PostgresEnvironment);

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) throw std::runtime_error("bind failed");
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace

std::string server_url() {
  const char* url = env("IDEM_TEST_POSTGRES_URL");
  if (!url) throw std::runtime_error(std::string(kNoServer) + (in_ci() ? " (CI=true: PostgreSQL tests never skip in CI)" : ""));
  return url;
}

std::string fresh_schema(const std::string& prefix) {
  static std::atomic<int> counter{0};
  static const unsigned salt = std::random_device{}();
  char name[96];
  std::snprintf(name, sizeof name, "%s_%d_%08x_%d", prefix.c_str(), static_cast<int>(::getpid()), salt, counter++);
  std::lock_guard lock(schemas_mutex);
  created_schemas().push_back(name);
  return name;
}

PostgresOptions options_for(const std::string& schema, const std::string& url) {
  PostgresOptions o;
  o.conninfo = url;
  o.schema = schema;
  o.application_name = "idem-test";
  // Tests share a 2-core machine with a parallel ctest, a private server's initdb and fsync-heavy
  // benchmarks: a backend can take seconds to start. Tests of the timeout itself set their own.
  o.connect_timeout = std::chrono::seconds(15);
  return o;
}

std::unique_ptr<PostgresStore> open_store(PostgresOptions options) {
  auto store = PostgresStore::open(std::move(options));
  if (!store) throw std::runtime_error("PostgresStore::open: " + store.error().message);
  return std::move(*store);
}

RawConn::RawConn(const std::string& url) : conn_(PQconnectdb(url.c_str())) {
  if (PQstatus(conn_) != CONNECTION_OK) {
    std::string message = PQerrorMessage(conn_);
    PQfinish(conn_);
    throw std::runtime_error("connect " + url + ": " + message);
  }
  PQsetNoticeProcessor(conn_, [](void*, const char*) {}, nullptr);
}

RawConn::~RawConn() { PQfinish(conn_); }

std::optional<std::string> RawConn::exec(const std::string& sql) {
  PGresult* r = PQexec(conn_, sql.c_str());
  const auto status = PQresultStatus(r);
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
    std::string message = PQresultErrorMessage(r);
    PQclear(r);
    throw std::runtime_error(sql + ": " + message);
  }
  std::optional<std::string> out;
  if (PQntuples(r) > 0 && PQnfields(r) > 0 && !PQgetisnull(r, 0, 0)) out = PQgetvalue(r, 0, 0);
  PQclear(r);
  return out;
}

std::vector<std::string> RawConn::column(const std::string& sql) {
  PGresult* r = PQexec(conn_, sql.c_str());
  if (PQresultStatus(r) != PGRES_TUPLES_OK) {
    std::string message = PQresultErrorMessage(r);
    PQclear(r);
    throw std::runtime_error(sql + ": " + message);
  }
  std::vector<std::string> out;
  for (int i = 0; i < PQntuples(r); ++i) out.emplace_back(PQgetvalue(r, i, 0));
  PQclear(r);
  return out;
}

int run_as_postgres(const std::string& command) {
  const std::string full = ::geteuid() == 0 ? "runuser -u postgres -- sh -c " + shell_quote(command) : command;
  return std::system(full.c_str());
}

int port_of(const std::string& url) {
  const auto at = url.rfind('@');
  const auto colon = url.find(':', at == std::string::npos ? url.find("//") + 2 : at);
  if (colon == std::string::npos) return 5432;
  return std::atoi(url.c_str() + colon + 1);
}

// ---- PrivateServer ----------------------------------------------------------------------------

PrivateServer::PrivateServer() {
  const char* bin = env("IDEM_TEST_POSTGRES_BIN");
  if (!bin) throw std::runtime_error("IDEM_TEST_POSTGRES_BIN is not set (scripts/lib/servers.sh sets it)");
  bin_ = bin;
  std::string pattern = (std::filesystem::temp_directory_path() / "idem-pg-private-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
  dir_ = pattern;
  ::chmod(dir_.c_str(), 0755);
  if (::geteuid() == 0 && std::system(("chown postgres: " + shell_quote(dir_)).c_str()) != 0) {
    throw std::runtime_error("chown postgres " + dir_ + " failed");
  }
  const std::string initdb = bin_ + "/initdb -D " + dir_ + "/data -A trust -U idem --no-sync -E UTF8 >" + dir_ +
                             "/initdb.log 2>&1";
  if (run_as_postgres(initdb) != 0) throw std::runtime_error("initdb failed; see " + dir_ + "/initdb.log");
  port_ = free_port();
  start();
}

PrivateServer::~PrivateServer() {
  run_as_postgres(bin_ + "/pg_ctl -D " + dir_ + "/data -m immediate -w -t 30 stop >/dev/null 2>&1");
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

std::string PrivateServer::url() const { return "postgres://idem@127.0.0.1:" + std::to_string(port_) + "/postgres"; }

void PrivateServer::stop() {
  if (run_as_postgres(bin_ + "/pg_ctl -D " + dir_ + "/data -m fast -w -t 30 stop >/dev/null 2>&1") != 0) {
    throw std::runtime_error("pg_ctl stop failed");
  }
}

void PrivateServer::start() {
  const std::string opts = "-p " + std::to_string(port_) + " -k " + dir_ +
                           "/data -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100";
  const std::string cmd = bin_ + "/pg_ctl -D " + dir_ + "/data -l " + dir_ + "/server.log -w -t 30 -o " +
                          shell_quote(opts) + " start >/dev/null 2>&1";
  if (run_as_postgres(cmd) != 0) throw std::runtime_error("pg_ctl start failed; see " + dir_ + "/server.log");
}

// ---- Proxy ------------------------------------------------------------------------------------

Proxy::Proxy(std::string target_host, int target_port) : host_(std::move(target_host)), target_port_(target_port) {
  const auto listener = testing::listen_on_loopback("proxy");
  listen_fd_ = listener.fd;
  port_ = listener.port;
  thread_ = std::thread([this] { loop(); });
}

Proxy::~Proxy() {
  stop_ = true;
  thread_.join();
  ::close(listen_fd_);
}

std::string Proxy::url_via(const std::string& url) const {
  const auto at = url.rfind('@');
  const auto colon = url.find(':', at);
  const auto slash = url.find('/', colon);
  return url.substr(0, colon + 1) + std::to_string(port_) + url.substr(slash);
}

void Proxy::cut() {
  cut_ = true;
  while (cut_) std::this_thread::sleep_for(std::chrono::milliseconds(5));
}

void Proxy::freeze() {
  frozen_ = true;
  std::this_thread::sleep_for(std::chrono::milliseconds(60));  // let the loop notice
}

void Proxy::thaw() { frozen_ = false; }

void Proxy::loop() {
  struct Pair {
    int client, server;
  };
  std::vector<Pair> pairs;
  auto close_pair = [](Pair& p) {
    ::close(p.client);
    ::close(p.server);
    p.client = p.server = -1;
  };
  char buf[65536];
  while (!stop_) {
    if (cut_) {
      for (auto& p : pairs) close_pair(p);
      pairs.clear();
      cut_ = false;
    }
    const bool frozen = frozen_;
    std::vector<pollfd> fds;
    if (!frozen) {
      fds.push_back({listen_fd_, POLLIN, 0});
      for (auto& p : pairs) {
        fds.push_back({p.client, POLLIN, 0});
        fds.push_back({p.server, POLLIN, 0});
      }
    }
    if (fds.empty()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    if (::poll(fds.data(), fds.size(), 20) <= 0) continue;
    const std::size_t polled = pairs.size();  // pairs accepted below have no entry in fds yet
    if (fds[0].revents & POLLIN) {
      const int client = ::accept(listen_fd_, nullptr, nullptr);
      if (client >= 0) {
        const int server = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in addr{};
        addr.sin_family = AF_INET;
        addr.sin_port = htons(static_cast<uint16_t>(target_port_));
        ::inet_pton(AF_INET, host_.c_str(), &addr.sin_addr);
        if (::connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
          pairs.push_back({client, server});
        } else {
          ::close(client);
          ::close(server);
        }
      }
    }
    for (std::size_t i = 0; i < polled; ++i) {
      for (int side = 0; side < 2; ++side) {
        const pollfd& f = fds[1 + 2 * i + static_cast<std::size_t>(side)];
        if (!(f.revents & (POLLIN | POLLHUP | POLLERR))) continue;
        Pair& p = pairs[i];
        if (p.client < 0) continue;
        const int from = side == 0 ? p.client : p.server;
        const int to = side == 0 ? p.server : p.client;
        const ssize_t n = ::read(from, buf, sizeof buf);
        if (n <= 0) {
          close_pair(p);
          continue;
        }
        for (ssize_t off = 0; off < n;) {
          const ssize_t w = ::send(to, buf + off, static_cast<std::size_t>(n - off), MSG_NOSIGNAL);
          if (w <= 0) break;
          off += w;
        }
      }
    }
    std::erase_if(pairs, [](const Pair& p) { return p.client < 0; });
  }
  for (auto& p : pairs) close_pair(p);
}

}  // namespace idem::pgtest
