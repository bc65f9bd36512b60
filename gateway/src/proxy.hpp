#pragma once

// Internal to idem-gateway: what the request path's translation units share. session.cpp reads
// requests off a client connection, proxy.cpp decides and answers them (Handler), and
// upstream_pool.cpp keeps the connections to the upstream.

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/write.hpp>

#include <array>
#include <chrono>
#include <optional>
#include <string>

#include "idem/http/lookup.hpp"
#include "idem/http/message.hpp"
#include "worker.hpp"

namespace idem::gateway {

namespace bhttp = beast::http;

class H2Connection;

inline auto with(beast::error_code& ec) { return asio::redirect_error(kAwait, ec); }

inline bool is_http_error(const beast::error_code& ec) {
  return &ec.category() == &bhttp::make_error_code(bhttp::error::bad_target).category();
}

/// Writes a whole message framed by Content-Length (or without a body): its head, built into
/// `head`, and its body in one gather write, instead of Beast's serializer with a buffer per
/// header field. A chunked message goes through Beast's serializer. Returns the bytes written.
template <class Message>
Task<std::size_t> write_message(Stream& stream, Message& message, std::string& head, beast::error_code& ec) {
  if (message.chunked()) co_return co_await bhttp::async_write(stream, message, with(ec));
  head.clear();
  http::append_head(head, message.base());
  const std::array<asio::const_buffer, 2> buffers{asio::buffer(head), asio::buffer(message.body())};
  co_return co_await asio::async_write(stream, buffers, with(ec));
}

/// The client side of one request, as the Handler sees it: who sent it, over what, and how its
/// answer goes back. An HTTP/1.1 connection (Session) carries one request at a time; an HTTP/2
/// connection one per stream (H2Stream, h2_session.cpp).
struct ClientSide {
  explicit ClientSide(Worker& w) : worker(w) {}
  ClientSide(const ClientSide&) = delete;
  ClientSide& operator=(const ClientSide&) = delete;

  /// Sends a whole response, taking its body; false when the client is gone.
  virtual Task<bool> write(http::Response& res, Millis timeout) = 0;
  /// Sends a response whose body arrives in pieces (the upstream's, beyond what can be stored):
  /// `out`'s head goes with the first piece; each call sends what out.body() points at, the last
  /// with more = false. False when the client is gone.
  virtual Task<bool> write_piece(bhttp::response<bhttp::buffer_body>& out, Millis timeout) = 0;

  Worker& worker;
  std::string client_ip;
  bool tls = false;  // came through the [tls] listener: X-Forwarded-Proto https
  bool h2 = false;   // an HTTP/2 stream: trailers go as trailers (HTTP/1.1 gets none)
  /// The client certificate verified in the TLS handshake, if any: a client_cert tenant's.
  std::optional<ClientCertificate> client_certificate;
  http::BeastRequestView view;
  std::string head;  // the head of the message being written (write_message), reused

 protected:
  ~ClientSide() = default;
};

/// A client connection, linked into its worker's list of sessions while it lives. It speaks
/// HTTP/1.1 (run_session), or HTTP/2 once ALPN or the h2c preface says so (run_h2).
struct Session final : ClientSide {
  Session(Worker& w, Socket socket, std::shared_ptr<asio::ssl::context> tls_ctx)
      : ClientSide(w), tls_context(std::move(tls_ctx)), stream(w.deadlines, std::move(socket)) {
    if (tls_context) stream.use_tls(*tls_context);
    tls = tls_context != nullptr;
    next = w.sessions;
    if (next) next->prev = this;
    w.sessions = this;
    w.open.fetch_add(1, std::memory_order_relaxed);
    w.metrics.connections.fetch_add(1, std::memory_order_relaxed);
  }
  ~Session() {
    if (prev) prev->next = next;
    if (next) next->prev = prev;
    if (worker.sessions == this) worker.sessions = next;
    worker.metrics.connections.fetch_sub(1, std::memory_order_relaxed);
    worker.open.fetch_sub(1, std::memory_order_relaxed);
  }

  Task<bool> write(http::Response& res, Millis timeout) override;
  Task<bool> write_piece(bhttp::response<bhttp::buffer_body>& out, Millis timeout) override;

  std::shared_ptr<asio::ssl::context> tls_context;  // the [tls] listener's when it came through it; outlives `stream`
  Stream stream;
  beast::flat_buffer buffer;
  bool idle = false;  // waiting for the first byte of the next request
  H2Connection* h2 = nullptr;  // while it speaks HTTP/2: what drain() tells to send GOAWAY
  Session* prev = nullptr;
  Session* next = nullptr;

