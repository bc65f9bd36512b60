// The Handler's HTTP/2 and gRPC parts (proxy.hpp): a request forwarded to an HTTP/2 upstream
// (upstream_protocol = "h2"), and the gRPC form of the gateway's own answers and of the storage
// rule (docs/gateway.md, gRPC).
#include <charconv>

#include "h2_upstream.hpp"
#include "idem/gateway/grpc.hpp"
#include "idem/gateway/log.hpp"
#include "proxy.hpp"

namespace idem::gateway {
namespace {

// What a gRPC client acts on when it cannot be told by an HTTP status: how long to wait before
// it may retry a call the gateway refused for now (in use, store unavailable).
constexpr long kDefaultPushbackMs = 1000;

std::optional<grpc::Code> status_of(const bhttp::fields& fields) {
  const std::string trailer = std::string(grpc::kTrailerPrefix) + "grpc-status";
  if (auto it = fields.find(trailer); it != fields.end()) return grpc::parse_status(it->value());
  if (auto it = fields.find("grpc-status"); it != fields.end()) return grpc::parse_status(it->value());  // trailers-only
  return std::nullopt;
}

}  // namespace

http::Response grpc_answer(const Problem& problem) {
  // A "trailers-only" answer: HTTP 200 and the call's status in the one HEADERS frame.
  http::Response res{bhttp::status::ok, 11};
  const grpc::Code code = grpc::code_for_problem(problem.code, problem.status);
  res.set(bhttp::field::content_type, "application/grpc");
  res.set("grpc-status", std::to_string(static_cast<int>(code)));
  res.set("grpc-message", grpc::percent_encode(problem.detail.empty() ? problem.title : problem.title + ": " + problem.detail));
  res.set("idem-problem-code", problem.code);
  if (problem.retry_after_seconds || code == grpc::Code::aborted || code == grpc::Code::unavailable) {
    const long ms = problem.retry_after_seconds ? *problem.retry_after_seconds * 1000 : kDefaultPushbackMs;
    res.set("grpc-retry-pushback-ms", std::to_string(ms));
  }
  res.keep_alive(true);
  return res;
}

GrpcRecord grpc_record_for(const bhttp::fields& fields, std::uint32_t retryable) {
  // No valid grpc-status: the call failed in a way gRPC calls INTERNAL, which is stored unless
  // listed, like any other status.
  const grpc::Code status = status_of(fields).value_or(grpc::Code::internal);
  if ((retryable & (1u << static_cast<unsigned>(status))) != 0) return GrpcRecord::retryable;
  // A server whose deadline fired answers DEADLINE_EXCEEDED while its handler may still run on
  // (gRPC does not stop it): the effect may happen after the answer.
  if (status == grpc::Code::deadline_exceeded) return GrpcRecord::leave_in_progress;
  return GrpcRecord::store;
}

Millis Handler::upstream_deadline(const http::Request& req) const {
  Millis timeout = cfg_->upstream_timeout;
  if (!grpc_) return timeout;
  // A call's deadline (grpc-timeout) is honoured: the gateway waits no longer than the client.
  if (auto it = req.find("grpc-timeout"); it != req.end()) {
    if (auto deadline = grpc::parse_timeout(it->value())) {
      timeout = std::min(timeout, std::chrono::ceil<Millis>(*deadline));
    }
  }
  return timeout;
}

Task<Handler::Exchange> Handler::forward_h2(http::Request& req, const Ticket* ticket, bool keep_alive) {
  const unsigned version = req.version();
  const bool head = req.method() == bhttp::verb::head;
  // TE is hop-by-hop in HTTP/1.1, and prepare_forward removes it; HTTP/2 keeps "TE: trailers",
  // which gRPC servers require.
  bool te_trailers = false;
  for (auto [it, end] = req.equal_range(bhttp::field::te); it != end; ++it) te_trailers |= iequals(it->value(), "trailers");
  prepare_forward(req, ticket);
  if (te_trailers) req.set(bhttp::field::te, "trailers");
  if (!w_.h2_upstream) w_.h2_upstream = std::make_unique<H2Upstream>(w_);
  // The whole response is collected: up to what may be stored, or 64 MiB for a request no key
  // holds (docs/gateway.md, HTTP/2 to the upstream).
  const std::size_t limit = ticket ? options_->max_stored_response : std::max<std::size_t>(options_->max_stored_response, 64u << 20);
  const auto sent_at = std::chrono::steady_clock::now();
  H2Reply reply = co_await w_.h2_upstream->exchange(req, *config_, upstream_deadline(req), limit);
  if (!reply.ok) {
    const UpstreamError kind = reply.sent_nothing ? UpstreamError::unreachable : reply.error;
    co_return co_await upstream_failed(kind, ticket, version, keep_alive, reply.detail);
  }
  const auto upstream_time = std::chrono::steady_clock::now() - sent_at;
  m_.upstream.observe(upstream_time);
  upstream_ms_ = std::chrono::duration<double, std::milli>(upstream_time).count();
  http::Response res{static_cast<bhttp::status>(reply.status), 11};
  static_cast<bhttp::fields&>(res.base()) = std::move(reply.head);
  res.result(reply.status);
  res.version(11);
  res.body() = std::move(reply.body);
  for (auto& [name, value] : reply.trailers) res.insert(std::string(grpc::kTrailerPrefix) + name, value);
  co_return co_await deliver(res, ticket, version, keep_alive, head);
}

}  // namespace idem::gateway
