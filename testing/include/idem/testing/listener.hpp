#pragma once

// What the test tools (fixture upstream, fault proxy) do to start listening: bind a loopback
// port (0 for any free one) and tell the test which port through a file.

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <boost/asio/ip/tcp.hpp>

#include <filesystem>
#include <fstream>
#include <string>

namespace idem::testing {

/// Opens, binds and listens `acceptor` on `endpoint`; returns the port it got. Throws on failure.
inline unsigned short listen_on(boost::asio::ip::tcp::acceptor& acceptor, const boost::asio::ip::tcp::endpoint& endpoint) {
  acceptor.open(endpoint.protocol());
  acceptor.set_option(boost::asio::socket_base::reuse_address(true));
  acceptor.bind(endpoint);
  acceptor.listen(boost::asio::socket_base::max_listen_connections);
  return acceptor.local_endpoint().port();
}

/// Writes `text` and a newline to `path`, through a rename so that a reader polling for the file
/// never sees half of it.
inline void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::ofstream(tmp) << text << "\n";
  std::filesystem::rename(tmp, path);
}

}  // namespace idem::testing
