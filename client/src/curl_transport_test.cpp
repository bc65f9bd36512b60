#include "idem/client/curl_transport.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <stdexcept>
#include <mutex>
#include <thread>

#include "idem/client/client.hpp"

namespace idem::client {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

// A blocking HTTP/1.1 server on 127.0.0.1:<ephemeral>, one request per connection, on its own
// thread. `respond` gets the raw request (head and body) and returns the raw response bytes; an
// empty string closes the connection without answering; "hang" waits until the server stops.
class TinyServer {
 public:
  using Handler = std::function<std::string(const std::string& raw_request)>;

  explicit TinyServer(Handler respond) : respond_(std::move(respond)) {
    listener_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = 0;
    EXPECT_EQ(::bind(listener_, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    EXPECT_EQ(::listen(listener_, 16), 0);
    socklen_t len = sizeof addr;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { loop(); });
  }
  ~TinyServer() {
    stop_ = true;
    thread_.join();
    ::close(listener_);
  }

  std::string url(std::string_view path = "/") const {
    return "http://127.0.0.1:" + std::to_string(port_) + std::string(path);
  }
  std::vector<std::string> requests() const {
    std::lock_guard lock(mutex_);
    return requests_;
  }

 private:
  bool wait_readable(int fd) const {
    while (!stop_) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 20) > 0) return true;
    }
    return false;
  }

  void loop() {
    while (wait_readable(listener_)) {
      const int fd = ::accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0) continue;
      serve(fd);
      ::close(fd);
    }
  }

  void serve(int fd) {
    std::string raw;
    std::size_t head_end = std::string::npos;
    std::size_t content_length = 0;
    char buffer[4096];
    while (true) {
      if (head_end != std::string::npos && raw.size() >= head_end + 4 + content_length) break;
      if (!wait_readable(fd)) return;
      const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n <= 0) return;
      raw.append(buffer, static_cast<std::size_t>(n));
      if (head_end == std::string::npos && (head_end = raw.find("\r\n\r\n")) != std::string::npos) {
        std::string head = raw.substr(0, head_end);
        for (auto& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        if (const auto at = head.find("\r\ncontent-length:"); at != std::string::npos) {
          content_length = std::stoul(head.substr(at + 17));
        }
      }
    }
    {
      std::lock_guard lock(mutex_);
      requests_.push_back(raw);
    }
    const std::string reply = respond_(raw);
    if (reply == "hang") {
      while (!stop_) std::this_thread::sleep_for(milliseconds(10));
      return;
    }
    std::size_t sent = 0;
    while (sent < reply.size()) {
      const ssize_t n = ::send(fd, reply.data() + sent, reply.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += static_cast<std::size_t>(n);
    }
  }

  Handler respond_;
  int listener_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  mutable std::mutex mutex_;
  std::vector<std::string> requests_;
  std::thread thread_;
};

std::string http_response(int status, std::string_view reason, std::string_view extra_headers, std::string_view body) {
  return "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason) + "\r\n" + std::string(extra_headers) +
         "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + std::string(body);
}

// A port nothing listens on: bound, then closed.
int unused_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return ntohs(addr.sin_port);
}

TEST(CurlTransport, RoundTripsMethodHeadersAndBody) {
  TinyServer server([](const std::string&) {
    return http_response(201, "Created", "X-Reply: yes\r\nIdempotent-Replayed: true\r\nX-Dup: 1\r\nX-Dup: 2\r\n",
                         std::string("created\0!", 9));
  });
  CurlTransport transport;
  const HttpRequest request{"POST",
                            server.url("/v1/charges?x=1"),
                            {{"Content-Type", "application/json"}, {"X-Custom", "a b"}, {"Idempotency-Key", "k-0123456789abcdef"}},
                            R"({"amount":100})"};
  const auto response = transport.perform(request, seconds(5));
  ASSERT_TRUE(response.has_value()) << response.error().message;
  EXPECT_EQ(response->status, 201);
  EXPECT_EQ(response->body, std::string("created\0!", 9));
  EXPECT_EQ(find_header(response->headers, "x-reply"), "yes");
  EXPECT_TRUE(is_replay(response->headers));
  int dups = 0;
  for (const auto& h : response->headers) dups += h.name == "X-Dup" ? 1 : 0;
  EXPECT_EQ(dups, 2);

  const auto seen = server.requests();
  ASSERT_EQ(seen.size(), 1u);
  const std::string& raw = seen[0];
  EXPECT_TRUE(raw.starts_with("POST /v1/charges?x=1 HTTP/1.1\r\n")) << raw;
  EXPECT_NE(raw.find("\r\nContent-Type: application/json\r\n"), std::string::npos) << raw;
  EXPECT_NE(raw.find("\r\nX-Custom: a b\r\n"), std::string::npos) << raw;
  EXPECT_NE(raw.find("\r\nIdempotency-Key: k-0123456789abcdef\r\n"), std::string::npos) << raw;
  EXPECT_NE(raw.find("\r\nUser-Agent: idem-client/"), std::string::npos) << raw;
  EXPECT_EQ(raw.find("Expect:"), std::string::npos) << raw;
  EXPECT_TRUE(raw.ends_with("\r\n\r\n{\"amount\":100}")) << raw;
}

