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
  return e;
}

}  // namespace idem::amqp_detail
