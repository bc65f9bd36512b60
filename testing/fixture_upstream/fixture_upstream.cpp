// idem-fixture-upstream: the HTTP service the gateway end-to-end tests put behind idem-gateway.
//
// It counts how often each (method, path, Idempotency-Key) was executed, so a test can prove
// "exactly one execution", and stamps every response with a unique X-Execution-Id, so a test
// can tell a replay (same id) from a re-execution (new id). One thread, one io_context: the
// counts need no lock and the order of events is the order of arrival.
//
//   idem-fixture-upstream --listen 127.0.0.1:0 [--port-file PATH]
//
// Execution routes (any method, counted). The first path segment picks the behaviour and the
// rest is free, so a gateway config can give /echo/ct and /echo/optional different policies:
//   /echo[/...]                200, JSON with method, target, key, body and every request header
//   /slow[/...]?ms=N           waits N ms (asynchronously), then 200
//   /status/{code}[/...]       answers that status
//   /sequence[/...]?codes=500,201  the n-th execution for a key answers the n-th code (last repeats)
//   /large[/...]?bytes=N       200 with an N-byte body
//   /close-mid-response[/...]  headers with Content-Length: 1000, 100 bytes of body, then close
//   /malformed-response[/...]  a response framed two ways (Content-Length and chunked), then close
//   /hang[/...]                never answers (until the client closes)
//   /hang-first[/...]          never answers on a key's first execution, 200 afterwards
//   any of them with ?hop=1    also sends hop-by-hop response headers: Keep-Alive, Proxy-Fixture,
//                              Proxy-Authenticate, and X-Fixture-Private named by Connection
// Control routes (not counted):
//   GET /counts                {"total":N,"keys":{"K":n},"requests":[{method,path,key,count}]}
//   GET /executions?key=K      {"key":"K","count":n}
//   GET /history               every execution in order, one JSON object a line (JSONL):
//                              {"key","execution_id","attempt"} (attempt: the request's
//                              Idempotency-Attempt header as sent, "" when none), for the history
//                              checker (tests/common/history.py)
//   GET /lookup/{mode}/{key}[?ms=N]   a lookup of on_lease_expiry = "ask" (docs/gateway.md), after
//                              N ms: mode "ok" answers the key's first execution (200,
//                              Idempotency-Original-Status: 201, {"execution_id":...}) or 404 with
//                              Idempotency-Lookup: not_found if it never executed; "never" always
//                              that 404; faults: "nomarker" (a 404 without the marker), "error"
//                              (500), "hang", "malformed" (200 without the key header),
//                              "otherkey" (200 naming another key)
//   GET /lookups?key=K         {"key","count","max_in_flight","attempt","tenant"}: lookups of K
//                              so far, most ever in flight at once, the last one's headers
//   POST /reset                forgets every count
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <unistd.h>
#include <vector>

#include "idem/testing/listener.hpp"

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Request = http::request<http::string_body>;
using Response = http::response<http::string_body>;

namespace {

/// Everything the fixture remembers; reset by POST /reset.
struct State {
  long total = 0;
  std::map<std::tuple<std::string, std::string, std::string>, long> by_request;
  std::map<std::string, long> by_key;
  long next_execution = 0;
  std::string instance;  // distinguishes ids of two fixture processes
  std::string history;   // GET /history: one line per execution
  std::map<std::string, std::string> first_execution;  // key -> its first execution's id
  struct Lookups {
    long count = 0;
    long in_flight = 0;
    long max_in_flight = 0;
    std::string attempt;  // the last lookup's Idempotency-Attempt
    std::string tenant;   // and Idempotency-Tenant
  };
  std::map<std::string, Lookups> lookups;
};

State g_state;

std::string json_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      default:
        if (c < 0x20 || c >= 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  return out;
}

std::string jstr(std::string_view s) { return "\"" + json_escape(s) + "\""; }

/// Beast 1.74 speaks boost::string_view; the rest of this file speaks std::string_view.
std::string_view sv(beast::string_view s) { return {s.data(), s.size()}; }

/// The key as the upstream sees it, unquoted if the client used the Structured Field form.
std::string key_of(const Request& req) {
  auto it = req.find("Idempotency-Key");
  if (it == req.end()) return "";
  std::string v(sv(it->value()));
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"') {
    std::string out;
    for (std::size_t i = 1; i + 1 < v.size(); ++i) {
      if (v[i] == '\\' && i + 2 < v.size()) ++i;
      out += v[i];
    }
    return out;
  }
  return v;
}

