#pragma once

// Internal to idem-gateway: HTTP/2 messages as the rest of the gateway sees them, without a
// socket (h2_session.cpp drives them over a connection; fuzz/h2_fuzz.cpp over bytes alone). A
// request stream's fields and DATA become the HTTP/1.1-shaped request the Handler takes; a
// response becomes HTTP/2 header fields, its trailers apart.

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <nghttp2/nghttp2.h>

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "idem/http/beast.hpp"
#include "idem/problem.hpp"

namespace idem::gateway {

namespace bhttp = boost::beast::http;

/// A request stream as it arrives.
struct H2Request {
  http::Request req;
  std::string authority;  // :authority
  std::string cookies;    // the cookie fields, joined
  std::size_t header_bytes = 0;
  std::size_t body_limit = 0;
  bool header_too_large = false;  // the decoded header list exceeded max_header: answer 431
  bool body_too_large = false;    // the body exceeds body_limit: answer 413

  /// One decoded field of the request's HEADERS (not of its trailers, which are only counted).
  /// Past `max_header` bytes (HTTP/2's measure: name, value and 32 per field) nothing more is
  /// kept, and the request is answered 431.
  void add_field(std::string_view name, std::string_view value, bool trailer, std::size_t max_header);
  /// A DATA chunk; false (and the body dropped) once the body exceeds body_limit.
  bool add_data(std::string_view data);
  /// The Content-Length it declares, when it declares a valid one.
  std::optional<std::uint64_t> declared_length() const;
  /// Makes `req` the request the Handler and an HTTP/1.1 upstream see (Host from :authority, one
  /// Cookie, a Content-Length for the body as received), or says why it is refused: a Host that
  /// differs from :authority, or what http::check_request_head refuses (CONNECT, a bad host).
  std::optional<Problem> finish();
};

/// An nghttp2 header field pointing at `name` and `value` (nghttp2 copies them when submitted).
nghttp2_nv make_nv(std::string_view name, std::string_view value);

/// Appends the frames nghttp2 has ready to `out` until it holds `limit` bytes or none are left;
/// false when nghttp2 failed (the session is unusable).
bool take_frames(nghttp2_session* session, std::string& out, std::size_t limit);

/// A field name as HTTP/2 writes it, in lower case: `name` itself when it has no upper-case
/// letter (an HTTP/2 peer's fields, most of them), else a lowered copy kept in `storage` (which
/// the caller reserved, so that earlier copies do not move).
std::string_view lowercase_name(std::string_view name, std::vector<std::string>& storage);

/// Fields HTTP/2 forbids: connection-specific ones (RFC 9113, 8.2.2).
bool is_connection_specific(std::string_view name);

/// A response head as HTTP/2 fields: :status, then each field, its name in lower case, without the
/// connection-specific ones. `status_text` and `names` keep the bytes the fields point into.
/// Fields named "trailer:NAME" (an HTTP/2 upstream's trailers, grpc.hpp) go to `trailers` as NAME.
std::vector<nghttp2_nv> response_fields(const bhttp::fields& fields, unsigned status, std::string& status_text,
                                        std::vector<std::string>& names,
                                        std::vector<std::pair<std::string, std::string>>& trailers);

/// A problem as a gRPC call's "trailers-only" answer (docs/gateway.md, gRPC).
http::Response grpc_answer(const Problem& problem);

/// What becomes of a key after an upstream's gRPC answer (its grpc-status; none valid counts as
/// INTERNAL): stored; not stored, for the retry to execute (a status in `retryable`: bit N for
/// status N); or, for DEADLINE_EXCEEDED not listed there, left in progress like a gateway timeout.
enum class GrpcRecord { store, retryable, leave_in_progress };
GrpcRecord grpc_record_for(const bhttp::fields& fields, std::uint32_t retryable);

}  // namespace idem::gateway
