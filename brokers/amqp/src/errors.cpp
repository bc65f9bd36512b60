#include "errors.hpp"

#include <amqp.h>
#include <amqp_framing.h>

#include <cstring>

namespace idem::amqp_detail {
namespace {

bool contains(const std::string& text, const char* part) { return text.find(part) != std::string::npos; }

std::string prefix(const Failure& f) {
  std::string out = f.where.empty() ? std::string("rabbitmq") : f.where;
  if (!f.doing.empty()) out += ": " + f.doing;
  return out + ": ";
}

BrokerError make(const Failure& f, BrokerErrc code, const std::string& text) {
  const bool unknown_outcome = code == BrokerErrc::unavailable || code == BrokerErrc::timeout || code == BrokerErrc::internal;
  return BrokerError{code, prefix(f) + text, f.sent && unknown_outcome};
}

std::string library_words(const Failure& f) {
  std::string words = amqp_error_string2(f.status);
  if (f.sys_errno != 0 && (f.status == AMQP_STATUS_SOCKET_ERROR || f.status == AMQP_STATUS_TCP_ERROR)) {
    words += std::string(": ") + std::strerror(f.sys_errno);
  }
  return words;
}

BrokerError from_library(const Failure& f) {
  if (f.tls_verify_failed) {
    // Retrying cannot help until the certificate or cacertfile= is fixed: an operator's matter,
    // never a reason to connect without verification.
    return make(f, BrokerErrc::refused, "TLS: RabbitMQ's certificate was not accepted: " +
                                            (f.tls_detail.empty() ? library_words(f) : f.tls_detail) +
                                            " (check cacertfile= and the URL's host name)");
  }
  switch (f.status) {
    case AMQP_STATUS_SSL_ERROR:
    case AMQP_STATUS_SSL_CONNECTION_FAILED:
    case AMQP_STATUS_SSL_PEER_VERIFY_FAILED:
    case AMQP_STATUS_SSL_HOSTNAME_VERIFY_FAILED:
      return make(f, BrokerErrc::unavailable, "TLS handshake with RabbitMQ failed: " +
                                                  (f.tls_detail.empty() ? library_words(f) : f.tls_detail) +
                                                  " (is it RabbitMQ's TLS port? does it accept our certificate?)");
    default:
      break;
  }
  switch (f.status) {
    case AMQP_STATUS_CONNECTION_CLOSED:
    case AMQP_STATUS_SOCKET_CLOSED:
      if (f.during_login) {
        return make(f, BrokerErrc::unavailable,
                    "RabbitMQ closed the connection during the login (is it starting or stopping?): " + library_words(f));
      }
      return make(f, BrokerErrc::unavailable, "the connection to RabbitMQ was lost: " + library_words(f));
    case AMQP_STATUS_SOCKET_ERROR:
    case AMQP_STATUS_TCP_ERROR:
    case AMQP_STATUS_TCP_SOCKETLIB_INIT_ERROR:
    case AMQP_STATUS_HOSTNAME_RESOLUTION_FAILED:
    case AMQP_STATUS_HEARTBEAT_TIMEOUT:
      return make(f, BrokerErrc::unavailable, "cannot reach RabbitMQ: " + library_words(f));
    case AMQP_STATUS_TIMEOUT:
      return make(f, BrokerErrc::timeout, "RabbitMQ did not answer in time");
    case AMQP_STATUS_TABLE_TOO_BIG:
      return make(f, BrokerErrc::rejected, "the message's headers do not fit in one AMQP frame");
    case AMQP_STATUS_BROKER_UNSUPPORTED_SASL_METHOD:
      return make(f, BrokerErrc::refused, "RabbitMQ does not offer the PLAIN login mechanism: enable it (auth_mechanisms)");
    default:
      return make(f, BrokerErrc::internal, "unexpected librabbitmq failure: " + library_words(f));
  }
}

BrokerError from_close(const Failure& f) {
  const std::string& text = f.reply_text;
  const bool channel = f.kind == Failure::Kind::channel_close;
  switch (f.reply_code) {
    case AMQP_CONNECTION_FORCED:
      return make(f, BrokerErrc::unavailable, "RabbitMQ closed the connection (shutting down, or closed by an operator): " + text);
    case AMQP_RESOURCE_ERROR:
      return make(f, BrokerErrc::unavailable, "RabbitMQ is short of resources: " + text);
    case AMQP_ACCESS_REFUSED:
      // connection.open is part of the login too: a user without rights on the vhost is told
      // so, not sent to check a password that was right.
      if (contains(text, "access to vhost")) {
        return make(f, BrokerErrc::refused, "RabbitMQ refused user " + f.user + " access to vhost " + f.vhost +
                                                ": grant it permissions there (rabbitmqctl set_permissions): " + text);
      }
      if (f.during_login || contains(text, "Login was refused")) {
        return make(f, BrokerErrc::refused, "RabbitMQ refused the login for user " + f.user + ": check the user and password");
      }
      return make(f, BrokerErrc::refused, "RabbitMQ refused access: " + text + " (check user " + f.user + "'s permissions)");
    case AMQP_NOT_FOUND:
      return make(f, BrokerErrc::refused, "RabbitMQ has no such queue or exchange: " + text + " (declare it, or use declare=true)");
    case AMQP_RESOURCE_LOCKED:
      return make(f, BrokerErrc::refused, "RabbitMQ refused: " + text + " (an exclusive queue or consumer of another connection)");
    case AMQP_PRECONDITION_FAILED:
      if (contains(text, "message size") || contains(text, "max size")) {
        return make(f, BrokerErrc::rejected, "the message is larger than RabbitMQ accepts (max_message_size): " + text);
      }
      if (contains(text, "inequivalent arg")) {
        return make(f, BrokerErrc::refused, "a queue or exchange of that name exists with other arguments: " + text +
                                                " (use its arguments, another name, or declare=false)");
      }
      return make(f, BrokerErrc::refused, "RabbitMQ refused: " + text);
    case AMQP_NOT_ALLOWED:
      if (contains(text, "vhost") && contains(text, "not found")) {
        return make(f, BrokerErrc::refused, "RabbitMQ has no vhost " + f.vhost +
                                                ": create it (rabbitmqctl add_vhost) or fix the URL's path: " + text);
      }
      return make(f, BrokerErrc::refused, "RabbitMQ does not allow it: " + text);
    case AMQP_CONTENT_TOO_LARGE:
      return make(f, BrokerErrc::rejected, "the message is larger than RabbitMQ accepts: " + text);
    case AMQP_FRAME_ERROR:
      if (contains(text, "frame_too_large") || contains(text, "too large")) {
        return make(f, BrokerErrc::rejected, "a frame was larger than RabbitMQ's frame_max: " + text);
      }
      break;
    default:
      break;
  }
  return make(f, BrokerErrc::internal, std::string("RabbitMQ closed the ") + (channel ? "channel" : "connection") + ": " +
                                           std::to_string(f.reply_code) + " " + text);
}

}  // namespace

BrokerError map_error(const Failure& f) {
  switch (f.kind) {
    case Failure::Kind::library:
      return from_library(f);
    case Failure::Kind::connection_close:
    case Failure::Kind::channel_close:
      return from_close(f);
    case Failure::Kind::heartbeat:
      return make(f, BrokerErrc::unavailable, "nothing came from RabbitMQ for 1.5 heartbeat intervals (three heartbeats missed): the connection is dead");
    case Failure::Kind::returned:
      return make(f, BrokerErrc::rejected,
                  "no queue is bound for routing key \"" + f.routing_key + "\" " +
                      (f.exchange.empty() ? std::string("on the default exchange") : "on exchange \"" + f.exchange + "\"") +
                      " (RabbitMQ returned it: " + std::to_string(f.reply_code) + " " + f.reply_text + ")");
    case Failure::Kind::nacked:
      return make(f, BrokerErrc::rejected,
                  "RabbitMQ did not take the message (basic.nack: a queue refused it, e.g. overflow=reject-publish)");
    case Failure::Kind::cancelled:
      return make(f, BrokerErrc::unavailable, "RabbitMQ cancelled the consumer (was the queue deleted?)");
    case Failure::Kind::protocol:
      return make(f, BrokerErrc::internal, "unexpected frames from RabbitMQ: " + f.reply_text);
    case Failure::Kind::tls_files:
      return make(f, BrokerErrc::invalid, f.reply_text);
  }
  return make(f, BrokerErrc::internal, f.reply_text);
}

}  // namespace idem::amqp_detail