TEST(CurlTransport, AddsNoContentTypeOfItsOwnAndSendsOtherMethods) {
  TinyServer server([](const std::string&) { return http_response(200, "OK", "", ""); });
  CurlTransport transport;
  ASSERT_TRUE(transport.perform({"POST", server.url(), {}, "a=1"}, seconds(5)).has_value());
  ASSERT_TRUE(transport.perform({"PATCH", server.url("/p"), {}, "{}"}, seconds(5)).has_value());
  ASSERT_TRUE(transport.perform({"DELETE", server.url("/d"), {}, ""}, seconds(5)).has_value());
  ASSERT_TRUE(transport.perform({"GET", server.url("/g"), {}, ""}, seconds(5)).has_value());
  const auto seen = server.requests();
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0].find("Content-Type"), std::string::npos) << seen[0];
  EXPECT_TRUE(seen[1].starts_with("PATCH /p ")) << seen[1];
  EXPECT_TRUE(seen[1].ends_with("\r\n\r\n{}")) << seen[1];
  EXPECT_TRUE(seen[2].starts_with("DELETE /d ")) << seen[2];
  EXPECT_TRUE(seen[3].starts_with("GET /g ")) << seen[3];
}

TEST(CurlTransport, ConnectionRefusedMeansNothingWasSent) {
  CurlTransport transport;
  const auto r = transport.perform({"POST", "http://127.0.0.1:" + std::to_string(unused_port()) + "/", {}, "x"},
                                   seconds(5));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, TransportErrc::could_not_connect) << r.error().message;
  EXPECT_TRUE(r.error().retryable());
  EXPECT_FALSE(r.error().in_doubt());
}

TEST(CurlTransport, AConnectionDroppedAfterTheRequestIsInDoubt) {
  TinyServer server([](const std::string&) { return std::string(); });
  CurlTransport transport;
  const auto r = transport.perform({"POST", server.url(), {}, "x"}, seconds(5));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, TransportErrc::no_answer) << r.error().message;
  EXPECT_TRUE(r.error().retryable());
  EXPECT_TRUE(r.error().in_doubt());
  EXPECT_EQ(server.requests().size(), 1u);
}

TEST(CurlTransport, ASilentServerTimesOutAsNoAnswer) {
  TinyServer server([](const std::string&) { return std::string("hang"); });
  CurlTransport transport;
  const auto started = std::chrono::steady_clock::now();
  const auto r = transport.perform({"POST", server.url(), {}, "x"}, milliseconds(300));
  EXPECT_LT(std::chrono::steady_clock::now() - started, seconds(3));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, TransportErrc::no_answer) << r.error().message;
}

TEST(CurlTransport, RequestsARetryCannotFixFail) {
  CurlTransport transport;
  for (const char* url : {"ftp://127.0.0.1/x", "not a url", "http://[::1/"}) {
    const auto r = transport.perform({"POST", url, {}, ""}, seconds(1));
    ASSERT_FALSE(r.has_value()) << url;
    EXPECT_EQ(r.error().code, TransportErrc::failed) << url << ": " << r.error().message;
    EXPECT_FALSE(r.error().retryable());
  }
}

TEST(CurlTransport, RefusesBodiesAboveTheLimit) {
  TinyServer server([](const std::string&) { return http_response(200, "OK", "", std::string(1000, 'x')); });
  CurlOptions options;
  options.max_response_bytes = 100;
  CurlTransport transport(options);
  const auto r = transport.perform({"POST", server.url(), {}, ""}, seconds(5));
  ASSERT_FALSE(r.has_value());
  EXPECT_EQ(r.error().code, TransportErrc::failed) << r.error().message;
}

