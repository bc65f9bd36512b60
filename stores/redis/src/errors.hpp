#pragma once

// Every way a Redis call can fail, and the one function that turns it into a StoreError.

#include <optional>
#include <string>
#include <string_view>

#include "idem/result.hpp"
#include "url.hpp"

namespace idem::redis_detail {

/// What went wrong, before it becomes a StoreError.
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

/// The one mapping from a Redis failure to the store's error model:
///   connect / down / io / closing / no_route / retries / redirects  -> unavailable
///   wrong_kind (redis:// naming a cluster node)                     -> unavailable
///   replication (WAIT fell short; the write stands on the master)   -> unavailable, in doubt
///   connect_timeout / timeout                                       -> timeout
///   reply: LOADING, CLUSTERDOWN, TRYAGAIN, MASTERDOWN, READONLY, BUSY, OOM, NOAUTH,
///          WRONGPASS, NOPERM (after retries where they apply)        -> unavailable
///   reply: WRONGTYPE, IDEMCORRUPT (a foreign value under our prefix)  -> corrupt
///   reply: anything else (script errors, NOSCRIPT after EVAL, ...)    -> internal
///   protocol                                                        -> internal
/// `in_doubt` is set when the command may have been executed anyway: a connection that broke
/// or timed out after the command was written (io, timeout, protocol).
StoreError map_error(const Failure& failure);

/// What a node does with an error reply before (or instead of) reporting it.
enum class ErrorAction : std::uint8_t {
  report,    ///< final: map_error and hand it to the caller
  moved,     ///< the slot lives elsewhere for good: update the map, resend there
  ask,       ///< the key is being migrated: resend there once, preceded by ASKING
  retry,     ///< transient: resend after a delay, a bounded number of times
  noscript,  ///< the node lacks the script: resend as EVAL
};

/// Classifies an error reply by its first word.
ErrorAction classify_error_reply(std::string_view text);

/// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381" -> slot and node (host empty for
/// "MOVED 3999 :6381", meaning the host the reply came from).
struct Redirect {
  int slot = 0;
  Address to;
};
std::optional<Redirect> parse_redirect(std::string_view text);

}  // namespace idem::redis_detail
