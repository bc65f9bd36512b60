#include "channel.hpp"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace idem::redis_streams {

using redis_detail::Failure;

Channel::Channel(redis_detail::Connection connection, std::string node)
    : connection_(std::move(connection)), node_(std::move(node)) {}

std::expected<Channel, Failure> Channel::open(const redis_detail::Address& address,
                                              const redis_detail::ConnectSettings& settings) {
  auto connection = redis_detail::Connection::open(address, settings, /*nonblocking=*/true);
  if (!connection) return std::unexpected(connection.error());
  return Channel(std::move(*connection), address.str());
}

void Channel::send(const std::vector<std::string>& args) {
  connection_.append(args);
  ++outstanding_;
  unflushed_ = true;
}

std::expected<Event, Failure> Channel::wait(Steady::time_point deadline, int wake_fd) {
  while (true) {
    auto ready = connection_.next_reply();
    if (!ready) return std::unexpected(ready.error());
    if (*ready) {
      if (outstanding_ == 0) {
        return std::unexpected(Failure{Failure::Kind::protocol, "a reply nobody asked for", node_});
      }
      --outstanding_;
      return Event{Event::Kind::reply, std::move(**ready)};
    }
    if (unflushed_) {
      auto done = connection_.flush();
      if (!done) return std::unexpected(done.error());
      unflushed_ = !*done;
    }
    // Polled at least once, even past the deadline: a reply already in the socket is taken.
    const auto now = Steady::now();
    const auto left = now >= deadline ? 0 : std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
    pollfd fds[2] = {{connection_.fd(), static_cast<short>(POLLIN | (unflushed_ ? POLLOUT : 0)), 0},
                     {wake_fd, POLLIN, 0}};
    const int n = ::poll(fds, wake_fd >= 0 ? 2 : 1, static_cast<int>(std::min<long long>(left, 60'000)));
    if (n < 0) {
      if (errno == EINTR) continue;
      return std::unexpected(Failure{Failure::Kind::io, std::string("poll: ") + std::strerror(errno), node_});
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      // EOF and resets surface here as a failed read.
      if (auto read = connection_.read(); !read) return std::unexpected(read.error());
      continue;
    }
    if (wake_fd >= 0 && (fds[1].revents & POLLIN)) return Event{Event::Kind::woken, {}};
    if (n == 0 && Steady::now() >= deadline) return Event{Event::Kind::expired, {}};
  }
}

std::expected<redis_detail::Reply, Failure> Channel::call(const std::vector<std::string>& args,
                                                          Steady::time_point deadline) {
  send(args);
  auto event = wait(deadline);
  if (!event) return std::unexpected(event.error());
  if (event->kind != Event::Kind::reply) {
    return std::unexpected(Failure{Failure::Kind::timeout, args.front() + " got no reply in time", node_});
  }
  return std::move(event->reply);
}

}  // namespace idem::redis_streams