 private:
  // write_piece's, for the response being streamed (reset after its last piece).
  std::optional<bhttp::response_serializer<bhttp::buffer_body>> piece_serializer_;
};

/// Serves an HTTP/2 connection (h2_session.cpp): `s` after its TLS handshake chose h2, or a plain
/// connection whose first bytes (already in s.buffer) are the h2c preface.
Task<void> run_h2(Session& s);
/// Drain: GOAWAY now; the connection closes once its open streams are answered.
void drain(H2Connection& connection);

/// Handles one request of a session at a time: routes it, decides with the engine, forwards it or
/// answers from the store, records the outcome and writes the response.
class Handler {
 public:
  explicit Handler(ClientSide& s);

  /// Handles `req`, routed to `route`, with the configuration `config` (the one in force when it
  /// arrived, kept until it is answered). Returns whether the connection may carry another request.
  Task<bool> handle(http::Request& req, std::shared_ptr<LoopConfig> config, Router::Match route);

 private:
  // What happened to one request, for the caller and the log line.
  struct Exchange {
    unsigned status = 0;  // sent to the client; 0 if nothing was sent
    bool keep_alive = false;
    std::optional<FinishResult> record;
    std::optional<UpstreamError> upstream_error;
    std::optional<TimePoint> expires;  // the key's record is kept until then (at least)
  };
  Task<Exchange> ask(http::Request& req, const Decision& d, const Policy& policy, bool keep_alive);
  Task<std::optional<http::LookupReply>> send_lookup(const std::string& target, const Headers& headers,
                                                     std::string& failure);
  Task<FinishResult> resolve(const Ticket& ticket, StoredResponse&& stored);
  auto async_resolve_within(const Ticket& ticket, StoredResponse&& stored);
  Task<FinishResult> unclaim(const Ticket& ticket);
  Task<Exchange> forward(http::Request& req, const Ticket* ticket, bool keep_alive);
  Task<Exchange> forward_h2(http::Request& req, const Ticket* ticket, bool keep_alive);  // proxy_h2.cpp
  Millis upstream_deadline(const http::Request& req) const;
  Task<Exchange> upstream_failed(UpstreamError kind, const Ticket* ticket, unsigned version, bool keep_alive,
                                 const std::string& detail);
  Task<Exchange> deliver(http::Response& res, const Ticket* ticket, unsigned version, bool keep_alive, bool head);
  Task<FinishResult> finish(const Ticket& ticket, StoredResponse&& stored);
  Task<FinishResult> release(const Ticket& ticket);
  Millis store_deadline() const;
  auto async_begin_within(const Policy& policy, const RequestView& view, std::string_view tenant);
  auto async_finish_within(const Ticket& ticket, StoredResponse&& stored);
  auto async_release_within(const Ticket& ticket);
  StoreError store_timeout_error() const;
  Task<bool> write(http::Response& res);
  http::Response problem(const Problem& problem, unsigned version, bool keep_alive) const;
  StoredResponse to_record(const bhttp::fields& fields, unsigned status, std::string_view body, const Ticket& ticket);
  StoredResponse oversized_record(unsigned status, const Ticket& ticket);
  void advertise_expiry(bhttp::fields& fields, const Exchange& ex) const;
  void prepare_forward(http::Request& req, const Ticket* ticket);
  void log_key(const Decision* d, const Problem* refusal, const Policy& policy, const std::string* tenant,
               const http::Request& req, const Exchange& ex);

  ClientSide& s_;
  Worker& w_;
  MetricsShard& m_;
  Engine& engine_;
  // The request being handled: its configuration, route and arrival.
  std::shared_ptr<LoopConfig> config_;
  const Config* cfg_ = nullptr;
  const RouteOptions* options_ = nullptr;
  std::chrono::steady_clock::time_point start_{};
  std::optional<double> upstream_ms_;  // until the upstream's response head, when forwarded
  const std::string* tenant_ = nullptr;  // the key's tenant, sent upstream with a claimed key
  std::string_view lookup_;             // what the lookup answered, for the log line
  std::string_view webhook_;            // a webhook route's verified event: the profile, sent upstream
  bool grpc_ = false;                   // a gRPC call: the gateway's answers are gRPC statuses
};


/// The envelope-rendered answer to a problem (docs/gateway.md, Errors).
http::Response problem_response(const Problem& problem, const RouteOptions& options, unsigned version, bool keep_alive);

}  // namespace idem::gateway