/// "/echo" for "/echo/ct": the segment that picks an execution route's behaviour.
std::string first_segment(std::string_view path) {
  const auto slash = path.find('/', 1);
  return std::string(path.substr(0, slash));
}

std::string_view path_of(std::string_view target) {
  return target.substr(0, target.find('?'));
}

/// The value of one query parameter (no percent-decoding: tests send plain values).
std::string query_param(std::string_view target, std::string_view name) {
  auto q = target.find('?');
  if (q == std::string_view::npos) return "";
  std::string_view rest = target.substr(q + 1);
  while (!rest.empty()) {
    auto amp = rest.find('&');
    std::string_view pair = rest.substr(0, amp);
    auto eq = pair.find('=');
    if (pair.substr(0, eq) == name) return eq == std::string_view::npos ? "" : std::string(pair.substr(eq + 1));
    if (amp == std::string_view::npos) break;
    rest = rest.substr(amp + 1);
  }
  return "";
}

long to_long(std::string_view s, long fallback) {
  if (s.empty()) return fallback;
  char* end = nullptr;
  std::string tmp(s);
  long v = std::strtol(tmp.c_str(), &end, 10);
  return (end && *end == '\0') ? v : fallback;
}

/// Counts one execution and returns its number for this key (1 for the first).
long count_execution(const Request& req) {
  std::string key = key_of(req);
  ++g_state.total;
  ++g_state.by_request[{std::string(sv(req.method_string())), std::string(path_of(sv(req.target()))), key}];
  return ++g_state.by_key[key];
}

std::string new_execution_id() {
  return g_state.instance + "-" + std::to_string(++g_state.next_execution);
}

Response make_response(const Request& req, http::status status, std::string body,
                       std::string_view content_type, const std::string& execution_id) {
  Response res{status, req.version()};
  res.set(http::field::server, "idem-fixture-upstream");
  res.set(http::field::content_type, std::string(content_type));
  res.set("X-Execution-Id", execution_id);
  res.set("X-Fixture-Route", std::string(path_of(sv(req.target()))));
  res.keep_alive(req.keep_alive());
  if (query_param(sv(req.target()), "hop") == "1") {
    res.set(http::field::keep_alive, "timeout=30");
    res.set("Proxy-Fixture", "hop-by-hop");
    res.set(http::field::proxy_authenticate, "Basic realm=\"fixture\"");
    res.set(http::field::connection, req.keep_alive() ? "X-Fixture-Private" : "close, X-Fixture-Private");
    res.set("X-Fixture-Private", "connection-scoped");
  }
  res.body() = std::move(body);
  res.prepare_payload();
  if (req.method() == http::verb::head) res.body().clear();  // keeps the Content-Length it would have
  return res;
}

std::string echo_json(const Request& req, const std::string& execution_id, long nth) {
  std::string headers;
  for (const auto& f : req) {
    if (!headers.empty()) headers += ",";
    headers += "[" + jstr(sv(f.name_string())) + "," + jstr(sv(f.value())) + "]";
  }
  return "{\"execution_id\":" + jstr(execution_id) + ",\"execution\":" + std::to_string(nth) +
         ",\"method\":" + jstr(sv(req.method_string())) + ",\"target\":" + jstr(sv(req.target())) +
         ",\"key\":" + jstr(key_of(req)) + ",\"body\":" + jstr(req.body()) +
         ",\"headers\":[" + headers + "]}";
}

std::string counts_json() {
  std::string keys, requests;
  for (const auto& [k, n] : g_state.by_key) {
    if (!keys.empty()) keys += ",";
    keys += jstr(k) + ":" + std::to_string(n);
  }
  for (const auto& [id, n] : g_state.by_request) {
    if (!requests.empty()) requests += ",";
    requests += "{\"method\":" + jstr(std::get<0>(id)) + ",\"path\":" + jstr(std::get<1>(id)) +
                ",\"key\":" + jstr(std::get<2>(id)) + ",\"count\":" + std::to_string(n) + "}";
  }
  return "{\"total\":" + std::to_string(g_state.total) + ",\"keys\":{" + keys + "},\"requests\":[" +
         requests + "]}";
}