TEST(CurlTransport, IsSafeToShareBetweenThreads) {
  TinyServer server([](const std::string& raw) {
    const auto body_at = raw.find("\r\n\r\n") + 4;
    return http_response(200, "OK", "", raw.substr(body_at));
  });
  CurlTransport transport;
  std::atomic<int> ok{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10; ++i) {
        const std::string body = std::to_string(t) + "-" + std::to_string(i);
        const auto r = transport.perform({"POST", server.url(), {}, body}, seconds(5));
        if (r && r->body == body) ++ok;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(ok.load(), 40);
}

TEST(CurlTransport, ClientRetriesOverRealHttpWithOneKey) {
  std::atomic<int> calls{0};
  TinyServer server([&](const std::string&) {
    if (++calls == 1) {
      return http_response(503, "Service Unavailable", "Retry-After: 0\r\nContent-Type: application/problem+json\r\n",
                           R"({"code":"idempotency_store_unavailable"})");
    }
    return http_response(201, "Created", "Idempotent-Replayed: true\r\n", "ok");
  });
  Client client;  // CurlTransport and the system clocks: Retry-After 0 keeps it fast
  const SendResult r = client.send({"POST", server.url("/v1/orders"), {{"Content-Type", "text/plain"}}, "order"});
  EXPECT_EQ(r.stop, StopReason::success);
  EXPECT_EQ(r.attempts, 2);
  EXPECT_TRUE(r.replayed);
  const auto seen = server.requests();
  ASSERT_EQ(seen.size(), 2u);
  const std::string header = "\r\nIdempotency-Key: " + r.key + "\r\n";
  EXPECT_NE(seen[0].find(header), std::string::npos) << seen[0];
  EXPECT_NE(seen[1].find(header), std::string::npos) << seen[1];
}

// A file under the test's temporary directory with `text` and `mode`; its path.
std::string temp_file(const std::string& name, const std::string& text, mode_t mode) {
  const std::string path = ::testing::TempDir() + "curl-transport-" + std::to_string(::getpid()) + "-" + name;
  FILE* f = std::fopen(path.c_str(), "w");
  EXPECT_NE(f, nullptr) << path;
  if (f == nullptr) return path;
  std::fputs(text.c_str(), f);
  std::fclose(f);
  ::chmod(path.c_str(), mode);
  return path;
}

TEST(CurlTransport, TlsFilesAreCheckedWhenTheTransportIsMade) {
  // No client certificate, no CA file: nothing to check.
  EXPECT_TRUE(CurlTransport::create({}));
  CurlOptions o;
  o.ca_file = "/nonexistent/ca.pem";
  auto made = CurlTransport::create(o);
  ASSERT_FALSE(made);
  EXPECT_NE(made.error().find("CA file: /nonexistent/ca.pem: cannot read it"), std::string::npos) << made.error();

  const std::string cert = temp_file("cert.pem", "not a certificate\n", 0644);
  o = {};
  o.cert_file = cert;
  made = CurlTransport::create(o);
  ASSERT_FALSE(made);
  EXPECT_NE(made.error().find("give both"), std::string::npos) << made.error();
  o = {};
  o.key_passphrase_file = cert;
  made = CurlTransport::create(o);
  ASSERT_FALSE(made);
  EXPECT_NE(made.error().find("without a client key file"), std::string::npos) << made.error();

  // A key file other users can read is refused before it is read, naming the file and the mode
  // (read_private_file, as the encryption key file); its content never shows.
  const std::string open_key = temp_file("open.key", "-----BEGIN PRIVATE KEY-----\nZq9-not-a-key\n", 0644);
  o = {};
  o.cert_file = cert;
  o.key_file = open_key;
  made = CurlTransport::create(o);
  ASSERT_FALSE(made);
  EXPECT_NE(made.error().find(open_key + ": the client key file's mode 0644"), std::string::npos) << made.error();
  EXPECT_EQ(made.error().find("Zq9"), std::string::npos) << made.error();
  // A private file that holds no key: refused at start, not at the first delivery.
  const std::string junk_key = temp_file("junk.key", "Zq9-not-a-key\n", 0600);
  o.key_file = junk_key;
  made = CurlTransport::create(o);
  ASSERT_FALSE(made);
  EXPECT_NE(made.error().find(junk_key + ": cannot open the client key file"), std::string::npos) << made.error();
  EXPECT_EQ(made.error().find("Zq9"), std::string::npos) << made.error();
  // The same through the constructor: an exception with the same message.
  EXPECT_THROW(CurlTransport transport(o), std::invalid_argument);
  // A passphrase file others can read: refused too.
  const std::string open_pass = temp_file("open.pass", "Zq9-passphrase\n", 0644);
  o.key_passphrase_file = open_pass;
  made = CurlTransport::create(o);
  ASSERT_FALSE(made);
  EXPECT_EQ(made.error().find("Zq9"), std::string::npos) << made.error();
  for (const auto& path : {cert, open_key, junk_key, open_pass}) ::unlink(path.c_str());
}

}  // namespace
}  // namespace idem::client
