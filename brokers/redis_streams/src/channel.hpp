#pragma once

// One non-blocking Redis connection with deadlines: commands are queued, written and answered in
// order, and a wait for the next reply can also end when a wake descriptor becomes readable. The
// source's and the sink's only way to talk to Redis.

#include <chrono>
#include <cstddef>
#include <expected>
#include <string>
#include <vector>

#include "idem/redis_wire/connection.hpp"

namespace idem::redis_streams {

using Steady = std::chrono::steady_clock;

/// What a wait ended with.
struct Event {
  enum class Kind : std::uint8_t {
    reply,    ///< the next reply arrived (`reply`)
    woken,    ///< the wake descriptor became readable first (it is not drained here)
    expired,  ///< the deadline passed first; the reply may still come
  };
  Kind kind = Kind::reply;
  redis_detail::Reply reply;
};

/// A connection whose replies are waited for with a deadline. A Failure from it means the
/// connection is unusable (a reply may be missing, so later ones would be out of step): drop it.
class Channel {
 public:
  /// Connects (and AUTH, SELECT) within settings.connect_timeout.
  static std::expected<Channel, redis_detail::Failure> open(const redis_detail::Address& address,
                                                            const redis_detail::ConnectSettings& settings);

  /// Queues a command; written by the next wait.
  void send(const std::vector<std::string>& args);

  /// Writes what is queued and waits for the next reply until `deadline`, or until `wake_fd`
  /// (when >= 0) is readable. A reply already there wins over a wake.
  std::expected<Event, redis_detail::Failure> wait(Steady::time_point deadline, int wake_fd = -1);

  /// send + wait without a wake; a deadline that passes is a timeout Failure.
  std::expected<redis_detail::Reply, redis_detail::Failure> call(const std::vector<std::string>& args,
                                                                 Steady::time_point deadline);

  /// Commands sent whose replies have not been taken yet.
  std::size_t outstanding() const { return outstanding_; }

  /// "host:port", for messages.
  const std::string& node() const { return node_; }

 private:
  Channel(redis_detail::Connection connection, std::string node);

  redis_detail::Connection connection_;
  std::string node_;
  std::size_t outstanding_ = 0;
  bool unflushed_ = false;
};

}  // namespace idem::redis_streams
