#include "idem/admin_server.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace idem::admin {
namespace {

// Sends raw bytes to 127.0.0.1:port and reads until the server closes.
std::string exchange(std::uint16_t port, const std::string& request) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return "connect failed";
  }
  (void)::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return out;
}

TEST(AdminServer, AnswersWhatItsHandlerSays) {
  auto server = AdminServer::start("127.0.0.1", 0, [](const AdminRequest& r) {
    if (r.target == "/healthz") return AdminResponse{200, "text/plain; charset=utf-8", "ok\n"};
    if (r.method == "POST") {
      return AdminResponse{200, "text/plain", std::string(r.header("x-key")) + ":" + std::string(r.body)};
    }
    return AdminResponse{404, "text/plain; charset=utf-8", std::string(r.method) + " " + std::string(r.target) + "?\n"};
  });
  ASSERT_TRUE(server) << server.error();
  const auto port = (*server)->port();
  ASSERT_NE(port, 0);
  const auto ok = exchange(port, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(ok.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << ok;
  EXPECT_NE(ok.find("\r\n\r\nok\n"), std::string::npos);
  const auto missing = exchange(port, "GET /nope HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(missing.rfind("HTTP/1.1 404", 0), 0u) << missing;
  EXPECT_NE(missing.find("GET /nope?"), std::string::npos);
  const auto posted = exchange(port, "POST /x HTTP/1.1\r\nHost: x\r\nX-Key: k1\r\nContent-Length: 5\r\n\r\nhello");
  EXPECT_NE(posted.find("\r\n\r\nk1:hello"), std::string::npos) << posted;
}

TEST(AdminServer, GarbageGetsA400AndTheServerGoesOn) {
  auto server = AdminServer::start("127.0.0.1", 0, [](const AdminRequest&) { return AdminResponse{}; });
  ASSERT_TRUE(server);
  EXPECT_EQ(exchange((*server)->port(), "\x01\x02 garbage\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(exchange((*server)->port(), "GET / HTTP/1.1\r\nHost: " + std::string(20000, 'h') + "\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(exchange((*server)->port(), "POST / HTTP/1.1\r\nContent-Length: 2000000\r\n\r\nx").rfind("HTTP/1.1 413", 0), 0u);
  EXPECT_EQ(exchange((*server)->port(), "GET / HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
}

TEST(AdminServer, AnAddressInUseIsOneLine) {
  auto first = AdminServer::start("127.0.0.1", 0, [](const AdminRequest&) { return AdminResponse{}; });
  ASSERT_TRUE(first);
  auto second = AdminServer::start("127.0.0.1", (*first)->port(), [](const AdminRequest&) { return AdminResponse{}; });
  ASSERT_FALSE(second);
  EXPECT_NE(second.error().find("cannot listen on 127.0.0.1:"), std::string::npos) << second.error();
  EXPECT_FALSE(AdminServer::start("not-an-ip", 0, [](const AdminRequest&) { return AdminResponse{}; }));
}

TEST(PrometheusText, SamplesAndLabels) {
  std::string out;
  append_family(out, "idem_x_total", "counter", "Things.");
  append_sample(out, "idem_x_total", "reason=" + label_value("a\"b"), 3);
  append_sample(out, "idem_y", "", 0.25);
  EXPECT_EQ(out, "# HELP idem_x_total Things.\n# TYPE idem_x_total counter\nidem_x_total{reason=\"a\\\"b\"} 3\nidem_y 0.25\n");
}

TEST(PrometheusText, HistogramsAreCumulative) {
  std::string out;
  const double bounds[] = {0.1, 1};
  const std::uint64_t counts[] = {2, 1, 4};
  append_histogram(out, "idem_t_seconds", "Times.", bounds, counts, 12.5, 7);
  EXPECT_EQ(out,
            "# HELP idem_t_seconds Times.\n# TYPE idem_t_seconds histogram\n"
            "idem_t_seconds_bucket{le=\"0.1\"} 2\nidem_t_seconds_bucket{le=\"1\"} 3\n"
            "idem_t_seconds_bucket{le=\"+Inf\"} 7\nidem_t_seconds_sum 12.5\nidem_t_seconds_count 7\n");
}

}  // namespace
}  // namespace idem::admin
