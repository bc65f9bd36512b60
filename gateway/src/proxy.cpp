// Deciding and answering one request: route it, derive its tenant, claim its key, forward it to
// the upstream or answer from the store, record the outcome, write the response, log its line.
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/serializer.hpp>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include <algorithm>
#include <cstdio>
#include <ctime>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "h2_message.hpp"
#include "idem/gateway/access_log.hpp"
#include "idem/gateway/grpc.hpp"
#include "idem/gateway/log.hpp"
#include "idem/http/async.hpp"
#include "idem/key.hpp"
#include "idem/problem.hpp"
#include "idem/tenant.hpp"
#include "proxy.hpp"

namespace idem::gateway {
namespace {

using http::Request;
using http::Response;
using Clock = std::chrono::steady_clock;

constexpr std::size_t kChunk = 64 * 1024;
constexpr std::uint32_t kUpstreamHeaderLimit = 64 * 1024;

constexpr std::string_view kForwardedFor = "X-Forwarded-For";
constexpr std::string_view kForwardedProto = "X-Forwarded-Proto";
/// Sent with executed and replayed keyed responses that the store keeps (docs/gateway.md).
constexpr std::string_view kExpiresHeader = "Idempotency-Key-Expires";
/// Sent to the upstream with a webhook route's verified events: the provider profile that verified
/// it. Removed from every request a client sends, so only the gateway can say it.
constexpr std::string_view kWebhookVerified = "Idem-Webhook-Verified";

UpstreamError failure_kind(const beast::error_code& ec) {
  return ec == beast::error::timeout ? UpstreamError::timeout : UpstreamError::dropped;
}

// A TLS 1.3 client finishes its handshake before the server has checked the client's
// certificate: an upstream that refuses the gateway's certificate says so with an alert where the
// response should be. It read no request then (application data only follows an accepted
// handshake), so the request was not sent in any sense that matters: 502, key released.
bool upstream_refused_client_certificate(const beast::error_code& ec) {
  if (ec.category() != asio::error::get_ssl_category()) return false;
  switch (ERR_GET_REASON(static_cast<unsigned long>(ec.value()))) {
    case SSL_R_TLSV13_ALERT_CERTIFICATE_REQUIRED:
    case SSL_R_SSLV3_ALERT_BAD_CERTIFICATE:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_UNKNOWN:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_EXPIRED:
    case SSL_R_SSLV3_ALERT_CERTIFICATE_REVOKED:
    case SSL_R_SSLV3_ALERT_UNSUPPORTED_CERTIFICATE:
    case SSL_R_TLSV1_ALERT_UNKNOWN_CA:
    case SSL_R_TLSV1_ALERT_ACCESS_DENIED:
    case SSL_R_TLSV1_ALERT_DECRYPT_ERROR:
      return true;
    default:
      return false;
  }
}

std::string response_failure(const beast::error_code& ec) {
  if (ec == beast::error::timeout) return "the upstream did not send the whole response within upstream_timeout";
  if (is_http_error(ec) && ec != bhttp::error::partial_message) return "the upstream's response is not valid HTTP: " + ec.message();
  return "the upstream closed the connection in the middle of the response: " + ec.message();
}

// An HTTP-date (RFC 9110 §5.6.7, IMF-fixdate): "Sun, 06 Nov 1994 08:49:37 GMT".
std::string http_date(TimePoint t) {
  const std::time_t secs = static_cast<std::time_t>(to_epoch_ms(t) / 1000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[40];
  const std::size_t n = std::strftime(buf, sizeof buf, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  return std::string(buf, n);
}

// The request's key as the log shows it (nullopt when it has none or an invalid one).
std::optional<std::string> key_of(const Policy& policy, const Request& req) {
  std::string_view values[4];
  std::size_t n = 0;
  for (const auto& f : req) {
    if (n < 4 && iequals(f.name_string(), policy.key_header)) values[n++] = f.value();
  }
  auto key = parse_key(std::span<const std::string_view>(values, n), policy.key);
  if (!key) return std::nullopt;
  return std::string(*key);
}

// For a gRPC client, the record of an execution whose response was too large to store
// (not_stored_response, which names the original status): the call executed, and its answer
// cannot be replayed. nullopt for any other record.
std::optional<Problem> not_stored_problem(const StoredResponse& stored) {
  if (stored.status != 410) return std::nullopt;
  for (const auto& [name, value] : stored.headers) {
    if (!iequals(name, "Idempotent-Original-Status")) continue;
    return make_problem(410, "idempotency_response_not_stored", "The response to this request was not stored",
                        "the call with this key was executed (upstream status " + value +
                            ") but its answer was larger than max_stored_response, so it cannot be replayed; do "
                            "not retry, look the result up instead");
  }
  return std::nullopt;
}

void erase_trailers(bhttp::fields& fields) {
  for (auto it = fields.begin(); it != fields.end();) {
    if (it->name_string().starts_with(grpc::kTrailerPrefix)) {
      it = fields.erase(it);
    } else {
      ++it;
    }
  }
}

// Whether the request carries a header of that name (even an empty one).
bool has_header(std::span<const HeaderView> headers, std::string_view name) {
  for (const auto& h : headers) {
    if (iequals(h.name, name)) return true;
  }
  return false;
}

}  // namespace

http::Response problem_response(const Problem& problem, const RouteOptions& options, unsigned version, bool keep_alive) {
  return http::problem_response(problem, *options.errors, version, keep_alive);
}

Handler::Handler(ClientSide& s) : s_(s), w_(s.worker), m_(s.worker.metrics), engine_(s.worker.shared.engine) {}

Task<bool> Handler::write(Response& res) {
  // Trailers (from an HTTP/2 upstream) travel among the fields with a prefix no real field has:
  // an HTTP/1.1 client gets none of them.
  if (cfg_->upstream_http2 && !s_.h2) erase_trailers(res.base());
  return s_.write(res, cfg_->client_timeout);
}

Response Handler::problem(const Problem& p, unsigned version, bool keep_alive) const {
  if (grpc_) return grpc_answer(p);
  return problem_response(p, *options_, version, keep_alive);
}

void Handler::advertise_expiry(bhttp::fields& fields, const Exchange& ex) const {
  if (options_->advertise_expiry && ex.expires) fields.set(kExpiresHeader, http_date(*ex.expires));
}

// What is recorded for a response whose body exceeds max_stored_response: the status decides
// as usual (5xx fail, 408/409/425/429 release); a response that would be stored is replaced by
// a 410 stand-in, so a retry learns the request was executed instead of executing it again.
StoredResponse Handler::oversized_record(unsigned status, const Ticket& ticket) {
  StoredResponse stored;
  stored.status = static_cast<int>(status);
  if (classify_status(stored.status, ticket.store_server_errors) == Disposition::store) {
    m_.oversized_responses.fetch_add(1, std::memory_order_relaxed);
    // Written in the route's envelope, like every answer the gateway makes itself.
    return not_stored_response(static_cast<int>(status), options_->max_stored_response, *options_->errors);
  }
  return stored;
}

StoredResponse Handler::to_record(const bhttp::fields& fields, unsigned status, std::string_view body,
                                  const Ticket& ticket) {
  if (body.size() > options_->max_stored_response) return oversized_record(status, ticket);
  return http::to_stored_response(fields, status, body);
}

// store_timeout, or zero (no deadline) for the memory store: it answers within the call, so
// it cannot hang, and its calls skip the bookkeeping (an allocation and a list entry each).
Millis Handler::store_deadline() const {
  return cfg_->store.kind == StoreUrl::Kind::memory ? Millis::zero() : cfg_->store_timeout;
}

StoreError Handler::store_timeout_error() const {
  return StoreError{StoreErrc::timeout,
                    "no answer from the store within store_timeout (" + std::to_string(cfg_->store_timeout.count()) +
                        " ms)",
                    /*in_doubt=*/true};
}

auto Handler::async_begin_within(const Policy& policy, const RequestView& view, std::string_view tenant) {
  auto timed_out = [this, retry_after = policy.retry_after] {
    Decision d;
    d.verdict = Verdict::store_unavailable;
    d.retry_after = retry_after;
    d.detail = "the idempotency store did not answer in time; nothing was executed, retry later";
    d.store_error = store_timeout_error();
    return d;
  };
  // A claim that succeeds after its request got its 503 holds a key nobody will use: release
  // it, so that the client's retry executes instead of waiting out the lease.
  auto on_late = [engine = &engine_, metrics = &m_](Decision late) {
    if (late.verdict != Verdict::execute || !late.ticket) return;
    metrics->late_claims_released.fetch_add(1, std::memory_order_relaxed);
    engine->release(*late.ticket, [key = late.ticket->fence.id.key](StoreResult<FinishStatus> r) {
      if (!r) {
        log::write(LogLevel::warn, "store: releasing key " + key + ", claimed after its request timed out, failed (" +
                                       r.error().message + "); it stays in progress until its lease expires");
      }
    });
  };
  return async_store_call<Decision>(
      w_.store_deadlines, store_deadline(), timed_out, on_late,
      [engine = &engine_, policy = &policy, view = &view, tenant = std::string(tenant)](auto done) mutable {
        engine->begin(*policy, *view, std::move(tenant), std::move(done));
      },
      kAwait);
}

auto Handler::async_finish_within(const Ticket& ticket, StoredResponse&& stored) {
  return async_store_call<StoreResult<FinishStatus>>(
      w_.store_deadlines, store_deadline(), [this] { return std::unexpected(store_timeout_error()); },
      [](StoreResult<FinishStatus>) {},
      [engine = &engine_, ticket = &ticket, stored = std::move(stored)](auto done) mutable {
        engine->finish(*ticket, std::move(stored), std::move(done));
      },
      kAwait);
}

auto Handler::async_release_within(const Ticket& ticket) {
  return async_store_call<StoreResult<FinishStatus>>(
      w_.store_deadlines, store_deadline(), [this] { return std::unexpected(store_timeout_error()); },
      [](StoreResult<FinishStatus>) {},
      [engine = &engine_, ticket = &ticket](auto done) mutable { engine->release(*ticket, std::move(done)); },
      kAwait);
}

Task<FinishResult> Handler::finish(const Ticket& ticket, StoredResponse&& stored) {
  const auto t0 = Clock::now();
  auto r = co_await async_finish_within(ticket, std::move(stored));
  m_.store_call(StoreCall::finish).observe(Clock::now() - t0);
  FinishResult result = FinishResult::error;
  if (!r) {
    log::write(LogLevel::error, "store: recording the outcome of key " + ticket.fence.id.key + " failed (" +
                                    std::string(to_string(r.error().code)) + ": " + r.error().message +
                                    "); the record stays in progress until its lease expires");
  } else {
    switch (*r) {
      case FinishStatus::stored: result = FinishResult::stored; break;
      case FinishStatus::released: result = FinishResult::released; break;
      case FinishStatus::failed_retryable: result = FinishResult::failed_retryable; break;
      case FinishStatus::fenced_out: result = FinishResult::fenced_out; break;
      case FinishStatus::abandoned: result = FinishResult::abandoned; break;
    }
  }
  m_.count(result);
  co_return result;
}

Task<FinishResult> Handler::release(const Ticket& ticket) {
  const auto t0 = Clock::now();
  auto r = co_await async_release_within(ticket);
  m_.store_call(StoreCall::release).observe(Clock::now() - t0);
  FinishResult result = FinishResult::error;
  if (!r) {
    log::write(LogLevel::error, "store: releasing key " + ticket.fence.id.key + " failed (" + r.error().message +
                                    "); the record stays in progress until its lease expires");
  } else {
    result = *r == FinishStatus::released ? FinishResult::released : FinishResult::fenced_out;
  }
  m_.count(result);
  co_return result;
}

auto Handler::async_resolve_within(const Ticket& ticket, StoredResponse&& stored) {
  return async_store_call<StoreResult<FinishStatus>>(
      w_.store_deadlines, store_deadline(), [this] { return std::unexpected(store_timeout_error()); },
      [](StoreResult<FinishStatus>) {},
      [engine = &engine_, ticket = &ticket, stored = std::move(stored)](auto done) mutable {
        engine->resolve(*ticket, std::move(stored), std::move(done));
      },
      kAwait);
}

// The lookup's outcome becomes the record's (Engine::resolve), fenced like any completion.
// `stored` by rvalue reference, as finish() takes it. Taken by value (a copy in the coroutine's
// frame, moved into the store call), g++ 12's build freed its header buffer when the coroutine
// ended while the stored record still held it: a use-after-free ASan found in the ask test.
Task<FinishResult> Handler::resolve(const Ticket& ticket, StoredResponse&& stored) {
  const auto t0 = Clock::now();
  auto r = co_await async_resolve_within(ticket, std::move(stored));
  m_.store_call(StoreCall::finish).observe(Clock::now() - t0);
  FinishResult result = FinishResult::error;
  if (!r) {
    log::write(LogLevel::error, "store: recording the looked-up outcome of key " + ticket.fence.id.key + " failed (" +
                                    r.error().message + "); the next retry asks again");
  } else {
    result = *r == FinishStatus::stored ? FinishResult::stored : FinishResult::fenced_out;
  }
  m_.count(result);
  co_return result;
}

// A lookup that could not tell: the record goes back to what the claim found (in progress, its
// lease ended), so the next retry asks again.
Task<FinishResult> Handler::unclaim(const Ticket& ticket) {
  const auto t0 = Clock::now();
  auto r = co_await async_store_call<StoreResult<FinishStatus>>(
      w_.store_deadlines, store_deadline(), [this] { return std::unexpected(store_timeout_error()); },
      [](StoreResult<FinishStatus>) {},
      [engine = &engine_, ticket = &ticket](auto done) mutable { engine->unclaim(*ticket, std::move(done)); },
      kAwait);
  m_.store_call(StoreCall::release).observe(Clock::now() - t0);
  FinishResult result = FinishResult::error;
  if (!r) {
    log::write(LogLevel::warn, "store: giving key " + ticket.fence.id.key + " back after its lookup failed (" +
                                   r.error().message + "); it is asked about again once this claim's lease ends");
  } else {
    switch (*r) {
      case FinishStatus::abandoned: result = FinishResult::abandoned; break;
      case FinishStatus::released: result = FinishResult::released; break;
      case FinishStatus::failed_retryable: result = FinishResult::failed_retryable; break;
      case FinishStatus::fenced_out: result = FinishResult::fenced_out; break;
      case FinishStatus::stored: result = FinishResult::stored; break;
    }
  }
  m_.count(result);
  co_return result;
}

// Sends one lookup (GET target, the contract's headers) over the upstream pool and reads the
// whole answer within lookup_timeout; nullopt with `failure` set when none came. A GET changes
// nothing, so a reused connection the upstream had closed is retried once on a new one.
Task<std::optional<http::LookupReply>> Handler::send_lookup(const std::string& target, const Headers& headers,
                                                            std::string& failure) {
  Request lookup{bhttp::verb::get, target, 11};
  lookup.set(bhttp::field::host, cfg_->upstream.authority);
  for (const auto& h : headers) lookup.insert(h.name, h.value);
  const std::size_t limit = options_->max_stored_response;
  bool fresh = false;
  for (int attempt = 0;; ++attempt) {
    auto acquired = co_await w_.pool.acquire(fresh, config_->upstream(), *cfg_, config_->snapshot->upstream_tls);
    if (!acquired.conn) {
      failure = !acquired.failure.empty() ? acquired.failure : "connecting to the upstream failed: " + acquired.ec.message();
      co_return std::nullopt;
    }
    auto conn = std::move(acquired.conn);
    conn->stream.expires_after(cfg_->lookup_timeout);
    beast::error_code ec;
    const std::size_t written = co_await write_message(conn->stream, lookup, s_.head, ec);
    bhttp::response_parser<bhttp::string_body> parser;
    if (!ec) {
      parser.header_limit(kUpstreamHeaderLimit);
      parser.body_limit(limit);
      co_await bhttp::async_read(conn->stream, conn->buffer, parser, with(ec));
    }
    if (ec && ec != bhttp::error::body_limit) {
      const bool silent = written == 0 || (!parser.got_some() && conn->buffer.size() == 0);
      if (silent && acquired.reused && attempt == 0 && ec != beast::error::timeout) {
        fresh = true;
        continue;
      }
      failure = ec == beast::error::timeout
                    ? "no whole answer within lookup_timeout (" + std::to_string(cfg_->lookup_timeout.count()) + " ms)"
                    : "the lookup failed: " + ec.message();
      co_return std::nullopt;
    }
    http::LookupReply reply;
    reply.status = static_cast<int>(parser.get().result_int());
    reply.headers = http::to_stored_response(parser.get().base(), parser.get().result_int(), {}).headers;
    reply.truncated = ec == bhttp::error::body_limit;
    if (!reply.truncated) {
      reply.body = std::move(parser.get().body());
      if (parser.keep_alive()) w_.pool.release(std::move(conn), *cfg_);
    }
    co_return reply;
  }
}

// on_lease_expiry = "ask": this retry took the key over from a holder whose lease ran out (its
// token and attempt are fenced out now); the upstream's lookup says whether the operation
// happened. Happened: its response is the outcome, recorded and replayed. Never happened: the
// retry executes. Anything else: the key is given back and the client told 409 unknown, to retry
// later, when the lookup is asked again.
Task<Handler::Exchange> Handler::ask(Request& req, const Decision& d, const Policy& policy, bool keep_alive) {
  const Ticket& ticket = *d.ticket;
  const unsigned version = req.version();
  const std::string& key = ticket.fence.id.key;
  LookupOutcome outcome = LookupOutcome::failed;
  std::string detail;
  http::LookupResult result;
  if (!w_.shared.lookups.take(cfg_->lookup_rate, Clock::now())) {
    outcome = LookupOutcome::limited;
    detail = "more lookups than lookup_rate (" + std::to_string(static_cast<long>(cfg_->lookup_rate)) +
             " a second) allows";
  } else if (auto lookup = http::parse_lookup(policy.lookup); !lookup) {
    detail = "the route's lookup is not valid: " + lookup.error();  // checked at load; kept for safety
  } else {
    const http::LookupHeaders names{policy.key_header, cfg_->upstream_tenant_header, cfg_->upstream_attempt_header};
    const auto headers = http::lookup_request_headers(names, ticket.fence.id.tenant, key, ticket.attempt);
    const auto t0 = Clock::now();
    auto reply = co_await send_lookup(http::lookup_target(*lookup, ticket.fence.id.tenant, key), headers, detail);
    m_.lookup.observe(Clock::now() - t0);
    if (reply) {
      result = http::interpret_lookup(*reply, key, http::LookupRules{policy.key_header, ticket.store_server_errors});
      switch (result.answer) {
        case http::LookupAnswer::happened: outcome = LookupOutcome::happened; break;
        case http::LookupAnswer::not_found: outcome = LookupOutcome::not_found; break;
        case http::LookupAnswer::unknown: outcome = LookupOutcome::unknown; break;
        case http::LookupAnswer::malformed: outcome = LookupOutcome::malformed; break;
        case http::LookupAnswer::mismatch: outcome = LookupOutcome::mismatch; break;
      }
      detail = result.detail;
    }
  }
  m_.count(outcome);
  lookup_ = to_string(outcome);

  if (outcome == LookupOutcome::not_found) {
    // Never happened, and the upstream has seen this attempt: execute it as the takeover it is.
    m_.count(Outcome::executed);
    m_.lease_takeovers.fetch_add(1, std::memory_order_relaxed);
    co_return co_await forward(req, &ticket, keep_alive);
  }
  Exchange ex;
  if (outcome == LookupOutcome::happened) {
    m_.count(Outcome::replayed);
    StoredResponse stored = result.oversized ? oversized_record(static_cast<unsigned>(result.response.status), ticket)
                                             : std::move(result.response);
    const TimePoint expires = engine_.clock().now() + ticket.retention;
    // Answered whatever the store says: the upstream knows the operation happened, and this is
    // its response. Unrecorded (a store error), the next retry asks again.
    Response res = http::replay_response(stored, version, keep_alive);
    ex.record = co_await resolve(ticket, std::move(stored));
    if (ex.record == FinishResult::stored) ex.expires = expires;
    advertise_expiry(res.base(), ex);
    ex.status = res.result_int();
    const bool written = co_await write(res);
    ex.keep_alive = keep_alive && written;
    co_return ex;
  }
  m_.count(Outcome::outcome_unknown);
  if (outcome != LookupOutcome::limited) {
    log::write(LogLevel::warn, "lookup: key " + key + " (attempt " + std::to_string(ticket.attempt) + "): " +
                                   std::string(to_string(outcome)) + ": " + detail);
  }
  ex.record = co_await unclaim(ticket);
  Problem p = make_problem(409, "idempotency_outcome_unknown", "The outcome of the request with this key is unknown",
                           "an earlier request with this key may have been executed, and the upstream's lookup "
                           "could not say (" + detail + "); nothing was executed now, retry later");
  p.retry_after_seconds = std::max<long>(1, policy.retry_after.count());
  Response res = problem(p, version, keep_alive);
  ex.status = res.result_int();
  const bool written = co_await write(res);
  ex.keep_alive = keep_alive && written;
  co_return ex;
}

void Handler::prepare_forward(Request& req, const Ticket* ticket) {
  http::strip_hop_by_hop(req.base());
  // One scan for the fields rewritten below: each lookup by name would be a case-insensitive
  // tree search, and most requests carry none of them but Host.
  bool has_host = false, has_expect = false, has_xff = false, has_xfp = false, has_attempt = false,
       has_tenant = false, has_verified = false;
  for (const auto& f : req) {
    switch (f.name()) {
      case bhttp::field::host: has_host = true; break;
      case bhttp::field::expect: has_expect = true; break;
      default: {
        const std::string_view name = f.name_string();
        if (iequals(name, kForwardedFor)) has_xff = true;
        if (iequals(name, kForwardedProto)) has_xfp = true;
        if (iequals(name, cfg_->upstream_attempt_header)) has_attempt = true;
        if (iequals(name, cfg_->upstream_tenant_header)) has_tenant = true;
        if (iequals(name, kWebhookVerified)) has_verified = true;
        break;
      }
    }
  }
  if (has_expect) req.erase(bhttp::field::expect);  // answered (100 Continue) and the body already read
  // The attempt and the tenant are the gateway's to say: a client's own would let it pose as a
  // later attempt (and fence out the real one at an upstream that honours the numbers).
  if (has_attempt) req.erase(cfg_->upstream_attempt_header);
  if (has_tenant) req.erase(cfg_->upstream_tenant_header);
  if (has_verified) req.erase(kWebhookVerified);
  if (!webhook_.empty()) req.insert(kWebhookVerified, webhook_);
  if (ticket) {
    req.insert(cfg_->upstream_attempt_header, std::to_string(ticket->attempt));
    if (tenant_) req.insert(cfg_->upstream_tenant_header, *tenant_);
  }
  // X-Forwarded-For: the client's own chain, then the client.
  if (!has_xff) {
    req.insert(kForwardedFor, s_.client_ip);
  } else {
    std::string xff;
    for (auto [it, end] = req.equal_range(kForwardedFor); it != end; ++it) {
      xff += it->value();
      xff += ", ";
    }
    xff += s_.client_ip;
    req.set(kForwardedFor, xff);
  }
  if (has_xfp) req.erase(kForwardedProto);
  req.insert(kForwardedProto, s_.tls ? "https" : "http");
  if (!has_host) req.insert(bhttp::field::host, cfg_->upstream.authority);
  req.version(11);
  // The body was read whole; send it with a Content-Length (never chunked). Requests without a
  // body keep no framing header, except methods whose body is expected.
  const auto method = req.method();
  if (!req.body().empty() || method == bhttp::verb::post || method == bhttp::verb::put ||
      method == bhttp::verb::patch) {
    req.content_length(req.body().size());
  } else {
    req.erase(bhttp::field::content_length);
  }
}

Task<Handler::Exchange> Handler::upstream_failed(UpstreamError kind, const Ticket* ticket, unsigned version,
                                                 bool keep_alive, const std::string& detail) {
  m_.count(kind);
  Exchange ex;
  ex.upstream_error = kind;
  Problem problem;
  if (kind == UpstreamError::unreachable) {
    // Nothing was sent: the operation did not happen, so the next retry may execute it.
    if (ticket) ex.record = co_await release(*ticket);
    problem = make_problem(502, "upstream_unreachable", "The upstream could not be reached", detail);
  } else {
    // The request was sent; whether it took effect is unknown. The record stays in progress
    // until its lease expires, then on_lease_expiry decides (SPEC 4.3).
    if (ticket) {
      ex.record = FinishResult::left_in_progress;
      m_.count(FinishResult::left_in_progress);
    }
    problem = make_problem(504, "upstream_timeout", "The upstream did not answer completely", detail);
  }
  Response res = this->problem(problem, version, keep_alive);
  ex.status = res.result_int();
  const bool written = co_await write(res);
  ex.keep_alive = keep_alive && written;
  co_return ex;
}

// Sends a complete upstream response to the client, recording it first when a key is held: a
// client that saw the response can always replay it.
Task<Handler::Exchange> Handler::deliver(Response& res, const Ticket* ticket, unsigned version, bool keep_alive,
                                         bool head) {
  Exchange ex;
  const GrpcRecord grpc_record = grpc_ && ticket && res.result_int() == 200 && !ticket->store_server_errors
                                     ? grpc_record_for(res.base(), options_->grpc_retryable)
                                     : GrpcRecord::store;
  if (ticket && grpc_record == GrpcRecord::leave_in_progress) {
    // The upstream's own deadline fired: whether the call took effect is as unknown as after the
    // gateway's upstream_timeout, and the key is left the same way (on_lease_expiry decides).
    ex.record = FinishResult::left_in_progress;
    m_.count(FinishResult::left_in_progress);
  } else if (ticket) {
    StoredResponse record = to_record(res.base(), res.result_int(), res.body(), *ticket);
    // A gRPC answer is HTTP 200 whatever the call's status: the route's retryable statuses are
    // not stored, as a 5xx is not (SPEC 4.3), and the retry executes again.
    if (grpc_record == GrpcRecord::retryable) record.status = 503;
    // The store computes its own expiry a moment later: the key is kept at least until this one.
    const TimePoint expires = engine_.clock().now() + ticket->retention;
    ex.record = co_await finish(*ticket, std::move(record));
    if (ex.record == FinishResult::stored) ex.expires = expires;
  }
  http::strip_hop_by_hop(res.base());
  advertise_expiry(res.base(), ex);
  res.version(version);
  res.keep_alive(keep_alive);
  const unsigned status = res.result_int();
  if (status == 204 || status < 200) {
    res.erase(bhttp::field::content_length);
  } else if (!head && status != 304) {
    res.content_length(res.body().size());
  }
  ex.status = status;
  const bool written = co_await write(res);
  ex.keep_alive = keep_alive && written;
  co_return ex;
}

Task<Handler::Exchange> Handler::forward(Request& req, const Ticket* ticket, bool keep_alive) {
  const unsigned version = req.version();
  const bool head = req.method() == bhttp::verb::head;
  if (cfg_->upstream_http2) co_return co_await forward_h2(req, ticket, keep_alive);
  const bool retry_safe = !ticket && http::is_idempotent_method(req.method_string());
  prepare_forward(req, ticket);

  std::unique_ptr<UpstreamConn> conn;
  std::optional<bhttp::response_parser<bhttp::string_body>> parser;
  beast::error_code ec;
  Clock::time_point sent_at;
  bool fresh = false;
  for (int attempt = 0;; ++attempt) {
    auto acquired = co_await w_.pool.acquire(fresh, config_->upstream(), *cfg_, config_->snapshot->upstream_tls);
    if (!acquired.conn) {
      const std::string detail =
          acquired.ec == asio::error::host_not_found
              ? "the upstream host " + cfg_->upstream.host + " does not resolve: " + config_->upstream().error()
          : !acquired.failure.empty() ? acquired.failure
                                      : "connecting to the upstream failed: " + acquired.ec.message();
      co_return co_await upstream_failed(UpstreamError::unreachable, ticket, version, keep_alive, detail);
    }
    conn = std::move(acquired.conn);
    conn->stream.expires_after(cfg_->upstream_timeout);
    sent_at = Clock::now();
    const std::size_t written = co_await write_message(conn->stream, req, s_.head, ec);
    if (ec) {
      if (written == 0) {
        // Not one byte left this process: the upstream cannot have seen the request. A reused
        // connection the upstream had closed is the usual cause; try once on a new one.
        if (acquired.reused && attempt == 0) {
          fresh = true;
          continue;
        }
        std::string detail = "sending to the upstream failed: " + ec.message();
        if (conn->stream.tls() != nullptr && !acquired.reused) {
          // An upstream refusing the gateway's certificate closes right after the handshake.
          detail += " (right after the TLS handshake: the upstream may have refused the gateway's client certificate, "
                    "[upstream_tls] cert_file)";
        }
        co_return co_await upstream_failed(UpstreamError::unreachable, ticket, version, keep_alive, detail);
      }
      const UpstreamError kind = failure_kind(ec);
      const std::string detail = "the upstream connection failed while sending the request: " + ec.message();
      co_return co_await upstream_failed(kind, ticket, version, keep_alive, detail);
    }
    // Read the response header, skipping interim (1xx) responses.
    for (;;) {
      parser.emplace();
      parser->header_limit(kUpstreamHeaderLimit);
      parser->body_limit(std::numeric_limits<std::uint64_t>::max());
      if (head) parser->skip(true);
      co_await bhttp::async_read_header(conn->stream, conn->buffer, *parser, with(ec));
      if (ec) break;
      const unsigned status = parser->get().result_int();
      if (status >= 200 || status == 101) break;
    }
    if (ec) {
      // The upstream closed a reused connection without answering. If that raced with our
      // request it never processed it, but it may also have crashed while processing it; only
      // requests that are idempotent by method, and carry no key, are sent again.
      const bool silent = !parser->got_some() && conn->buffer.size() == 0 && ec != beast::error::timeout;
      if (silent && acquired.reused && attempt == 0 && retry_safe) {
        fresh = true;
        continue;
      }
      if (!acquired.reused && !parser->got_some() && upstream_refused_client_certificate(ec)) {
        const std::string detail = "the upstream refused the gateway's TLS client certificate ([upstream_tls] cert_file): " +
                                   ec.message();
        co_return co_await upstream_failed(UpstreamError::unreachable, ticket, version, keep_alive, detail);
      }
      const UpstreamError kind = failure_kind(ec);
      std::string detail = "the upstream did not answer within upstream_timeout";
      if (kind == UpstreamError::dropped) {
        detail = is_http_error(ec) && ec != bhttp::error::partial_message && ec != bhttp::error::end_of_stream
                     ? "the upstream's response is not valid HTTP: " + ec.message()
                     : "the upstream closed the connection before answering: " + ec.message();
      }
      co_return co_await upstream_failed(kind, ticket, version, keep_alive, detail);
    }
    break;
  }
  const auto upstream_time = Clock::now() - sent_at;
  m_.upstream.observe(upstream_time);
  upstream_ms_ = std::chrono::duration<double, std::milli>(upstream_time).count();

  const unsigned status = parser->get().result_int();
  if (status == 101) {
    const std::string detail = "the upstream switched protocols, which the gateway does not support";
    co_return co_await upstream_failed(UpstreamError::dropped, ticket, version, keep_alive, detail);
  }
  const std::size_t limit = options_->max_stored_response;
  const auto length = parser->content_length();

  if (parser->is_done() || (length && *length <= limit)) {
    // Fast path: the whole body fits; read it into the string body.
    if (!parser->is_done()) co_await bhttp::async_read(conn->stream, conn->buffer, *parser, with(ec));
    if (ec) {
      const std::string detail = response_failure(ec);
      co_return co_await upstream_failed(failure_kind(ec), ticket, version, keep_alive, detail);
    }
    const bool reusable = parser->keep_alive();
    Response res = parser->release();
    if (reusable) w_.pool.release(std::move(conn), *cfg_);
    conn.reset();
    co_return co_await deliver(res, ticket, version, keep_alive, head);
  }

  // Slow path: unknown length (chunked, or until EOF) or too large to store. Collect up to the
  // limit; beyond it, stream to the client.
  bhttp::response_parser<bhttp::buffer_body> bp{std::move(*parser)};
  std::string collected;
  auto chunk = std::make_unique<char[]>(kChunk);
  bool streaming = false;
  bhttp::response<bhttp::buffer_body> out;
  Exchange ex;

  auto start_streaming = [&]() -> Task<bool> {
    // The outcome is decided by the status; the body cannot be stored.
    if (ticket) {
      StoredResponse record = oversized_record(status, *ticket);
      const TimePoint expires = engine_.clock().now() + ticket->retention;
      ex.record = co_await finish(*ticket, std::move(record));
      if (ex.record == FinishResult::stored) ex.expires = expires;
    }
    out.base() = bp.get().base();
    http::strip_hop_by_hop(out.base());
    advertise_expiry(out.base(), ex);
    out.version(version);
    out.erase(bhttp::field::content_length);
    bool client_keep_alive = keep_alive;
    if (length) {
      out.content_length(*length);
    } else if (version >= 11) {
      out.chunked(true);
    } else {
      client_keep_alive = false;  // HTTP/1.0 without a length: the close delimits the body
    }
    out.keep_alive(client_keep_alive);
    ex.keep_alive = client_keep_alive;
    ex.status = status;
    streaming = true;
    co_return true;
  };
  auto send = [&](const char* data, std::size_t size, bool more) -> Task<bool> {
    out.body().data = size ? const_cast<char*>(data) : nullptr;
    out.body().size = size;
    out.body().more = more;
    return s_.write_piece(out, cfg_->client_timeout);
  };

  if (length && *length > limit) co_await start_streaming();
  for (;;) {
    bp.get().body().data = chunk.get();
    bp.get().body().size = kChunk;
    conn->stream.expires_after(cfg_->upstream_timeout);
    co_await bhttp::async_read(conn->stream, conn->buffer, bp, with(ec));
    if (ec == bhttp::error::need_buffer) ec = {};
    const std::size_t n = kChunk - bp.get().body().size;
    if (ec) {
      if (!streaming) {
        const std::string detail = response_failure(ec);
        co_return co_await upstream_failed(failure_kind(ec), ticket, version, keep_alive, detail);
      }
      // Headers are already out: all we can do is cut the client connection.
      ex.upstream_error = failure_kind(ec);
      m_.count(*ex.upstream_error);
      ex.keep_alive = false;
      co_return ex;
    }
    const bool done = bp.is_done();
    if (!streaming) {
      if (collected.size() + n <= limit) {
        collected.append(chunk.get(), n);
        if (!done) continue;
        // Everything fit after all: deliver it like a fast-path response.
        const bool reusable = bp.keep_alive();
        Response res{std::move(bp.get().base())};
        res.body() = std::move(collected);
        if (reusable) w_.pool.release(std::move(conn), *cfg_);
        co_return co_await deliver(res, ticket, version, keep_alive, head);
      }
      co_await start_streaming();
      if (!collected.empty()) {
        const bool sent = co_await send(collected.data(), collected.size(), true);
        if (!sent) {
          ex.keep_alive = false;
          co_return ex;
        }
      }
      collected.clear();
      collected.shrink_to_fit();
    }
    const bool sent = co_await send(chunk.get(), n, !done);
    if (!sent) {
      ex.keep_alive = false;
      co_return ex;
    }
    if (done) break;
  }
  if (bp.keep_alive()) w_.pool.release(std::move(conn), *cfg_);
  co_return ex;
}

void Handler::log_key(const Decision* d, const Problem* refusal, const Policy& policy, const std::string* tenant,
                      const Request& req, const Exchange& ex) {
  if (!log::enabled(LogLevel::info)) return;
  static constexpr std::string_view kRecords[] = {"stored",          "released",        "failed_retryable",
                                                  "fenced_out",      "error",           "left_in_progress",
                                                  "abandoned"};
  static constexpr std::string_view kUpstreamErrors[] = {"unreachable", "timeout", "dropped"};
  KeyLine line;
  if (tenant) line.tenant = *tenant;
  std::optional<std::string> parsed_key;
  if (d && d->ticket) {
    line.key = d->ticket->fence.id.key;
  } else if (!d || (d->verdict != Verdict::key_invalid && d->verdict != Verdict::key_missing)) {
    parsed_key = key_of(policy, req);
    if (parsed_key) line.key = *parsed_key;
  }
  line.method = req.method_string();
  line.path = http::split_target(req.target()).path;
  line.verdict = refusal ? std::string_view(refusal->code) : to_string(d->verdict);
  if (d && d->ticket && d->ticket->kind != ClaimKind::fresh) {
    line.takeover = d->ticket->kind == ClaimKind::after_lease_expiry ? "lease_expired" : "after_failure";
  }
  if (d && d->ticket) line.attempt = d->ticket->attempt;
  line.lookup = lookup_;
  line.status = ex.status;
  if (ex.record) line.record = kRecords[static_cast<std::size_t>(*ex.record)];
  if (ex.upstream_error) line.upstream_error = kUpstreamErrors[static_cast<std::size_t>(*ex.upstream_error)];
  // Why the claim failed (503, 500): the only place an operator can read it.
  if (d && d->store_error) line.store_error = d->store_error->message;
  if (refusal) line.reason = refusal->detail;  // the problem's detail: never the token
  line.ms = std::chrono::duration<double, std::milli>(Clock::now() - start_).count();
  line.upstream_ms = upstream_ms_;
  const RequestView& view = s_.view.view();
  std::string generated;
  line.request_id = request_id_of(view.headers, generated);
  line.trace_id = trace_id_of(view.headers);
  log::event(LogLevel::info, "key", log::format() == LogFormat::json ? render_json_members(line) : render_text(line));
}

Task<bool> Handler::handle(Request& req, std::shared_ptr<LoopConfig> config, Router::Match route) {
  config_ = std::move(config);
  cfg_ = &config_->config();
  options_ = &config_->runtime().options(route.route);
  start_ = Clock::now();
  upstream_ms_.reset();
  tenant_ = nullptr;
  lookup_ = {};
  webhook_ = {};
  grpc_ = s_.h2 && grpc::is_grpc_content_type(req[bhttp::field::content_type]);
  const bool keep_alive = req.keep_alive() && !w_.draining;
  const unsigned version = req.version();
  const Policy* policy = route.policy;
  if (policy == nullptr) {
    m_.count(Outcome::passed_through);
    const Exchange ex = co_await forward(req, nullptr, keep_alive);
    co_return ex.keep_alive;
  }

  const RequestView* view = &s_.view.assign(req);
  TenantSource& source = config_->tenants.for_route(route.route);
  const Route* listed = route.route < cfg_->routes.size() ? &cfg_->routes[route.route] : nullptr;
  std::string tenant;
  if (listed != nullptr && listed->webhook) {
    // The signature is checked over the body exactly as received, before anything else: a request
    // that fails it makes no store call, claims nothing and reaches no upstream.
    const WebhookRoute& webhook = *listed->webhook;
    const std::int64_t now = to_epoch_ms(engine_.clock().now()) / 1000;
    auto verified = webhook.verifier->verify(view->headers, view->body, now);
    if (!verified) {
      m_.count(Outcome::webhook_refused);
      m_.count(verified.error().reason);
      const std::string_view code = to_string(verified.error().reason);
      const Problem refusal = make_problem(400, std::string(code), "The webhook request was not verified",
                                           verified.error().detail);  // the detail holds no secret, no signature
      Response res = problem(refusal, version, keep_alive);
      Exchange ex;
      ex.status = res.result_int();
      const bool written = co_await write(res);
      log_key(nullptr, &refusal, *policy, nullptr, req, ex);
      co_return written && keep_alive;
    }
    m_.webhooks_verified.fetch_add(1, std::memory_order_relaxed);
    // From here on it is an ordinary keyed request: the event's id is its key (replacing any key
    // header a sender set), in the route's own tenant.
    req.set(policy->key_header, *verified);
    view = &s_.view.assign(req);  // the key header changed the fields the view points into
    tenant = webhook.tenant;
    webhook_ = to_string(webhook.verifier->profile());
  } else if (!source.verifies_credentials() || has_header(view->headers, policy->key_header)) {
    // A verified token scopes keys, so a request without a key needs none: it passes through (or
    // gets 400 idempotency_key_missing) and the upstream authenticates it as it always does. With
    // a key, the token is checked before anything is claimed, forwarded or replayed.
    auto derived = source.derive(view->headers, s_.client_certificate ? &*s_.client_certificate : nullptr);
    if (!derived) {
      const Problem& refusal = derived.error();
      m_.count(refusal.status == 401 ? Outcome::unauthorized : Outcome::bad_request);
      Response res = problem(refusal, version, keep_alive);
      Exchange ex;
      ex.status = res.result_int();
      const bool written = co_await write(res);
      log_key(nullptr, &refusal, *policy, nullptr, req, ex);
      co_return written && keep_alive;
    }
    tenant = std::move(*derived);
  }
  const auto t0 = Clock::now();
  Decision d = co_await async_begin_within(*policy, *view, tenant);
  if (d.verdict != Verdict::pass_through && d.verdict != Verdict::key_missing && d.verdict != Verdict::key_invalid) {
    m_.store_call(StoreCall::begin).observe(Clock::now() - t0);
  }
  if (d.verdict != Verdict::ask) m_.count(outcome_of(d.verdict));  // ask: counted by what the lookup says
  tenant_ = &tenant;

  Exchange ex;
  switch (d.verdict) {
    case Verdict::pass_through:
      ex = co_await forward(req, nullptr, keep_alive);
      co_return ex.keep_alive;  // not an idempotent request: no key line
    case Verdict::execute:
      if (d.ticket->kind == ClaimKind::after_lease_expiry) m_.lease_takeovers.fetch_add(1, std::memory_order_relaxed);
      if (d.ticket->kind == ClaimKind::after_failure) m_.failure_retries.fetch_add(1, std::memory_order_relaxed);
      // forward() rewrites headers only; the log line needs the method, target and ticket.
      ex = co_await forward(req, &*d.ticket, keep_alive);
      log_key(&d, nullptr, *policy, &tenant, req, ex);
      co_return ex.keep_alive;
    case Verdict::ask:
      ex = co_await ask(req, d, *policy, keep_alive);
      log_key(&d, nullptr, *policy, &tenant, req, ex);
      co_return ex.keep_alive;
    case Verdict::replay: {
      const std::optional<Problem> not_stored = grpc_ ? not_stored_problem(*d.replay) : std::nullopt;
      Response res = not_stored ? grpc_answer(*not_stored) : http::replay_response(*d.replay, version, keep_alive);
      ex.expires = d.replay_expires;
      advertise_expiry(res.base(), ex);
      ex.status = res.result_int();
      const bool written = co_await write(res);
      ex.keep_alive = keep_alive && written;
      break;
    }
    case Verdict::record_unreadable:
      // Only an operator can fix this (restore the key, or resolve the record), so it is said at
      // error level too, which log_level = "warn" still shows. The message names the record and
      // the key id, never key material; the client's problem says neither.
      log::write(LogLevel::error, "encryption: refused to replay, and did not execute: " +
                                      (d.store_error ? d.store_error->message : std::string("unreadable record")));
      [[fallthrough]];
    default: {
      Response res = problem(*problem_for(d), version, keep_alive);
      ex.status = res.result_int();
      const bool written = co_await write(res);
      ex.keep_alive = keep_alive && written;
      break;
    }
  }
  log_key(&d, nullptr, *policy, &tenant, req, ex);
  co_return ex.keep_alive;
}

}  // namespace idem::gateway
