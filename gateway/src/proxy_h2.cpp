// The Handler's HTTP/2 part (proxy.hpp): a request forwarded to an HTTP/2 upstream
// (upstream_protocol = "h2"), a gRPC call's deadline; the gRPC forms of the gateway's answers and
// of the storage rule are in h2_message.cpp.
#include "h2_message.hpp"
#include "h2_upstream.hpp"
#include "idem/gateway/grpc.hpp"
#include "idem/gateway/log.hpp"
#include "proxy.hpp"

namespace idem::gateway {
namespace {

constexpr std::size_t kH2ResponseLimit = 64u << 20;

}  // namespace

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
  // The whole response is collected, up to 64 MiB or max_stored_response if that is larger
  // (docs/gateway.md, HTTP/2 to the upstream); one above what may be stored is answered whole and
  // recorded as executed without its response (deliver), as over HTTP/1.1.
  const std::size_t limit = std::max<std::size_t>(options_->max_stored_response, kH2ResponseLimit);
  const auto sent_at = std::chrono::steady_clock::now();
  H2Reply reply = co_await w_.h2_upstream->exchange(req, *config_, upstream_deadline(req), limit);
  if (!reply.ok && reply.too_large) {
    // It executed and answered, but the answer cannot be relayed: the record says so (a retry
    // learns it executed), and the client gets a 502 saying why.
    Exchange ex;
    if (ticket) ex.record = co_await finish(*ticket, oversized_record(reply.status, *ticket));
    m_.count(UpstreamError::dropped);
    ex.upstream_error = UpstreamError::dropped;
    const Problem problem = make_problem(502, "upstream_response_too_large", "The upstream's response is too large",
                                         reply.detail);
    http::Response res = this->problem(problem, version, keep_alive);
    ex.status = res.result_int();
    const bool written = co_await write(res);
    ex.keep_alive = keep_alive && written;
    co_return ex;
  }
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
