#pragma once

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <boost/beast/http/fields.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/string_body.hpp>

#include <string>
#include <string_view>
#include <vector>

#include "idem/error_envelope.hpp"
#include "idem/http_view.hpp"
#include "idem/problem.hpp"
#include "idem/record.hpp"

namespace idem::http {

namespace bhttp = boost::beast::http;

/// The request type idem reads whole (bounded by the body limit) before deciding.
using Request = bhttp::request<bhttp::string_body>;
/// The response type idem answers with when it answers itself (problems, replays).
using Response = bhttp::response<bhttp::string_body>;

/// The core's RequestView of a Beast request. Keeps the header array the view borrows, so one
/// instance can be reused for every request of a connection without allocating again.
class BeastRequestView {
 public:
  /// Points the view at `request`, which must outlive the view's use and stay unmodified
  /// while it is used.
  const RequestView& assign(const Request& request);
  /// The view of the last assigned request.
  const RequestView& view() const { return view_; }
  /// Its headers, in order.
  std::span<const HeaderView> headers() const { return view_.headers; }

 private:
  std::vector<HeaderView> headers_;
  RequestView view_;
};

/// The response for a problem: application/problem+json body, Retry-After when the problem has
/// one, X-Idempotency-Conflict: true for conflicts, Cache-Control: no-store.
Response problem_response(const Problem& problem, unsigned version, bool keep_alive);

/// The same response with its body in `envelope` (Stripe's error object, a template, ...): the
/// status and every header but Content-Type are those of problem+json, in every style.
Response problem_response(const Problem& problem, const ErrorEnvelope& envelope, unsigned version, bool keep_alive);

/// The response replaying a stored one: same status, same stored headers in the same order,
/// same body bytes, a recomputed Content-Length, plus Idempotent-Replayed: true.
Response replay_response(const StoredResponse& stored, unsigned version, bool keep_alive);

/// What is stored of a response: its status, the headers is_stored() accepts (end-to-end, no
/// Content-Length, no Idempotent-Replayed) in order, and the body bytes.
StoredResponse to_stored_response(const bhttp::fields& fields, unsigned status, std::string_view body);

/// Appends the message's start line and header fields as they go on the wire, up to and
/// including the blank line. What Beast's serializer writes for a message whose body is framed by
/// Content-Length or absent, in one contiguous buffer instead of one buffer per field: the
/// gateway writes head and body with a single gather write. A chunked message (Transfer-Encoding
/// set) must go through Beast's serializer instead.
void append_head(std::string& out, const bhttp::request_header<>& header);
void append_head(std::string& out, const bhttp::response_header<>& header);

/// Removes the hop-by-hop headers of a message (including those its Connection header names),
/// so that what remains may be forwarded.
void strip_hop_by_hop(bhttp::fields& fields);

}  // namespace idem::http
