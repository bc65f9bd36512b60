#pragma once

// Every way an AMQP call can fail, and the one function that turns it into a BrokerError.
// Plain ints here (librabbitmq statuses, AMQP reply codes) so that the mapping is unit-tested
// without a connection; errors.cpp names them with amqp.h's constants.

#include <cstdint>
#include <string>

#include "idem/broker.hpp"

namespace idem::amqp_detail {

/// What went wrong, before it becomes a BrokerError.
struct Failure {
  enum class Kind : std::uint8_t {
    library,           ///< librabbitmq returned `status` (an amqp_status_enum; socket errors carry `sys_errno`)
    connection_close,  ///< the broker closed the connection: connection.close `reply_code` `reply_text`
    channel_close,     ///< the broker closed the channel: channel.close `reply_code` `reply_text`
    heartbeat,         ///< nothing came from the broker for 1.5 heartbeat intervals
    returned,          ///< a mandatory publish came back (basic.return `reply_code` `reply_text`)
    nacked,            ///< the broker answered a publish with basic.nack
    cancelled,         ///< the broker cancelled our consumer (basic.cancel: the queue was deleted)
    protocol,          ///< frames out of order (a header without a deliver, a short body...)
    tls_files,         ///< amqps://: a CA, certificate or key file cannot be used (`reply_text` says why)
  };
  Kind kind = Kind::library;
  int status = 0;
  int sys_errno = 0;
  int reply_code = 0;
  std::string reply_text;
  /// Whether this happened while logging in (start-ok / tune / connection.open): a 403 then is
  /// the password, not a permission.
  bool during_login = false;
  /// A publish had been written when this happened: its outcome is in doubt.
  bool sent = false;
  std::string doing;  ///< "connecting", "declaring queue orders", "publishing to exchange x"
  std::string user;   ///< for login messages
  std::string vhost;  ///< for vhost messages
  std::string exchange;     ///< returned: where the message went
  std::string routing_key;  ///< returned: with which routing key
  std::string where;  ///< the redacted URL, prefixed to the message
  /// amqps://: why the TLS handshake failed, when known: the certificate check that failed
  /// ("certificate verify failed: unable to get local issuer certificate (subject CN=...)"), or
  /// OpenSSL's reason ("wrong version number").
  std::string tls_detail;
  /// The failed handshake was the broker's certificate failing our verification (not the
  /// network, not the broker refusing ours).
  bool tls_verify_failed = false;
};

/// The one mapping from an AMQP failure to the broker error model:
///   library: connection closed/refused/reset, socket errors, host not found,
///            heartbeat timeout                                         -> unavailable
///   library: timeout                                                   -> timeout
///   library: table too big (headers past one frame)                    -> rejected
///   library: broker does not offer SASL PLAIN                          -> refused
///   library: anything else (bad data, unexpected frames, no memory)    -> internal
///   close 320 CONNECTION_FORCED (broker shutting down, operator),
///         506 RESOURCE_ERROR                                           -> unavailable
///   close 403 ACCESS_REFUSED (login or permissions), 404 NOT_FOUND,
///         405 RESOURCE_LOCKED, 406 PRECONDITION_FAILED, 530 NOT_ALLOWED
///         (e.g. no such vhost)                                        -> refused
///   close 406 "message size ... larger than configured max size",
///         311 CONTENT_TOO_LARGE, 501 FRAME_ERROR frame_too_large      -> rejected
///   close anything else (syntax, command invalid, internal error)      -> internal
///   heartbeat, cancelled (consuming again re-declares or reports the queue missing) -> unavailable
///   returned (no queue bound for the routing key), nacked              -> rejected
///   protocol                                                           -> internal
///   tls_files (a CA, certificate or key file unusable, a key file's mode) -> invalid
///   library: TLS handshake failed, the broker's certificate not verified
///            (unknown CA, expired, another host name)                   -> refused
///   library: TLS handshake failed otherwise (not a TLS port, the broker
///            refused our certificate)                                  -> unavailable
/// in_doubt: `sent` and the outcome is not known (unavailable, timeout, internal). The message
/// is a sentence an operator can act on; it never holds the password.
BrokerError map_error(const Failure& failure);

}  // namespace idem::amqp_detail
