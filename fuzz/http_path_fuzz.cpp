// The HTTP layer's whole request path over an in-memory stream: the client's bytes (one or more
// pipelined requests) are read by Beast with the gateway's limits, checked like the gateway's
// heads, decided by the Engine on a memory store through idem::http's awaitables, executed by an
// in-process upstream, finished, and answered (replay, problem+json or the upstream's response).
//
// The upstream does what each request's X-Fuzz-Status says (a status, or "timeout": sent, no
// answer, the record left in progress), and X-Fuzz-Advance: N moves the clock N seconds first;
// neither header is part of the fingerprint. Routes under /u/ use on_lease_expiry = "unknown".
//
// Properties: a key whose response was stored is never executed again while its record lives,
// and every replay is that stored response, byte for byte; what the session writes back is a
// sequence of well-formed HTTP responses, one per request it read.
// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/beast/_experimental/test/stream.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/write.hpp>

#include <charconv>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "check.hpp"
#include "idem/engine.hpp"
#include "idem/http/async.hpp"
#include "idem/http/beast.hpp"
#include "idem/http/message.hpp"
#include "idem/key.hpp"
#include "idem/memory_store.hpp"
#include "idem/problem.hpp"
#include "idem/tenant.hpp"
#include "idem/testing/manual_clock.hpp"

namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = beast::http;
using idem::http::Request;
using idem::http::Response;

constexpr std::size_t kMaxHeader = 16 * 1024;
constexpr std::size_t kMaxBody = 64 * 1024;

struct Stored {
  idem::StoredResponse response;
  idem::TimePoint expires;
};

// What the harness knows about each (tenant, key), to check the engine against.
struct World {
  idem::MemoryStore store;
  idem::testing::ManualClock clock;
  idem::Engine engine{store, clock};
  idem::Policy reexecute, unknown;
  idem::TenantRule tenant_rule{idem::TenantRule::Source::header, "X-Tenant-Id"};
  std::map<std::pair<std::string, std::string>, Stored> stored;
  int requests = 0;  // requests read whole and answered

  World() {
    reexecute.lease = std::chrono::seconds(10);
    reexecute.retention = std::chrono::seconds(30);
    unknown = reexecute;
    unknown.on_lease_expiry = idem::LeaseExpiry::unknown;
  }
};

std::string_view header(const Request& req, std::string_view name) {
  auto it = req.find(name);
  return it == req.end() ? std::string_view() : it->value();
}

// The in-process upstream: answers what X-Fuzz-Status asks, echoing the request's body.
std::optional<Response> upstream(const Request& req, int executions) {
  const std::string_view want = header(req, "X-Fuzz-Status");
  if (want == "timeout") return std::nullopt;
  unsigned status = 200;
  std::from_chars(want.data(), want.data() + want.size(), status);
  if (status < 200 || status > 599) status = 200;
  const bool bodiless = status == 204 || status == 304;
  Response res{static_cast<bhttp::status>(status), 11};
  res.set(bhttp::field::content_type, "application/json");
  res.set("X-Execution", std::to_string(executions));
  res.insert("Set-Cookie", "a=1");
  res.insert("Set-Cookie", "b=2");
  res.set(bhttp::field::connection, "X-Hop");  // names a hop-by-hop header of its own
  res.set("X-Hop", "dropped");
  if (!bodiless) {
    res.body() = "{\"executed\":" + std::to_string(executions) + ",\"length\":" + std::to_string(req.body().size()) + "}";
  }
  res.prepare_payload();
  return res;
}

asio::awaitable<void> write(beast::test::stream& stream, Response& res) {
  beast::error_code ec;
  res.prepare_payload();
  co_await bhttp::async_write(stream, res, asio::redirect_error(asio::use_awaitable, ec));
}

bool same_response(const idem::StoredResponse& stored, const Response& replayed) {
  if (replayed.result_int() != static_cast<unsigned>(stored.status) || replayed.body() != stored.body) return false;
  std::size_t i = 0;
  for (const auto& f : replayed) {
    if (idem::iequals(f.name_string(), "Content-Length") || idem::iequals(f.name_string(), "Idempotent-Replayed")) {
      continue;
    }
    if (idem::iequals(f.name_string(), "Connection")) continue;  // the connection's own, not stored
    if (i >= stored.headers.size() || stored.headers[i].name != f.name_string() || stored.headers[i].value != f.value()) {
      return false;
    }
    ++i;
  }
  return i == stored.headers.size();
}

