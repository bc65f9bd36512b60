#include "amqp_test_support.hpp"

#include <amqp_framing.h>
#include <amqp_tcp_socket.h>
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "idem/testing/loopback_listener.hpp"

namespace idem::amqptest {
namespace {

using namespace std::chrono_literals;

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

const char* const kNoServer =
    "IDEM_TEST_AMQP_URL is not set, so there is no RabbitMQ to test against. scripts/test starts one; by hand: "
    "`bash scripts/lib/servers.sh start DIR rabbitmq && source DIR/env`.";

bool in_ci() {
  const char* ci = env("CI");
  return ci && std::string_view(ci) == "true";
}

// Checks for the server once per test program. Without one: under CI=true every test runs and
// fails on server_url(); otherwise all are skipped (ctest reports them skipped, not passed).
class AmqpEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    if (env("IDEM_TEST_AMQP_URL")) return;
    if (in_ci()) {
      std::fprintf(stderr, "\n*** FAILING every RabbitMQ test: %s (CI=true: they never skip in CI) ***\n\n", kNoServer);
      return;
    }
    std::printf("\n[  SKIPPED ] *** every RabbitMQ test: %s ***\n\n", kNoServer);
    std::fflush(stdout);
    GTEST_SKIP() << kNoServer;
  }
};

[[maybe_unused]] ::testing::Environment* const registered = ::testing::AddGlobalTestEnvironment(new AmqpEnvironment);

amqp_bytes_t bytes(const std::string& s) { return amqp_bytes_t{s.size(), const_cast<char*>(s.data())}; }
std::string text(amqp_bytes_t b) { return b.len ? std::string(static_cast<const char*>(b.bytes), b.len) : std::string(); }

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::string run_capture(const std::string& command, int* status = nullptr) {
  std::string out;
  FILE* p = ::popen(command.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed: " + command);
  char buf[4096];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int rc = ::pclose(p);
  if (status) *status = rc;
  return out;
}

std::string servers_command(const std::string& command, const std::string& args) {
  const char* script = env("IDEM_TEST_SERVERS_SH");
  const char* dir = env("IDEM_TEST_SERVERS_DIR");
  if (!script || !dir) throw std::runtime_error("IDEM_TEST_SERVERS_SH / IDEM_TEST_SERVERS_DIR are not set (servers.sh sets them)");
  return "bash " + shell_quote(script) + " " + command + " " + shell_quote(dir) + (args.empty() ? "" : " " + args);
}

}  // namespace

std::string server_url() {
  const char* url = env("IDEM_TEST_AMQP_URL");
  if (!url) throw std::runtime_error(std::string(kNoServer) + (in_ci() ? " (CI=true: RabbitMQ tests never skip in CI)" : ""));
  return url;
}

std::string server_password() {
  const char* p = env("IDEM_TEST_AMQP_PASSWORD");
  if (!p) throw std::runtime_error("IDEM_TEST_AMQP_PASSWORD is not set (servers.sh sets it)");
  return p;
}

std::string url_with(const std::string& query) { return server_url() + "?" + query; }

std::string unique_name(const std::string& what) {
  static std::atomic<int> counter{0};
  static const unsigned salt = std::random_device{}();
  char name[160];
  std::snprintf(name, sizeof name, "idem-test-%s-%d-%08x-%d", what.c_str(), static_cast<int>(::getpid()), salt, counter++);
  return name;
}

// ---- RawAmqp -----------------------------------------------------------------------------------

