#pragma once

// What the source and the sink share about the server their URL names: its address, how to log
// in, and how errors leave them (never with a secret of the URL in them).

#include <string>
#include <string_view>

#include "idem/broker.hpp"
#include "idem/redact.hpp"
#include "idem/redis_stream_broker.hpp"
#include "idem/redis_wire/connection.hpp"

namespace idem::redis_streams {

/// The server, its login and database, from a parsed URL.
struct Endpoint {
  redis_detail::Address address;
  redis_detail::ConnectSettings settings;
  std::string name;     ///< the URL with its password hidden (redact_url): name() and messages
  std::string raw_url;  ///< kept only to scrub its secrets out of messages

  Endpoint(const RedisStreamUrl& url, std::string_view raw, Millis connect_timeout)
      : address{url.host, url.port}, name(redact_url(raw)), raw_url(raw) {
    settings.connect_timeout = connect_timeout;
    settings.command_timeout = connect_timeout;
    settings.user = url.user;
    settings.password = url.password;
    settings.db = url.db;
  }

  /// An error as it leaves the module: prefixed with the source's or sink's name and scrubbed of
  /// the URL's secrets, a second line of defence behind messages built without them.
  BrokerError outgoing(BrokerError error) const {
    error.message = scrub_secrets(name + ": " + error.message, raw_url);
    return error;
  }
};

}  // namespace idem::redis_streams