/// Waits until the peer closes (or the fixture stops): a request that never gets an answer.
net::awaitable<void> hang(beast::tcp_stream& stream) {
  beast::error_code ec;
  char buf[512];
  stream.expires_never();
  for (;;) {
    co_await stream.socket().async_read_some(net::buffer(buf), net::redirect_error(net::use_awaitable, ec));
    if (ec) co_return;
  }
}

/// Sends a Content-Length promising more than is sent, then closes: an outcome in doubt.
net::awaitable<void> close_mid_response(beast::tcp_stream& stream, const std::string& execution_id) {
  std::string raw =
      "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 1000\r\nX-Execution-Id: " +
      execution_id + "\r\n\r\n" + std::string(100, 'x');
  beast::error_code ec;
  co_await net::async_write(stream.socket(), net::buffer(raw), net::redirect_error(net::use_awaitable, ec));
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream.socket().close(ec);
}

/// Sends a response no proxy may pass on: both Content-Length and Transfer-Encoding, the
/// ambiguity response smuggling needs (RFC 9112 §6.3). Then closes.
net::awaitable<void> malformed_response(beast::tcp_stream& stream, const std::string& execution_id) {
  std::string raw = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n"
                    "X-Execution-Id: " + execution_id + "\r\n\r\n5\r\nhello\r\n0\r\n\r\n";
  beast::error_code ec;
  co_await net::async_write(stream.socket(), net::buffer(raw), net::redirect_error(net::use_awaitable, ec));
  stream.socket().shutdown(tcp::socket::shutdown_both, ec);
  stream.socket().close(ec);
}

/// GET /lookup/{mode}/{key}: see the header. nullopt: hang (mode "hang").
net::awaitable<std::optional<Response>> lookup(const Request& req, const std::string& path, const std::string& target) {
  const std::string_view rest = std::string_view(path).substr(std::string_view("/lookup/").size());
  const auto slash = rest.find('/');
  const std::string mode(rest.substr(0, slash));
  const std::string key(slash == std::string_view::npos ? std::string_view() : rest.substr(slash + 1));
  State::Lookups& counts = g_state.lookups[key];
  ++counts.count;
  const auto attempt = req.find("Idempotency-Attempt");
  counts.attempt = attempt == req.end() ? std::string() : std::string(sv(attempt->value()));
  const auto tenant = req.find("Idempotency-Tenant");
  counts.tenant = tenant == req.end() ? std::string() : std::string(sv(tenant->value()));
  counts.max_in_flight = std::max(counts.max_in_flight, ++counts.in_flight);
  if (const long ms = to_long(query_param(target, "ms"), 0); ms > 0) {
    net::steady_timer timer(co_await net::this_coro::executor);
    timer.expires_after(std::chrono::milliseconds(ms));
    beast::error_code ec;
    co_await timer.async_wait(net::redirect_error(net::use_awaitable, ec));
  }
  --g_state.lookups[key].in_flight;
  if (mode == "hang") co_return std::nullopt;
  const auto first = g_state.first_execution.find(key);
  auto answer = [&](http::status status, std::string body, std::string_view named_key) {
    Response res = make_response(req, status, std::move(body), "application/json", new_execution_id());
    if (!named_key.empty()) res.set("Idempotency-Key", std::string(named_key));
    return res;
  };
  if (mode == "ok" && first != g_state.first_execution.end()) {
    Response res = answer(http::status::ok, "{\"execution_id\":" + jstr(first->second) + ",\"looked_up\":true}", key);
    res.set("Idempotency-Original-Status", "201");
    res.set("X-Execution-Id", first->second);
    co_return res;
  }
  if (mode == "ok" || mode == "never") {
    Response res = answer(http::status::not_found, "{\"error\":\"no such operation\"}", key);
    res.set("Idempotency-Lookup", "not_found");
    co_return res;
  }
  if (mode == "nomarker") co_return answer(http::status::not_found, "{\"error\":\"no such route\"}", key);
  if (mode == "error") co_return answer(http::status::internal_server_error, "{\"error\":\"boom\"}", key);
  if (mode == "malformed") co_return answer(http::status::ok, "{\"looked_up\":true}", "");
  if (mode == "otherkey") co_return answer(http::status::ok, "{\"looked_up\":true}", key + "-other");
  co_return answer(http::status::bad_request, "{\"error\":\"unknown lookup mode\"}", "");
}