RawAmqp::RawAmqp(const std::string& url) {
  auto parsed = parse_amqp_url(url, AmqpUrlRole::sink);
  if (!parsed) throw std::runtime_error(parsed.error().message);
  conn_ = amqp_new_connection();
  amqp_socket_t* socket = amqp_tcp_socket_new(conn_);
  if (amqp_socket_open(socket, parsed->host.c_str(), parsed->port) != AMQP_STATUS_OK) {
    amqp_destroy_connection(conn_);
    throw std::runtime_error("RawAmqp: cannot connect");
  }
  const amqp_rpc_reply_t r = amqp_login(conn_, parsed->vhost.c_str(), 0, AMQP_DEFAULT_FRAME_SIZE, 0, AMQP_SASL_METHOD_PLAIN,
                                        parsed->user.c_str(), parsed->password.c_str());
  if (r.reply_type != AMQP_RESPONSE_NORMAL) {
    amqp_destroy_connection(conn_);
    throw std::runtime_error("RawAmqp: login failed");
  }
  amqp_channel_open(conn_, 1);
  check("channel.open");
}

RawAmqp::~RawAmqp() {
  amqp_connection_close(conn_, AMQP_REPLY_SUCCESS);
  amqp_destroy_connection(conn_);
}

void RawAmqp::reopen() {
  amqp_channel_open(conn_, 1);
  check("channel.open");
}

void RawAmqp::check(const char* what) {
  const amqp_rpc_reply_t r = amqp_get_rpc_reply(conn_);
  if (r.reply_type == AMQP_RESPONSE_NORMAL) return;
  std::string detail = "library error " + std::to_string(r.library_error);
  if (r.reply_type == AMQP_RESPONSE_SERVER_EXCEPTION && r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
    const auto* m = static_cast<amqp_channel_close_t*>(r.reply.decoded);
    detail = text(m->reply_text);
    amqp_channel_close_ok_t ok{};
    amqp_send_method(conn_, 1, AMQP_CHANNEL_CLOSE_OK_METHOD, &ok);
    reopen();
  }
  throw std::runtime_error(std::string("RawAmqp: ") + what + ": " + detail);
}

void RawAmqp::declare_queue(const std::string& name, bool quorum) {
  amqp_table_entry_t type{};
  type.key = amqp_cstring_bytes("x-queue-type");
  type.value.kind = AMQP_FIELD_KIND_UTF8;
  type.value.value.bytes = amqp_cstring_bytes("quorum");
  const amqp_table_t args = quorum ? amqp_table_t{1, &type} : amqp_empty_table;
  amqp_queue_declare(conn_, 1, bytes(name), 0, 1, 0, 0, args);
  check("queue.declare");
}

void RawAmqp::declare_exchange(const std::string& name, const std::string& type) {
  amqp_exchange_declare(conn_, 1, bytes(name), bytes(type), 0, 1, 0, 0, amqp_empty_table);
  check("exchange.declare");
}

void RawAmqp::bind(const std::string& queue, const std::string& exchange, const std::string& key) {
  amqp_queue_bind(conn_, 1, bytes(queue), bytes(exchange), bytes(key), amqp_empty_table);
  check("queue.bind");
}

void RawAmqp::delete_queue(const std::string& name) {
  amqp_queue_delete(conn_, 1, bytes(name), 0, 0);
  try {
    check("queue.delete");
  } catch (const std::exception&) {
  }
}

void RawAmqp::delete_exchange(const std::string& name) {
  amqp_exchange_delete(conn_, 1, bytes(name), 0);
  try {
    check("exchange.delete");
  } catch (const std::exception&) {
  }
}

std::uint32_t RawAmqp::ready(const std::string& queue) {
  auto* ok = amqp_queue_declare(conn_, 1, bytes(queue), 1, 0, 0, 0, amqp_empty_table);
  check("queue.declare passive");
  return ok->message_count;
}

