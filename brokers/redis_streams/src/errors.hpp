#pragma once

// The one function that turns a Redis failure (the wire layer's Failure, error replies included)
// into a BrokerError.

#include <string_view>

#include "idem/broker.hpp"
#include "idem/redis_wire/failure.hpp"

namespace idem::redis_streams {

/// What the failed command was, for the message and for in_doubt.
struct ErrorContext {
  std::string_view key;  ///< the stream the command was about ("KEY is not a stream")
  /// Whether the command appends (XADD): a reply lost after it was sent leaves it in doubt.
  bool appends = false;
};

/// The mapping:
///   connect, down, io (the connection broke)                   -> unavailable
///   connect: AUTH refused (WRONGPASS, ...), SELECT refused      -> refused
///   connect_timeout, timeout                                    -> timeout
///   reply LOADING, MASTERDOWN, BUSY, TRYAGAIN, CLUSTERDOWN,
///         READONLY, MISCONF, NOREPLICAS, OOM, NOGROUP, UNBLOCKED -> unavailable
///   reply NOAUTH, WRONGPASS                                     -> refused: check the user and password
///   reply NOPERM                                                -> refused: the user's ACL
///   reply MOVED, ASK, CROSSSLOT (a Redis Cluster node)          -> refused: streams need a standalone Redis
///   reply WRONGTYPE                                             -> refused: KEY is not a stream
///   protocol, any other reply                                   -> internal
/// in_doubt: io, timeout and protocol of an appending command (its reply was lost, not refused).
/// OOM and NOGROUP are retryable: Redis refused the command before running it (memory may be
/// freed by trimming or consumers; a group that vanished, or a stream deleted under a blocked
/// read (UNBLOCKED), is created again by the source).
/// Messages name the node and the key, never a password.
BrokerError map_error(const redis_detail::Failure& failure, const ErrorContext& context);

/// An error reply as a Failure of `node`, for map_error.
redis_detail::Failure reply_failure(std::string_view reply_text, std::string_view node);

/// The first word of an error reply ("NOGROUP No such key ..." -> "NOGROUP").
std::string_view error_code(std::string_view reply_text);

}  // namespace idem::redis_streams