/// One connection: read a request, answer it, repeat while keep-alive.
net::awaitable<void> session(tcp::socket socket) {
  beast::tcp_stream stream(std::move(socket));
  beast::flat_buffer buffer;
  beast::error_code ec;
  for (;;) {
    http::request_parser<http::string_body> parser;
    parser.header_limit(256 * 1024);
    parser.body_limit(256ull * 1024 * 1024);
    stream.expires_after(std::chrono::seconds(300));
    co_await http::async_read(stream, buffer, parser, net::redirect_error(net::use_awaitable, ec));
    if (ec) break;
    Request req = parser.release();
    const std::string path(path_of(sv(req.target())));
    const std::string target(sv(req.target()));
    const std::string route = first_segment(path);
    std::optional<Response> res;

    if (path == "/counts") {
      res = make_response(req, http::status::ok, counts_json(), "application/json", new_execution_id());
    } else if (path == "/executions") {
      const std::string key = query_param(target, "key");
      auto it = g_state.by_key.find(key);
      const long n = it == g_state.by_key.end() ? 0 : it->second;
      res = make_response(req, http::status::ok, "{\"key\":" + jstr(key) + ",\"count\":" + std::to_string(n) + "}",
                          "application/json", new_execution_id());
    } else if (path == "/history") {
      res = make_response(req, http::status::ok, g_state.history, "application/x-ndjson", new_execution_id());
    } else if (path == "/lookups") {
      const std::string key = query_param(target, "key");
      const State::Lookups l = g_state.lookups[key];
      res = make_response(req, http::status::ok,
                          "{\"key\":" + jstr(key) + ",\"count\":" + std::to_string(l.count) +
                              ",\"max_in_flight\":" + std::to_string(l.max_in_flight) + ",\"attempt\":" +
                              jstr(l.attempt) + ",\"tenant\":" + jstr(l.tenant) + "}",
                          "application/json", new_execution_id());
    } else if (route == "/lookup") {
      res = co_await lookup(req, path, target);
      if (!res) {
        co_await hang(stream);
        co_return;
      }
    } else if (path == "/reset") {
      g_state.first_execution.clear();
      g_state.lookups.clear();
      g_state.total = 0;
      g_state.by_request.clear();
      g_state.by_key.clear();
      g_state.history.clear();
      res = make_response(req, http::status::ok, "{\"reset\":true}", "application/json", new_execution_id());
    } else {
      const long nth = count_execution(req);
      const std::string id = new_execution_id();
      g_state.first_execution.try_emplace(key_of(req), id);
      const auto attempt = req.find("Idempotency-Attempt");
      g_state.history += "{\"key\":" + jstr(key_of(req)) + ",\"execution_id\":" + jstr(id) + ",\"attempt\":" +
                         jstr(attempt == req.end() ? std::string() : std::string(sv(attempt->value()))) + "}\n";
      if (route == "/echo") {
        res = make_response(req, http::status::ok, echo_json(req, id, nth), "application/json", id);
      } else if (route == "/slow") {
        const long ms = to_long(query_param(target, "ms"), 1000);
        net::steady_timer timer(co_await net::this_coro::executor);
        timer.expires_after(std::chrono::milliseconds(ms));
        co_await timer.async_wait(net::redirect_error(net::use_awaitable, ec));
        res = make_response(req, http::status::ok,
                            "{\"execution_id\":" + jstr(id) + ",\"slept_ms\":" + std::to_string(ms) + "}",
                            "application/json", id);
      } else if (route == "/status") {
        const long code = to_long(first_segment(std::string_view(path).substr(7)).substr(1), 500);
        std::string body = "{\"execution_id\":" + jstr(id) + ",\"status\":" + std::to_string(code) + "}";
        if (code == 204 || code == 304) body.clear();
        res = make_response(req, static_cast<http::status>(code), std::move(body), "application/json", id);
      } else if (route == "/sequence") {
        std::vector<long> codes;
        std::string list = query_param(target, "codes");
        for (std::size_t pos = 0; pos <= list.size();) {
          auto comma = list.find(',', pos);
          if (comma == std::string::npos) comma = list.size();
          codes.push_back(to_long(std::string_view(list).substr(pos, comma - pos), 200));
          pos = comma + 1;
        }
        const long code = codes[std::min<std::size_t>(nth - 1, codes.size() - 1)];
        res = make_response(req, static_cast<http::status>(code),
                            "{\"execution_id\":" + jstr(id) + ",\"status\":" + std::to_string(code) +
                                ",\"execution\":" + std::to_string(nth) + "}",
                            "application/json", id);
      } else if (route == "/large") {
        const long n = std::max(0L, to_long(query_param(target, "bytes"), 1024));
        std::string body(static_cast<std::size_t>(n), '\0');
        for (long i = 0; i < n; ++i) body[i] = static_cast<char>('a' + i % 26);
        res = make_response(req, http::status::ok, std::move(body), "application/octet-stream", id);
      } else if (route == "/close-mid-response") {
        co_await close_mid_response(stream, id);
        co_return;
      } else if (route == "/malformed-response") {
        co_await malformed_response(stream, id);
        co_return;
      } else if (route == "/hang" || (route == "/hang-first" && nth == 1)) {
        co_await hang(stream);
        co_return;
      } else if (route == "/hang-first") {
        res = make_response(req, http::status::ok,
                            "{\"execution_id\":" + jstr(id) + ",\"execution\":" + std::to_string(nth) + "}",
                            "application/json", id);
      } else {
        res = make_response(req, http::status::not_found, "{\"error\":\"no such route\"}", "application/json", id);
      }
    }

    const bool keep_alive = res->keep_alive();
    stream.expires_after(std::chrono::seconds(60));
    co_await http::async_write(stream, *res, net::redirect_error(net::use_awaitable, ec));
    if (ec || !keep_alive) break;
  }
  stream.socket().shutdown(tcp::socket::shutdown_send, ec);
}