std::optional<RawMessage> RawAmqp::get(const std::string& queue) {
  const amqp_rpc_reply_t r = amqp_basic_get(conn_, 1, bytes(queue), 1);
  if (r.reply_type != AMQP_RESPONSE_NORMAL) check("basic.get");
  if (r.reply.id == AMQP_BASIC_GET_EMPTY_METHOD) return std::nullopt;
  const auto* got = static_cast<amqp_basic_get_ok_t*>(r.reply.decoded);
  RawMessage out;
  out.redelivered = got->redelivered != 0;
  amqp_message_t message;
  const amqp_rpc_reply_t m = amqp_read_message(conn_, 1, &message, 0);
  if (m.reply_type != AMQP_RESPONSE_NORMAL) throw std::runtime_error("RawAmqp: reading a message failed");
  const auto& p = message.properties;
  if (p._flags & AMQP_BASIC_MESSAGE_ID_FLAG) out.message_id = text(p.message_id);
  if (p._flags & AMQP_BASIC_CONTENT_TYPE_FLAG) out.content_type = text(p.content_type);
  if (p._flags & AMQP_BASIC_DELIVERY_MODE_FLAG) out.delivery_mode = p.delivery_mode;
  if (p._flags & AMQP_BASIC_HEADERS_FLAG) {
    for (int i = 0; i < p.headers.num_entries; ++i) {
      const auto& e = p.headers.entries[i];
      switch (e.value.kind) {
        case AMQP_FIELD_KIND_UTF8:
        case AMQP_FIELD_KIND_BYTES: out.string_headers[text(e.key)] = text(e.value.value.bytes); break;
        case AMQP_FIELD_KIND_I64: out.integer_headers[text(e.key)] = e.value.value.i64; break;
        case AMQP_FIELD_KIND_I32: out.integer_headers[text(e.key)] = e.value.value.i32; break;
        default: break;
      }
    }
  }
  out.body = text(message.body);
  amqp_destroy_message(&message);
  amqp_maybe_release_buffers(conn_);
  return out;
}

void RawAmqp::publish_with_typed_headers(const std::string& queue, const std::string& body) {
  std::vector<amqp_table_entry_t> e(8);
  auto key = [&](int i, const char* k) { e[i].key = amqp_cstring_bytes(k); };
  key(0, "int");
  e[0].value.kind = AMQP_FIELD_KIND_I32;
  e[0].value.value.i32 = -42;
  key(1, "long");
  e[1].value.kind = AMQP_FIELD_KIND_I64;
  e[1].value.value.i64 = 1234567890123;
  key(2, "flag");
  e[2].value.kind = AMQP_FIELD_KIND_BOOLEAN;
  e[2].value.value.boolean = 1;
  key(3, "ratio");
  e[3].value.kind = AMQP_FIELD_KIND_F64;
  e[3].value.value.f64 = 0.5;
  key(4, "price");
  e[4].value.kind = AMQP_FIELD_KIND_DECIMAL;
  e[4].value.value.decimal = amqp_decimal_t{2, 12345};
  key(5, "when");
  e[5].value.kind = AMQP_FIELD_KIND_TIMESTAMP;
  e[5].value.value.u64 = 1700000000;
  amqp_field_value_t items[2]{};
  items[0].kind = AMQP_FIELD_KIND_UTF8;
  items[0].value.bytes = amqp_cstring_bytes("a");
  items[1].kind = AMQP_FIELD_KIND_I32;
  items[1].value.i32 = 7;
  key(6, "list");
  e[6].value.kind = AMQP_FIELD_KIND_ARRAY;
  e[6].value.value.array = amqp_array_t{2, items};
  key(7, "text");
  e[7].value.kind = AMQP_FIELD_KIND_UTF8;
  e[7].value.value.bytes = amqp_cstring_bytes("plain");
  amqp_basic_properties_t props{};
  props._flags = AMQP_BASIC_HEADERS_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG;
  props.delivery_mode = 2;
  props.message_id = amqp_cstring_bytes("typed-1");
  props.headers = amqp_table_t{static_cast<int>(e.size()), e.data()};
  if (amqp_basic_publish(conn_, 1, amqp_empty_bytes, bytes(queue), 0, 0, &props, bytes(body)) != AMQP_STATUS_OK) {
    throw std::runtime_error("RawAmqp: publish failed");
  }
  // A round trip, so the message is in the queue when this returns.
  ready(queue);
}

// ---- TestQueue ---------------------------------------------------------------------------------

