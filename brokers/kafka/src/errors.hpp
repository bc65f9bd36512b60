#pragma once

// Every way a librdkafka call can fail, and the one function that turns it into a BrokerError.
// The code is a plain int here (an rd_kafka_resp_err_t) so that this header needs no rdkafka.h;
// errors.cpp names the codes with rdkafka.h's constants.

#include <string>

#include "idem/broker.hpp"

namespace idem::kafka_detail {

/// What went wrong, before it becomes a BrokerError.
struct Failure {
  int code = 0;             ///< an rd_kafka_resp_err_t
  std::string detail;       ///< librdkafka's own words about it (error_cb's reason, a message's errstr), if any
  std::string doing;        ///< "publishing to topic orders", "committing offsets", "connecting"
  std::string topic;        ///< the topic concerned, for the unknown-topic message
  std::string user;         ///< the SASL user, for the login message
  std::string where;        ///< the redacted URL, prefixed to the message
  bool fatal = false;       ///< librdkafka raised a fatal error: this handle can do nothing more
  bool maybe_sent = false;  ///< a produce whose outcome is unknown (rd_kafka_message_status said
                            ///< possibly persisted, or no report came in time)
};

/// The one mapping from a librdkafka error to the broker error model:
///   _TRANSPORT, _ALL_BROKERS_DOWN, _RESOLVE, _QUEUE_FULL, leaders and coordinators moving or
///   loading, not enough in-sync replicas, storage errors, a rebalance in progress, quotas -> unavailable
///   _MSG_TIMED_OUT, _TIMED_OUT, REQUEST_TIMED_OUT                           -> timeout
///   authentication (_AUTHENTICATION, SASL_AUTHENTICATION_FAILED, unsupported
///   mechanism), authorization (topic, group, cluster: an ACL), TLS (_SSL),
///   unknown topic or partition, invalid topic or group, a broker too old    -> refused
///   a message too large, invalid, or refused by policy                       -> rejected
///   ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID,
///   _ASSIGNMENT_LOST (the group moved on without this consumer)              -> stale
///   _INVALID_ARG, INVALID_CONFIG, INVALID_SESSION_TIMEOUT                    -> invalid
///   a fatal error, anything else                                             -> internal
/// in_doubt: `maybe_sent` and the outcome is not known (unavailable, timeout, internal). The
/// message is one sentence an operator can act on; it never holds a password.
BrokerError map_error(const Failure& failure);

}  // namespace idem::kafka_detail