net::awaitable<void> listen(tcp::acceptor& acceptor) {
  for (;;) {
    beast::error_code ec;
    tcp::socket socket = co_await acceptor.async_accept(net::redirect_error(net::use_awaitable, ec));
    if (ec) {
      if (ec == net::error::operation_aborted) co_return;
      net::steady_timer pause(acceptor.get_executor(), std::chrono::milliseconds(50));  // EMFILE: no spin
      co_await pause.async_wait(net::redirect_error(net::use_awaitable, ec));
      continue;
    }
    net::co_spawn(acceptor.get_executor(), session(std::move(socket)), net::detached);
  }
}

int usage(const char* why) {
  std::cerr << "idem-fixture-upstream: " << why
            << "\nusage: idem-fixture-upstream --listen HOST:PORT [--port-file PATH]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string listen_at = "127.0.0.1:0";
  std::string port_file;
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    if ((a == "--listen" || a == "--port-file") && i + 1 < argc) {
      (a == "--listen" ? listen_at : port_file) = argv[++i];
    } else {
      return usage(("unknown argument: " + std::string(a)).c_str());
    }
  }
  const auto colon = listen_at.rfind(':');
  if (colon == std::string::npos) return usage("--listen wants HOST:PORT");

  try {
    net::io_context ioc{1};
    tcp::endpoint endpoint{net::ip::make_address(listen_at.substr(0, colon)),
                           static_cast<unsigned short>(std::stoi(listen_at.substr(colon + 1)))};
    tcp::acceptor acceptor{ioc};
    const unsigned short port = idem::testing::listen_on(acceptor, endpoint);
    g_state.instance = std::to_string(::getpid()) + "." + std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000);

    if (!port_file.empty()) idem::testing::write_file_atomically(port_file, std::to_string(port));
    std::cout << "idem-fixture-upstream listening on " << endpoint.address().to_string() << ":" << port
              << std::endl;

    net::signal_set signals(ioc, SIGINT, SIGTERM);
    signals.async_wait([&](const beast::error_code&, int) { ioc.stop(); });
    net::co_spawn(ioc, listen(acceptor), net::detached);
    ioc.run();
  } catch (const std::exception& e) {
    std::cerr << "idem-fixture-upstream: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
