#pragma once

// One connection to one Redis node: hiredis's redisContext behind RAII. The only file that
// includes hiredis is connection.cpp. Shared by the Redis store (stores/redis) and the Redis
// Streams broker (brokers/redis_streams); not installed.

#include <expected>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "idem/clock.hpp"
#include "idem/redis_wire/failure.hpp"
#include "idem/redis_wire/reply.hpp"
#include "idem/redis_wire/url.hpp"

struct redisContext;

namespace idem::redis_detail {

/// How to open a connection.
struct ConnectSettings {
  Millis connect_timeout{1000};
  Millis command_timeout{1000};  ///< for AUTH/SELECT, and every call() of a blocking connection
  std::string user;
  std::string password;
  int db = 0;
};

/// Blocks SIGPIPE on the calling thread for good. hiredis writes without MSG_NOSIGNAL, so a write
/// to a connection the server has closed (a Redis restart) raises SIGPIPE, which kills a process
/// that does not ignore it, as a library user's may not (idem-gateway does). Blocked, the write
/// fails with EPIPE and the connection is reopened. For a module's own threads.
void block_sigpipe_on_this_thread();

/// A connected, authenticated socket to one node. Its writes never raise SIGPIPE: on a thread
/// that did not call block_sigpipe_on_this_thread (a caller's own thread), each write
/// blocks SIGPIPE for its duration and consumes one it raised.
class Connection {
 public:
  /// Connects (TCP, keepalive, no Nagle), then AUTH and SELECT as configured. A `nonblocking`
  /// connection is then switched to non-blocking I/O for a node's event loop (append / flush /
  /// read / next_reply); a blocking one serves call().
  static std::expected<Connection, Failure> open(const Address& address, const ConnectSettings& settings,
                                                 bool nonblocking);

  Connection(Connection&&) noexcept;
  Connection& operator=(Connection&&) noexcept;
  ~Connection();

  /// The socket, for poll().
  int fd() const;

  /// Blocking connections: sends one command and waits (up to command_timeout) for its reply.
  std::expected<Reply, Failure> call(const std::vector<std::string>& args);

  /// Queues a command in the output buffer (nothing is written yet).
  void append(const std::vector<std::string>& args);
  /// Writes as much of the output buffer as the socket takes; true once it is empty.
  std::expected<bool, Failure> flush();
  /// Reads what has arrived into the reply parser; a failure means the connection is dead.
  std::expected<void, Failure> read();
  /// The next complete reply read so far, if any.
  std::expected<std::optional<Reply>, Failure> next_reply();

 private:
  struct Free {
    void operator()(redisContext* c) const;
  };
  Connection(std::unique_ptr<redisContext, Free> ctx, Address address);
  Failure failure(Failure::Kind kind) const;

  std::unique_ptr<redisContext, Free> ctx_;
  Address address_;
};

}  // namespace idem::redis_detail