TestQueue::TestQueue(const std::string& what)
    : queue(unique_name(what)), dead_letter_exchange(queue + ".dlx"), dead_letter_queue(queue + ".dlq") {}

TestQueue::~TestQueue() {
  try {
    RawAmqp raw;
    raw.delete_queue(queue);
    raw.delete_queue(dead_letter_queue);
    raw.delete_exchange(dead_letter_exchange);
    for (const auto& q : more_queues) raw.delete_queue(q);
    for (const auto& x : more_exchanges) raw.delete_exchange(x);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "warning: could not delete the test's queues: %s\n", e.what());
  }
}

std::string TestQueue::source_url(const std::string& extra) const {
  return url_with("queue=" + queue + "&dead_letter_exchange=" + dead_letter_exchange + "&dead_letter_queue=" + dead_letter_queue + extra);
}

std::string TestQueue::sink_url(const std::string& extra) const { return url_with("routing_key=" + queue + extra); }

std::unique_ptr<MessageSource> open_source(const std::string& url, SourceSettings settings) {
  auto source = open_amqp_source(url, settings);
  if (!source) throw std::runtime_error("open_amqp_source: " + source.error().message);
  return std::move(*source);
}

std::unique_ptr<MessageSink> open_sink(const std::string& url, SinkSettings settings) {
  auto sink = open_amqp_sink(url, settings);
  if (!sink) throw std::runtime_error("open_amqp_sink: " + sink.error().message);
  return std::move(*sink);
}

SourceSettings test_settings(std::size_t prefetch) {
  SourceSettings s;
  s.prefetch = prefetch;
  s.connect_timeout = 15s;
  s.reconnect_min = 50ms;
  s.reconnect_max = 1s;
  return s;
}

std::vector<Delivery> receive_n(MessageSource& source, std::size_t count, std::chrono::milliseconds limit) {
  std::vector<Delivery> out;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (out.size() < count && std::chrono::steady_clock::now() < deadline) {
    auto got = source.receive(count - out.size(), 200ms);
    if (!got) continue;  // reconnecting: the caller checks what arrived
    for (auto& d : *got) out.push_back(std::move(d));
  }
  return out;
}

