#pragma once

// How a Redis call failed, in the wire layer's words: what Connection reports and what each
// module's one error mapping (the store's map_error -> StoreError, the stream broker's ->
// BrokerError) turns into its own error model.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace idem::redis_detail {

/// What went wrong, before a module maps it to its error model. Connection produces connect,
/// connect_timeout, io, timeout and protocol; the others name what a caller above it (the
/// store's nodes and router, a stream source) found.
struct Failure {
  enum class Kind : std::uint8_t {
    connect,          ///< TCP connect, AUTH or SELECT failed (refused, unreachable, wrong password)
    connect_timeout,  ///< the connect did not finish within connect_timeout
    down,             ///< the node failed recently; not tried again until its backoff passes
    io,               ///< the connection broke (reset, EOF) after the command was queued on it
    timeout,          ///< no reply within command_timeout
    protocol,         ///< the server's bytes were not RESP
    reply,            ///< the server answered with an error reply (`detail` is its text)
    retries,          ///< TRYAGAIN/CLUSTERDOWN/LOADING/... persisted past max_retries
    redirects,        ///< more than max_redirects MOVED/ASK
    replication,      ///< WAIT: fewer replicas than wait_replicas acknowledged the write
    no_route,         ///< no node is known to serve the key's slot
    closing,          ///< the store is shutting down
    wrong_kind,       ///< the URL's kind (redis://, redis+cluster://) does not match the server
  };
  Kind kind = Kind::io;
  std::string detail;  ///< hiredis's or the server's words
  std::string node;    ///< "host:port", when one is involved
};

/// A connect that failed because the server refused AUTH or SELECT.
struct HandshakeRefusal {
  std::string_view command;  ///< "AUTH" or "SELECT"
  std::string_view reply;    ///< the server's error reply ("WRONGPASS invalid username-password pair ...")
};

/// The refusal inside a connect failure, if that is what it was (it points into `failure`): lets a
/// mapping tell a refused login from an unreachable server without parsing hiredis's words.
std::optional<HandshakeRefusal> handshake_refusal(const Failure& failure);

}  // namespace idem::redis_detail