asio::awaitable<void> session(World& w, beast::test::stream& stream) {
  beast::flat_buffer buffer;
  idem::http::BeastRequestView view;
  int executions = 0;
  for (;;) {
    bhttp::request_parser<bhttp::string_body> parser;
    parser.header_limit(kMaxHeader);
    parser.body_limit(kMaxBody);
    beast::error_code ec;
    co_await bhttp::async_read(stream, buffer, parser, asio::redirect_error(asio::use_awaitable, ec));
    if (ec) break;  // the gateway answers 400/413/431 and closes; nothing reaches the engine
    Request& req = parser.get();
    const bool keep_alive = req.keep_alive();
    const unsigned version = req.version();
    ++w.requests;

    std::vector<std::string_view> te, hosts;
    for (auto [it, end] = req.equal_range(bhttp::field::transfer_encoding); it != end; ++it) te.push_back(it->value());
    for (auto [it, end] = req.equal_range(bhttp::field::host); it != end; ++it) hosts.push_back(it->value());
    if (auto defect = idem::http::check_request_head({version, req.method_string(), te, hosts})) {
      Response res = idem::http::problem_response(
          idem::make_problem(static_cast<int>(defect->status), std::string(defect->code), "bad head", defect->detail),
          version, false);
      co_await write(stream, res);
      break;
    }
    if (auto advance = header(req, "X-Fuzz-Advance"); !advance.empty()) {
      unsigned seconds = 0;
      std::from_chars(advance.data(), advance.data() + advance.size(), seconds);
      w.clock.advance(std::chrono::seconds(std::min(seconds, 100u)));
    }

    const auto target = idem::http::split_target(req.target());
    const idem::Policy& policy = target.path.starts_with("/u/") ? w.unknown : w.reexecute;
    const idem::RequestView& rv = view.assign(req);
    auto tenant = idem::derive_tenant(w.tenant_rule, rv.headers);
    if (!tenant) {
      Response res = idem::http::problem_response(idem::make_problem(400, "tenant_ambiguous", "t", tenant.error()),
                                                  version, keep_alive);
      co_await write(stream, res);
      if (!keep_alive) break;
      continue;
    }
    const idem::Decision d = co_await idem::http::async_begin(w.engine, policy, rv, *tenant, asio::use_awaitable);
    Response res;
    switch (d.verdict) {
      case idem::Verdict::pass_through: {
        auto up = upstream(req, ++executions);
        res = up ? std::move(*up) : idem::http::problem_response(idem::make_problem(504, "upstream_timeout", "t", "d"),
                                                                 version, keep_alive);
        break;
      }
      case idem::Verdict::execute: {
        const auto id = std::make_pair(d.ticket->fence.id.tenant, d.ticket->fence.id.key);
        if (auto it = w.stored.find(id); it != w.stored.end()) {
          FUZZ_CHECK(it->second.expires <= w.clock.now(), "a key whose response is stored never executes again while it lives");
        }
        auto up = upstream(req, ++executions);
        if (!up) {  // sent, no answer: the record stays in progress until its lease expires
          res = idem::http::problem_response(idem::make_problem(504, "upstream_timeout", "t", "d"), version, keep_alive);
          break;
        }
        res = std::move(*up);
        idem::StoredResponse record = idem::http::to_stored_response(res.base(), res.result_int(), res.body());
        const idem::StoredResponse copy = record;
        auto finished = co_await idem::http::async_finish(w.engine, *d.ticket, std::move(record), asio::use_awaitable);
        FUZZ_CHECK(finished.has_value(), "the memory store never fails");
        FUZZ_CHECK(*finished != idem::FinishStatus::fenced_out, "nobody took over a key within its lease");
        if (*finished == idem::FinishStatus::stored) {
          w.stored[id] = Stored{copy, w.clock.now() + policy.retention};
        } else {
          w.stored.erase(id);
        }
        idem::http::strip_hop_by_hop(res.base());
        break;
      }
      case idem::Verdict::replay: {
        res = idem::http::replay_response(*d.replay, version, keep_alive);
        // The key as the engine read it: the replay must be what was stored under it.
        std::vector<std::string_view> values;
        for (const auto& h : rv.headers) {
          if (idem::iequals(h.name, policy.key_header)) values.push_back(h.value);
        }
        auto key = idem::parse_key(values, policy.key);
        FUZZ_CHECK(key.has_value(), "a replay comes from a valid key");
        auto it = w.stored.find(std::make_pair(*tenant, *key));
        FUZZ_CHECK(it != w.stored.end() && it->second.expires > w.clock.now(), "a replay comes from a live stored record");
        FUZZ_CHECK(it->second.response == *d.replay, "a replay is the response stored under its key");
        FUZZ_CHECK(same_response(*d.replay, res), "the replay is the stored response, byte for byte");
        FUZZ_CHECK(res[idem::http::kReplayedHeader] == "true", "a replay says so");
        break;
      }
      default: {
        auto problem = idem::problem_for(d);
        FUZZ_CHECK(problem.has_value(), "every refusal has a problem");
        res = idem::http::problem_response(*problem, version, keep_alive);
        break;
      }
    }
    res.version(version);
    res.keep_alive(keep_alive);
    // No body for HEAD, nor for the statuses that never have one (the gateway's deliver()).
    const unsigned status = res.result_int();
    if (req.method() == bhttp::verb::head || status == 204 || status == 304) res.body().clear();
    co_await write(stream, res);
    if (!keep_alive) break;
  }
  stream.close();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const unsigned char* data, std::size_t size) {
  asio::io_context io;
  beast::test::stream server(io), client(io);
  server.connect(client);
  beast::error_code ec;
  asio::write(client, asio::buffer(data, size), ec);
  client.close();  // the server reads end of stream after the input

  World world;
  asio::co_spawn(io, session(world, server), asio::detached);
  io.run();

  // What came back: exactly one well-formed response per request answered.
  const std::string out(client.str());
  beast::flat_buffer buffer;
  buffer.commit(asio::buffer_copy(buffer.prepare(out.size()), asio::buffer(out)));
  int responses = 0;
  while (buffer.size() > 0) {
    bhttp::response_parser<bhttp::string_body> parser;
    parser.body_limit(16 * 1024 * 1024);
    parser.eager(true);
    while (!parser.is_done() && buffer.size() > 0) {
      const std::size_t used = parser.put(buffer.data(), ec);
      FUZZ_CHECK(!ec, "the session writes well-formed responses");
      if (used == 0) break;
      buffer.consume(used);
    }
    FUZZ_CHECK(parser.is_done(), "the session writes whole responses");
    ++responses;
  }
  FUZZ_CHECK(responses == world.requests, "one response per request");
  return 0;
}
