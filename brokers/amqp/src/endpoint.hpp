#pragma once

// The Endpoint (connection.hpp) of a parsed URL.

#include <string>
#include <string_view>

#include "connection.hpp"
#include "idem/amqp_broker.hpp"

namespace idem::amqp_detail {

/// Where `url` points, for a connection shown to RabbitMQ as `connection_name`; `where` (the
/// redacted URL) prefixes its errors.
inline Endpoint endpoint_for(const AmqpUrl& url, std::string where, Millis connect_timeout, std::string connection_name) {
  Endpoint e;
  e.host = url.host;
  e.port = url.port;
  e.user = url.user;
  e.password = url.password;
  e.vhost = url.vhost;
  e.heartbeat = url.heartbeat;
  e.connect_timeout = connect_timeout;
  e.connection_name = std::move(connection_name);
  e.where = std::move(where);
  e.tls = url.tls;
  e.ca_file = url.ca_file;
  e.cert_file = url.cert_file;
  e.key_file = url.key_file;
  e.key_passphrase_file = url.key_passphrase_file;
  return e;
}

}  // namespace idem::amqp_detail
