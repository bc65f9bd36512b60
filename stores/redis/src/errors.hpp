#pragma once

// The one function that turns a Redis failure (idem/redis_wire/failure.hpp) into a StoreError,
// and how the store reacts to error replies (redirects, retries).

#include <optional>
#include <string>
#include <string_view>

#include "idem/redis_wire/failure.hpp"
#include "idem/redis_wire/url.hpp"
#include "idem/result.hpp"

namespace idem::redis_detail {

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
