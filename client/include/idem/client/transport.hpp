#pragma once

#include <cstdint>
#include <expected>
#include <string>
#include <string_view>

#include "idem/client/http.hpp"
#include "idem/clock.hpp"

namespace idem::client {

/// Why an attempt got no HTTP answer. Each code says whether the server may have seen the request.
enum class TransportErrc : std::uint8_t {
  /// Nothing was sent: DNS failure, connection refused, connect or TLS handshake timeout.
  could_not_connect,
  /// The request was (maybe partly) sent and no complete answer came back: dropped connection,
  /// reset, timeout while waiting. The server may have executed it — retry with the same key.
  no_answer,
  /// A retry cannot help until something changes: malformed URL, unsupported scheme, TLS
  /// certificate rejected, response above the size limit.
  failed,
};

/// "could_not_connect", "no_answer" or "failed".
std::string_view to_string(TransportErrc code);

/// An attempt that ended without an HTTP answer.
struct TransportError {
  TransportErrc code = TransportErrc::no_answer;
  std::string message;  ///< one line for logs, e.g. "curl: Couldn't connect to server (7)"

  /// Whether the same request may get an answer if tried again.
  bool retryable() const { return code != TransportErrc::failed; }
  /// Whether the server may have received (and acted on) the request.
  bool in_doubt() const { return code != TransportErrc::could_not_connect; }
};

/// Sends one request and waits for its answer. Implementations must be safe to call from several
/// threads at once. They never retry on their own: retrying is the Client's job.
class Transport {
 public:
  virtual ~Transport() = default;
  /// One attempt, given at most `timeout` from start to the last body byte.
  virtual std::expected<HttpResponse, TransportError> perform(const HttpRequest& request, Millis timeout) = 0;
};

}  // namespace idem::client