int servers(const std::string& command, const std::string& args) {
  const int rc = std::system(servers_command(command, args).c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

int close_connections_named(const std::string& name_part) {
  int status = 0;
  const std::string listing =
      run_capture(servers_command("rabbitmqctl", "list_connections --quiet --no-table-headers pid client_properties"), &status);
  if (status != 0) throw std::runtime_error("rabbitmqctl list_connections failed: " + listing);
  int closed = 0;
  std::istringstream lines(listing);
  std::string line;
  while (std::getline(lines, line)) {
    const auto tab = line.find('\t');
    if (tab == std::string::npos || line.find(name_part, tab) == std::string::npos) continue;
    const std::string pid = line.substr(0, tab);
    if (servers("rabbitmqctl", "close_connection " + shell_quote(pid) + " 'closed by an idem test' >/dev/null") == 0) ++closed;
  }
  return closed;
}

// ---- Proxy -------------------------------------------------------------------------------------

Proxy::Proxy() {
  auto parsed = parse_amqp_url(server_url(), AmqpUrlRole::sink);
  if (!parsed) throw std::runtime_error(parsed.error().message);
  target_port_ = parsed->port;
  const auto listener = testing::listen_on_loopback("amqp test proxy");
  listen_fd_ = listener.fd;
  port_ = listener.port;
  thread_ = std::thread([this] { loop(); });
}

Proxy::~Proxy() {
  stop_ = true;
  thread_.join();
  ::close(listen_fd_);
}

std::string Proxy::via(const std::string& url) const {
  // amqp://user:pass@127.0.0.1:PORT/...: the port after the last '@'.
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
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the loop's poll notices
}

void Proxy::thaw() { frozen_ = false; }

void Proxy::loop() {
  struct Pair {
    int client, server;
  };
  std::vector<Pair> pairs;
  char buf[65536];
  while (!stop_) {
    if (cut_) {
      for (auto& p : pairs) {
        ::close(p.client);
        ::close(p.server);
      }
      pairs.clear();
      cut_ = false;
    }
    if (frozen_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
    for (const auto& p : pairs) {
      fds.push_back({p.client, POLLIN, 0});
      fds.push_back({p.server, POLLIN, 0});
    }
    if (::poll(fds.data(), fds.size(), 10) <= 0) continue;
    std::vector<bool> closed(pairs.size(), false);
    for (std::size_t i = 0; i < pairs.size(); ++i) {
      for (int side = 0; side < 2 && !closed[i]; ++side) {
        if (!(fds[1 + 2 * i + static_cast<std::size_t>(side)].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        const int from = side == 0 ? pairs[i].client : pairs[i].server;
        const int to = side == 0 ? pairs[i].server : pairs[i].client;
        const ssize_t n = ::read(from, buf, sizeof buf);
        bool ok = n > 0;
        for (ssize_t off = 0; ok && off < n;) {
          const ssize_t w = ::send(to, buf + off, static_cast<std::size_t>(n - off), MSG_NOSIGNAL);
          ok = w > 0;
          off += std::max<ssize_t>(w, 0);
        }
        if (!ok) closed[i] = true;
      }
    }
    for (std::size_t i = pairs.size(); i-- > 0;) {
      if (!closed[i]) continue;
      ::close(pairs[i].client);
      ::close(pairs[i].server);
      pairs.erase(pairs.begin() + static_cast<std::ptrdiff_t>(i));
    }
    if (fds[0].revents & POLLIN) {
      const int client = ::accept(listen_fd_, nullptr, nullptr);
      if (client < 0) continue;
      const int server = ::socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<std::uint16_t>(target_port_));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(server, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
        pairs.push_back({client, server});
      } else {
        ::close(client);
        ::close(server);
      }
    }
  }
  for (auto& p : pairs) {
    ::close(p.client);
    ::close(p.server);
  }
}

// ---- the conformance suite's broker ------------------------------------------------------------

namespace {

class AmqpQueueUnderTest final : public testing::BrokerUnderTest {
 public:
  AmqpQueueUnderTest() : names_("conformance") {
    RawAmqp raw;
    raw.declare_queue(names_.queue);
  }

  std::unique_ptr<MessageSink> sink() override { return open_sink(names_.sink_url()); }

  std::unique_ptr<MessageSource> source(const SourceSettings& settings) override {
    SourceSettings s = settings;
    s.connect_timeout = std::max<Millis>(s.connect_timeout, 15s);
    return open_source(names_.source_url(), s);
  }

  std::vector<testing::DeadLetter> take_dead_letters() override {
    std::vector<testing::DeadLetter> out;
    RawAmqp raw;
    while (auto m = raw.get(names_.dead_letter_queue)) {
      testing::DeadLetter d;
      d.message_id = m->message_id.value_or(m->string_headers["x-idem-message-id"]);
      d.body = m->body;
      d.reason = m->string_headers["x-idem-reason"];
      d.last_error = m->string_headers["x-idem-last-error"];
      out.push_back(std::move(d));
    }
    return out;
  }

  std::size_t outstanding() override {
    RawAmqp raw;
    return raw.ready(names_.queue);
  }

  void restart_broker() override {
    if (servers("stop-rabbitmq") != 0) throw std::runtime_error("servers.sh stop-rabbitmq failed");
    if (servers("start-rabbitmq") != 0) throw std::runtime_error("servers.sh start-rabbitmq failed");
  }

 private:
  TestQueue names_;
};

}  // namespace

testing::BrokerFactory conformance_factory() {
  return testing::BrokerFactory{"amqp", [] { return std::make_unique<AmqpQueueUnderTest>(); }};
}

}  // namespace idem::amqptest
