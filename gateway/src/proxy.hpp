#pragma once

// Internal to idem-gateway: what the request path's translation units share. session.cpp reads
// requests off a client connection, proxy.cpp decides and answers them (Handler), and
// upstream_pool.cpp keeps the connections to the upstream.

#include <boost/asio/redirect_error.hpp>
#include <boost/asio/write.hpp>
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

/// A client connection, linked into its worker's list of sessions while it lives.
struct Session {
  Session(Worker& w, Socket socket, std::shared_ptr<asio::ssl::context> tls)
      : worker(w), tls_context(std::move(tls)), stream(w.deadlines, std::move(socket)) {
    if (tls_context) stream.use_tls(*tls_context);
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
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  Worker& worker;
  std::shared_ptr<asio::ssl::context> tls_context;  // the [tls] listener's when it came through it; outlives `stream`
  Stream stream;
  /// The client certificate verified in the TLS handshake, if any: a client_cert tenant's.
  std::optional<ClientCertificate> client_certificate;
  beast::flat_buffer buffer;
  http::BeastRequestView view;
  std::string head;  // the head of the message being written (write_message), reused
  std::string client_ip;
  bool idle = false;  // waiting for the first byte of the next request
  Session* prev = nullptr;
  Session* next = nullptr;
};

/// Handles one request of a session at a time: routes it, decides with the engine, forwards it or
/// answers from the store, records the outcome and writes the response.
class Handler {
 public:
  explicit Handler(Session& s);

  /// Handles `req`, routed to `route`, with the configuration `config` (the one in force when it
  /// arrived, kept until it is answered). Returns whether the connection may carry another request.
  Task<bool> handle(http::Request& req, std::shared_ptr<LoopConfig> config, Router::Match route);

 private:
  struct Exchange;
  Task<Exchange> ask(http::Request& req, const Decision& d, const Policy& policy, bool keep_alive);
  Task<std::optional<http::LookupReply>> send_lookup(const std::string& target, const Headers& headers,
                                                     std::string& failure);
  Task<FinishResult> resolve(const Ticket& ticket, StoredResponse&& stored);
  auto async_resolve_within(const Ticket& ticket, StoredResponse&& stored);
  Task<FinishResult> unclaim(const Ticket& ticket);
  Task<Exchange> forward(http::Request& req, const Ticket* ticket, bool keep_alive);
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

  Session& s_;
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
};

/// The envelope-rendered answer to a problem (docs/gateway.md, Errors).
http::Response problem_response(const Problem& problem, const RouteOptions& options, unsigned version, bool keep_alive);

}  // namespace idem::gateway
