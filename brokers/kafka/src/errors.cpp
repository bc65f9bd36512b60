#include "errors.hpp"

#include <librdkafka/rdkafka.h>

namespace idem::kafka_detail {
namespace {

std::string prefix(const Failure& f) {
  std::string out = f.where.empty() ? std::string("kafka") : f.where;
  if (!f.doing.empty()) out += ": " + f.doing;
  return out + ": ";
}

// librdkafka's name and words for the code, plus its detail when that says more.
std::string library_words(const Failure& f) {
  const auto code = static_cast<rd_kafka_resp_err_t>(f.code);
  std::string words = std::string(rd_kafka_err2name(code)) + " (" + rd_kafka_err2str(code) + ")";
  if (!f.detail.empty() && f.detail != rd_kafka_err2str(code)) words += ": " + f.detail;
  return words;
}

BrokerError make(const Failure& f, BrokerErrc code, const std::string& text) {
  const bool unknown_outcome = code == BrokerErrc::unavailable || code == BrokerErrc::timeout || code == BrokerErrc::internal;
  return BrokerError{code, prefix(f) + text, f.maybe_sent && unknown_outcome};
}

std::string topic_name(const Failure& f) { return f.topic.empty() ? std::string("the topic") : "topic \"" + f.topic + "\""; }

}  // namespace

BrokerError map_error(const Failure& f) {
  if (f.fatal) {
    return make(f, BrokerErrc::internal, "librdkafka raised a fatal error, the client must be recreated: " + library_words(f));
  }
  switch (static_cast<rd_kafka_resp_err_t>(f.code)) {
    case RD_KAFKA_RESP_ERR__TRANSPORT:
    case RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN:
    case RD_KAFKA_RESP_ERR__RESOLVE:
    case RD_KAFKA_RESP_ERR_BROKER_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NETWORK_EXCEPTION:
      return make(f, BrokerErrc::unavailable, "cannot reach the Kafka cluster: " + library_words(f));
    case RD_KAFKA_RESP_ERR__QUEUE_FULL:
      return make(f, BrokerErrc::unavailable, "librdkafka's send queue is full (the cluster is not keeping up): " + library_words(f));
    case RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION:
    case RD_KAFKA_RESP_ERR_REPLICA_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_FENCED_LEADER_EPOCH:
    case RD_KAFKA_RESP_ERR_UNKNOWN_LEADER_EPOCH:
    case RD_KAFKA_RESP_ERR_PREFERRED_LEADER_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_ELIGIBLE_LEADERS_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_OFFSET_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR__NODE_UPDATE:
      return make(f, BrokerErrc::unavailable, "a partition leader is moving or unavailable: " + library_words(f));
    case RD_KAFKA_RESP_ERR_COORDINATOR_LOAD_IN_PROGRESS:
    case RD_KAFKA_RESP_ERR_COORDINATOR_NOT_AVAILABLE:
    case RD_KAFKA_RESP_ERR_NOT_COORDINATOR:
    case RD_KAFKA_RESP_ERR__WAIT_COORD:
      return make(f, BrokerErrc::unavailable, "the group coordinator is moving or loading: " + library_words(f));
    case RD_KAFKA_RESP_ERR_REBALANCE_IN_PROGRESS:
      return make(f, BrokerErrc::unavailable, "the consumer group is rebalancing: " + library_words(f));
    case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS:
    case RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND:
    case RD_KAFKA_RESP_ERR__ISR_INSUFF:
      return make(f, BrokerErrc::unavailable, "too few in-sync replicas to take the message (min.insync.replicas): " + library_words(f));
    case RD_KAFKA_RESP_ERR_KAFKA_STORAGE_ERROR:
    case RD_KAFKA_RESP_ERR_THROTTLING_QUOTA_EXCEEDED:
    case RD_KAFKA_RESP_ERR__RETRY:
    case RD_KAFKA_RESP_ERR__PURGE_QUEUE:
    case RD_KAFKA_RESP_ERR__PURGE_INFLIGHT:
    case RD_KAFKA_RESP_ERR__DESTROY:
      return make(f, BrokerErrc::unavailable, "Kafka could not take it now: " + library_words(f));

    case RD_KAFKA_RESP_ERR__MSG_TIMED_OUT:
    case RD_KAFKA_RESP_ERR__TIMED_OUT:
    case RD_KAFKA_RESP_ERR__TIMED_OUT_QUEUE:
    case RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT:
      return make(f, BrokerErrc::timeout, "Kafka did not answer in time: " + library_words(f));

    case RD_KAFKA_RESP_ERR__AUTHENTICATION:
    case RD_KAFKA_RESP_ERR_SASL_AUTHENTICATION_FAILED:
    case RD_KAFKA_RESP_ERR_ILLEGAL_SASL_STATE:
    case RD_KAFKA_RESP_ERR_UNACCEPTABLE_CREDENTIAL:
      return make(f, BrokerErrc::refused,
                  "the Kafka cluster refused the login" + (f.user.empty() ? std::string() : " for user " + f.user) +
                      ": check the user, password and sasl_mechanism: " + library_words(f));
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_SASL_MECHANISM:
      return make(f, BrokerErrc::refused, "the Kafka cluster does not offer this SASL mechanism (sasl_mechanism): " + library_words(f));
    case RD_KAFKA_RESP_ERR__SSL:
      return make(f, BrokerErrc::refused, "TLS with the Kafka cluster failed (check ssl_ca_location and the client certificate): " +
                                              library_words(f));
    case RD_KAFKA_RESP_ERR_SECURITY_DISABLED:
      return make(f, BrokerErrc::refused, "the Kafka cluster has security disabled: use security_protocol=plaintext: " + library_words(f));
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
      return make(f, BrokerErrc::refused, "no access to " + topic_name(f) + " (a Kafka ACL): " + library_words(f));
    case RD_KAFKA_RESP_ERR_GROUP_AUTHORIZATION_FAILED:
      return make(f, BrokerErrc::refused, "no access to the consumer group (a Kafka ACL): " + library_words(f));
    case RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED:
      return make(f, BrokerErrc::refused,
                  "the Kafka cluster refused a cluster-wide operation (an idempotent producer needs the IdempotentWrite ACL): " +
                      library_words(f));
    case RD_KAFKA_RESP_ERR_TRANSACTIONAL_ID_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_DELEGATION_TOKEN_AUTHORIZATION_FAILED:
      return make(f, BrokerErrc::refused, "the Kafka cluster refused access: " + library_words(f));
    case RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC:
    case RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART:
      return make(f, BrokerErrc::refused,
                  topic_name(f) + " does not exist on the Kafka cluster: create it (idem never creates topics): " + library_words(f));
    case RD_KAFKA_RESP_ERR__UNKNOWN_PARTITION:
      return make(f, BrokerErrc::refused, topic_name(f) + " has no such partition: " + library_words(f));
    case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
      return make(f, BrokerErrc::refused, "Kafka refuses the topic name: " + library_words(f));
    case RD_KAFKA_RESP_ERR_INVALID_GROUP_ID:
      return make(f, BrokerErrc::refused, "Kafka refuses the group name: " + library_words(f));
    case RD_KAFKA_RESP_ERR_INCONSISTENT_GROUP_PROTOCOL:
      return make(f, BrokerErrc::refused,
                  "another member of the consumer group uses a different partition assignment strategy: " + library_words(f));
    case RD_KAFKA_RESP_ERR_GROUP_MAX_SIZE_REACHED:
      return make(f, BrokerErrc::refused, "the consumer group is full (group.max.size): " + library_words(f));
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_VERSION:
    case RD_KAFKA_RESP_ERR__UNSUPPORTED_FEATURE:
      return make(f, BrokerErrc::refused, "the Kafka brokers are too old for this client (idempotent producers need 0.11+): " +
                                              library_words(f));

    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
      return make(f, BrokerErrc::rejected, "the message is larger than Kafka accepts (message.max.bytes, max.message.bytes): " +
                                               library_words(f));
    case RD_KAFKA_RESP_ERR_INVALID_MSG:
    case RD_KAFKA_RESP_ERR_INVALID_RECORD:
    case RD_KAFKA_RESP_ERR_INVALID_TIMESTAMP:
    case RD_KAFKA_RESP_ERR_UNSUPPORTED_FOR_MESSAGE_FORMAT:
    case RD_KAFKA_RESP_ERR_POLICY_VIOLATION:
      return make(f, BrokerErrc::rejected, "Kafka refused the message: " + library_words(f));

    case RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION:
    case RD_KAFKA_RESP_ERR_UNKNOWN_MEMBER_ID:
    case RD_KAFKA_RESP_ERR_FENCED_INSTANCE_ID:
    case RD_KAFKA_RESP_ERR__ASSIGNMENT_LOST:
      return make(f, BrokerErrc::stale,
                  "the consumer group moved on without this consumer (its partitions went to others, who deliver their "
                  "messages again): " + library_words(f));

    case RD_KAFKA_RESP_ERR__INVALID_ARG:
    case RD_KAFKA_RESP_ERR_INVALID_CONFIG:
    case RD_KAFKA_RESP_ERR_INVALID_SESSION_TIMEOUT:
    case RD_KAFKA_RESP_ERR__NOT_CONFIGURED:
      return make(f, BrokerErrc::invalid, "a setting Kafka does not accept: " + library_words(f));

    case RD_KAFKA_RESP_ERR__FATAL:
      return make(f, BrokerErrc::internal, "librdkafka raised a fatal error, the client must be recreated: " + library_words(f));
    default:
      break;
  }
  return make(f, BrokerErrc::internal, "unexpected librdkafka failure: " + library_words(f));
}

}  // namespace idem::kafka_detail
