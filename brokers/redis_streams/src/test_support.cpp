#include "test_support.hpp"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <thread>

#include "idem/testing/loopback_listener.hpp"

namespace idem::redis_streams::test {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

bool in_ci() {
  const char* ci = env("CI");
  return ci && std::string_view(ci) == "true";
}

const char* const kNoServer =
    "IDEM_TEST_REDIS_URL is not set, so there is no Redis to test the stream broker against. scripts/test starts "
    "one; by hand: `bash scripts/lib/servers.sh start DIR redis && source DIR/env`.";

// Without a server: under CI=true every test runs and fails on server(); otherwise all are
// skipped (the "[  SKIPPED ]" line makes ctest report them as skipped, not passed).
class RedisEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    if (env("IDEM_TEST_REDIS_URL")) return;
    if (in_ci()) {
      std::fprintf(stderr, "\n*** FAILING every Redis Streams test: %s (CI=true: they never skip in CI) ***\n\n",
                   kNoServer);
      return;
    }
    std::printf("\n[  SKIPPED ] *** every Redis Streams test: %s ***\n\n", kNoServer);
    std::fflush(stdout);
    GTEST_SKIP() << kNoServer;
  }
};

[[maybe_unused]] ::testing::Environment* const registered = ::testing::AddGlobalTestEnvironment(new RedisEnvironment);

redis_detail::Connection connect_to(const redis_detail::Address& address) {
  redis_detail::ConnectSettings settings;
  settings.connect_timeout = std::chrono::seconds(5);
  settings.command_timeout = std::chrono::seconds(5);
  auto c = redis_detail::Connection::open(address, settings, /*nonblocking=*/false);
  if (!c) throw std::runtime_error("connect " + address.str() + ": " + c.error().detail);
  return std::move(*c);
}

std::string percent_encoded(const std::string& s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == ':') {
      out.push_back(static_cast<char>(c));
    } else {
      out += {'%', hex[c >> 4], hex[c & 15]};
    }
  }
  return out;
}

}  // namespace

redis_detail::Address server() {
  const char* url = env("IDEM_TEST_REDIS_URL");
  if (!url) {
    throw std::runtime_error(std::string(kNoServer) + (in_ci() ? " (CI=true: Redis tests never skip in CI)" : ""));
  }
  auto parsed = redis_detail::parse_redis_url(url);
  if (!parsed || parsed->nodes.size() != 1) throw std::runtime_error("IDEM_TEST_REDIS_URL is not a redis:// URL");
  return parsed->nodes.front();
}

std::string stream_url(const redis_detail::Address& address, const std::string& stream, const std::string& query,
                       const std::string& userinfo) {
  return "redis+stream://" + (userinfo.empty() ? "" : userinfo + "@") + address.str() + "/" + percent_encoded(stream) +
         (query.empty() ? "" : "?" + query);
}

std::string unique_stream(const std::string& what) {
  static std::atomic<int> counter{0};
  static const unsigned salt = std::random_device{}();
  return "idem-test-stream:" + what + ":" + std::to_string(::getpid()) + "-" + std::to_string(salt % 100000) + "-" +
         std::to_string(counter++);
}

RawRedis::RawRedis(const redis_detail::Address& address) : address_(address), connection_(connect_to(address)) {}

redis_detail::Reply RawRedis::call(const std::vector<std::string>& args) {
  auto reply = connection_.call(args);
  if (!reply) throw std::runtime_error(address_.str() + " " + args.front() + ": " + reply.error().detail);
  return std::move(*reply);
}

long long RawRedis::integer(const std::vector<std::string>& args) {
  auto r = call(args);
  if (r.type != redis_detail::Reply::Type::integer) {
    throw std::runtime_error(args.front() + ": not an integer: " + r.str);
  }
  return r.integer;
}

// ---- PrivateRedis -------------------------------------------------------------------------------

PrivateRedis::PrivateRedis() {
  std::string pattern = (std::filesystem::temp_directory_path() / "idem-streams-redis-XXXXXX").string();
  if (!::mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed");
  dir_ = pattern;
  {
    const auto probe = testing::listen_on_loopback("a free port for redis-server");
    port_ = probe.port;
    ::close(probe.fd);
  }
  start();
}

PrivateRedis::~PrivateRedis() {
  if (pid_ > 0) {
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
  }
  std::error_code ignored;
  std::filesystem::remove_all(dir_, ignored);
}

void PrivateRedis::start() {
  if (pid_ > 0) throw std::runtime_error("redis-server is running already");
  const std::string port = std::to_string(port_);
  const std::string log = dir_ + "/redis.log";
  // Built before fork: the child only calls exec.
  std::vector<std::string> args = {"redis-server", "--port",    port, "--bind",       "127.0.0.1", "--dir",
                                   dir_,           "--logfile", log,  "--appendonly", "yes",       "--appendfsync",
                                   "always",       "--save",    "",   "--daemonize",  "no"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    // Gone with the test if it dies: no redis-server is left behind.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::execvp("redis-server", argv.data());
    ::_exit(127);
  }
  pid_ = pid;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    redis_detail::ConnectSettings settings;
    settings.connect_timeout = std::chrono::milliseconds(200);
    settings.command_timeout = std::chrono::milliseconds(200);
    if (auto c = redis_detail::Connection::open(address(), settings, false)) {
      if (auto pong = c->call({"PING"}); pong && pong->is_text()) return;
    }
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      throw std::runtime_error("redis-server exited at start; see " + log);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  throw std::runtime_error("redis-server did not answer within 20 s; see " + log);
}

void PrivateRedis::stop() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGTERM);
  ::waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

}  // namespace idem::redis_streams::test
