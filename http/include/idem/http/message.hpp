#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace idem::http {

/// Added to every replayed response (SPEC §4.2).
inline constexpr std::string_view kReplayedHeader = "Idempotent-Replayed";
/// Added to 422 idempotency_key_mismatch (SPEC §7).
inline constexpr std::string_view kConflictHeader = "X-Idempotency-Conflict";

/// Whether a header is hop-by-hop by definition (RFC 9110 §7.6.1, plus the legacy Keep-Alive,
/// and every Proxy-* header as the gateway issue says): Connection, Keep-Alive,
/// Transfer-Encoding, TE, Trailer, Upgrade, Proxy-*. Case-insensitive.
bool is_hop_by_hop(std::string_view name);

/// The header names a message's Connection header lists: they are hop-by-hop for that message
/// only. Borrows the header values it was given, which must outlive it.
class ConnectionTokens {
 public:
  /// Adds the tokens of one Connection header value (a comma-separated list).
  void add(std::string_view connection_value);
  /// Whether `name` was listed (case-insensitive).
  bool contains(std::string_view name) const;
  /// Forgets every token (keeps the capacity).
  void clear() { tokens_.clear(); }

 private:
  std::vector<std::string_view> tokens_;  // only names that are not hop-by-hop anyway
};

/// Whether a header crosses the proxy (request to upstream, response to client): neither
/// hop-by-hop nor listed in the message's Connection header.
bool is_forwarded(std::string_view name, const ConnectionTokens& connection);

/// Whether a response header is stored for replay: forwarded, and neither Content-Length (the
/// replay recomputes it from the stored body, which is stored de-chunked) nor
/// Idempotent-Replayed (the replay adds its own). Date and every other end-to-end header are
/// stored and replayed as they were, like a cache replays a stored response.
bool is_stored(std::string_view name, const ConnectionTokens& connection);

/// A request target split for the core: `path` without the query, `query` without '?'.
struct Target {
  std::string_view path;
  std::string_view query;
};

/// Splits a request target. Absolute-form targets ("http://host/p?q") are reduced to their
/// path and query ("/p", "q"); "*" (OPTIONS *) is kept as the path.
Target split_target(std::string_view target);

/// Whether a method is idempotent by HTTP's own definition (RFC 9110 §9.2.2): GET, HEAD,
/// OPTIONS, TRACE, PUT, DELETE. Such a request may be re-sent on a fresh connection when a
/// reused one failed before answering.
bool is_idempotent_method(std::string_view method);

/// Why a request head cannot be served (RFC 9112), answered with `status` and the connection
/// closed: the bytes that follow it cannot be trusted to be the body or the next request.
struct HeadDefect {
  unsigned status = 400;   ///< 400, or 501 for what is valid HTTP but not supported
  std::string_view code;   ///< problem+json code: "bad_request" or "not_implemented"
  std::string detail;      ///< one line for the client
};

/// What check_request_head looks at, taken from a parsed request head.
struct HeadFacts {
  unsigned version = 11;                            ///< 10 or 11
  std::string_view method;                          ///< as received
  std::span<const std::string_view> transfer_encodings;  ///< every Transfer-Encoding field value
  std::span<const std::string_view> hosts;          ///< every Host field value
};

/// The framing and routing rules a parser accepting the head does not enforce:
/// - Transfer-Encoding (RFC 9112 §6.1, §6.3): in an HTTP/1.0 request, or without `chunked` as
///   its final coding (the body's length cannot be known), 400; other codings before `chunked`
///   (`gzip, chunked`), 501, as the gateway forwards bodies de-chunked and could not pass them on.
///   Either way, a request whose body another server would read differently never executes: the
///   classic request-smuggling disagreement.
/// - Host (RFC 9112 §3.2): an HTTP/1.1 request without one, with more than one, or with one that
///   is not a host[:port], 400.
/// - CONNECT: 501; a reverse proxy opens no tunnels.
std::optional<HeadDefect> check_request_head(const HeadFacts& head);

}  // namespace idem::http
