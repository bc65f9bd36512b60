#pragma once

// A plain POSIX listening socket on a free loopback port, for test servers that do their own
// socket I/O (fakes and proxies without Asio).

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>
#include <string>

namespace idem::testing {

struct LoopbackListener {
  int fd = -1;
  int port = 0;
};

/// Binds 127.0.0.1 on a free port and listens; throws (naming `who`) on failure.
inline LoopbackListener listen_on_loopback(const std::string& who, int backlog = 64) {
  LoopbackListener l;
  l.fd = ::socket(AF_INET, SOCK_STREAM, 0);
  int one = 1;
  ::setsockopt(l.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(l.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 || ::listen(l.fd, backlog) != 0) {
    ::close(l.fd);
    throw std::runtime_error(who + ": cannot listen on loopback");
  }
  socklen_t len = sizeof addr;
  ::getsockname(l.fd, reinterpret_cast<sockaddr*>(&addr), &len);
  l.port = ntohs(addr.sin_port);
  return l;
}

}  // namespace idem::testing
