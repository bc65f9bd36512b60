// idem-fault-proxy: a TCP proxy that loses responses, for end-to-end tests of retries.
//
// It forwards bytes both ways between each client connection and a fresh connection to the
// target. At the configured rate, per HTTP response, it lets the request through to the target,
// reads the first bytes of the target's answer and, instead of forwarding them, closes the client's
// connection (then reads and discards the rest of the answer). To the client this is the failure
// idempotency keys exist for: the request was executed, and the answer never arrived.
//
//   idem-fault-proxy --listen 127.0.0.1:0 --target HOST:PORT [--port-file P] [--drop-rate 0.3]
//                    [--seed N] [--stats-file F]
//
// A response starts with the first bytes the target sends after the client last sent some: HTTP/1.1
// without pipelining (what libcurl and idem's client do), one decision per request. Decisions come
// from one seeded generator on one thread, so a run is reproducible given the order of arrival.
//
// SIGUSR1 writes the counts to --stats-file; SIGTERM or SIGINT writes them, prints them on stderr
// and exits 0. The counts, as JSON: connections, connect_failures, responses (seen from the target),
// forwarded, dropped.
#include <utility>  // before Asio: Boost 1.74's awaitable.hpp uses std::exchange unincluded

#include <boost/asio.hpp>
#include <boost/asio/redirect_error.hpp>

#include <array>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <string_view>

#include "idem/testing/listener.hpp"

namespace net = boost::asio;
using tcp = net::ip::tcp;
using boost::system::error_code;

namespace {

struct Options {
  std::string listen = "127.0.0.1:0";
  std::string target;
  std::string port_file;
  std::string stats_file;
  double drop_rate = 0.0;
  std::uint64_t seed = 1;
};

struct Stats {
  std::uint64_t connections = 0;
  std::uint64_t connect_failures = 0;
  std::uint64_t responses = 0;
  std::uint64_t forwarded = 0;
  std::uint64_t dropped = 0;
};

/// Everything the proxy shares; one thread touches it, so no lock.
struct Proxy {
  tcp::endpoint target;
  double drop_rate = 0.0;
  std::mt19937_64 rng;
  Stats stats;

  /// One decision per response: true means lose it.
  bool drop_next() {
    // Compared as integers so the sequence is the same on every standard library.
    const auto threshold = static_cast<long double>(drop_rate) * 18446744073709551616.0L;
    return static_cast<long double>(rng()) < threshold;
  }
};

/// One client connection and its connection to the target.
struct Link {
  explicit Link(tcp::socket c) : client(std::move(c)), target(client.get_executor()) {}
  tcp::socket client;
  tcp::socket target;
  bool awaiting_response = false;  ///< the client sent bytes since the target last answered
  bool dropped = false;            ///< the client was cut off; the target is being drained

  void close_both() {
    error_code ignored;
    client.close(ignored);
    target.close(ignored);
  }
};

constexpr std::size_t kBufferSize = 64 * 1024;
constexpr auto kDrainLimit = std::chrono::seconds(2);

net::awaitable<void> client_to_target(std::shared_ptr<Link> link) {
  std::array<char, kBufferSize> buf;
  for (;;) {
    error_code ec;
    const std::size_t n = co_await link->client.async_read_some(net::buffer(buf), net::redirect_error(net::use_awaitable, ec));
    if (link->dropped) co_return;  // the other direction owns the target now
    if (ec) {
      if (ec == net::error::eof) {
        link->target.shutdown(tcp::socket::shutdown_send, ec);  // pass the half-close on
      } else {
        link->close_both();
      }
      co_return;
    }
    // Set before writing: the target may answer before this write's completion is seen.
    link->awaiting_response = true;
    co_await net::async_write(link->target, net::buffer(buf.data(), n), net::redirect_error(net::use_awaitable, ec));
    if (ec) {
      if (!link->dropped) link->close_both();
      co_return;
    }
  }
}

/// After a drop: reads and discards what the target still sends (the rest of the lost answer),
/// for at most kDrainLimit, so the target finishes its write as if the client had read it.
net::awaitable<void> drain(std::shared_ptr<Link> link) {
  net::steady_timer limit(link->target.get_executor());
  limit.expires_after(kDrainLimit);
  limit.async_wait([link](const error_code& ec) {
    if (!ec) link->close_both();
  });
  std::array<char, kBufferSize> buf;
  for (;;) {
    error_code ec;
    co_await link->target.async_read_some(net::buffer(buf), net::redirect_error(net::use_awaitable, ec));
    if (ec) break;
  }
  limit.cancel();
  link->close_both();
}

net::awaitable<void> target_to_client(std::shared_ptr<Link> link, Proxy& proxy) {
  std::array<char, kBufferSize> buf;
  for (;;) {
    error_code ec;
    const std::size_t n = co_await link->target.async_read_some(net::buffer(buf), net::redirect_error(net::use_awaitable, ec));
    if (ec) {
      if (ec == net::error::eof) {
        link->client.shutdown(tcp::socket::shutdown_send, ec);
      } else {
        link->close_both();
      }
      co_return;
    }
    if (link->awaiting_response) {
      link->awaiting_response = false;
      ++proxy.stats.responses;
      if (proxy.drop_next()) {
        ++proxy.stats.dropped;
        link->dropped = true;
        error_code ignored;
        link->client.shutdown(tcp::socket::shutdown_both, ignored);
        link->client.close(ignored);
        co_await drain(link);
        co_return;
      }
      ++proxy.stats.forwarded;
    }
    co_await net::async_write(link->client, net::buffer(buf.data(), n), net::redirect_error(net::use_awaitable, ec));
    if (ec) {
      link->close_both();
      co_return;
    }
  }
}

net::awaitable<void> serve(tcp::socket client, Proxy& proxy) {
  auto link = std::make_shared<Link>(std::move(client));
  ++proxy.stats.connections;
  error_code ec;
  co_await link->target.async_connect(proxy.target, net::redirect_error(net::use_awaitable, ec));
  if (ec) {
    ++proxy.stats.connect_failures;
    link->close_both();  // the client sees the target's refusal as a closed connection
    co_return;
  }
  link->target.set_option(tcp::no_delay(true), ec);
  link->client.set_option(tcp::no_delay(true), ec);
  auto executor = co_await net::this_coro::executor;
  net::co_spawn(executor, client_to_target(link), net::detached);
  net::co_spawn(executor, target_to_client(link, proxy), net::detached);
}

net::awaitable<void> accept_loop(tcp::acceptor& acceptor, Proxy& proxy) {
  for (;;) {
    error_code ec;
    tcp::socket socket = co_await acceptor.async_accept(net::redirect_error(net::use_awaitable, ec));
    if (ec) {
      if (ec == net::error::operation_aborted) co_return;
      continue;
    }
    net::co_spawn(acceptor.get_executor(), serve(std::move(socket), proxy), net::detached);
  }
}

std::string stats_json(const Stats& s) {
  return "{\"connections\":" + std::to_string(s.connections) + ",\"connect_failures\":" +
         std::to_string(s.connect_failures) + ",\"responses\":" + std::to_string(s.responses) +
         ",\"forwarded\":" + std::to_string(s.forwarded) + ",\"dropped\":" + std::to_string(s.dropped) + "}";
}

// Written then renamed, so a reader never sees half a file.
tcp::endpoint parse_endpoint(const std::string& text, net::io_context& ioc, const char* what) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0) throw std::invalid_argument(std::string(what) + " wants HOST:PORT");
  std::string host = text.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  tcp::resolver resolver(ioc);
  auto results = resolver.resolve(host, text.substr(colon + 1), tcp::resolver::numeric_service);
  return results.begin()->endpoint();
}

int usage(const std::string& why) {
  std::cerr << "idem-fault-proxy: " << why
            << "\nusage: idem-fault-proxy --listen HOST:PORT --target HOST:PORT [--port-file PATH]\n"
               "                        [--drop-rate 0..1] [--seed N] [--stats-file PATH]\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (i + 1 >= argc) return usage("missing value after " + std::string(a));
    const std::string v = argv[++i];
    if (a == "--listen") {
      o.listen = v;
    } else if (a == "--target") {
      o.target = v;
    } else if (a == "--port-file") {
      o.port_file = v;
    } else if (a == "--stats-file") {
      o.stats_file = v;
    } else if (a == "--drop-rate") {
      char* end = nullptr;
      o.drop_rate = std::strtod(v.c_str(), &end);
      if (end == v.c_str() || *end != '\0' || !(o.drop_rate >= 0.0 && o.drop_rate <= 1.0)) {
        return usage("--drop-rate wants a number from 0 to 1");
      }
    } else if (a == "--seed") {
      char* end = nullptr;
      o.seed = std::strtoull(v.c_str(), &end, 10);
      if (end == v.c_str() || *end != '\0') return usage("--seed wants an integer");
    } else {
      return usage("unknown argument " + std::string(a));
    }
  }
  if (o.target.empty()) return usage("--target is required");

  try {
    net::io_context ioc{1};
    Proxy proxy;
    proxy.target = parse_endpoint(o.target, ioc, "--target");
    proxy.drop_rate = o.drop_rate;
    proxy.rng.seed(o.seed);

    const tcp::endpoint endpoint = parse_endpoint(o.listen, ioc, "--listen");
    tcp::acceptor acceptor{ioc};
    const unsigned short port = idem::testing::listen_on(acceptor, endpoint);
    if (!o.port_file.empty()) idem::testing::write_file_atomically(o.port_file, std::to_string(port));
    std::cout << "idem-fault-proxy listening on " << endpoint.address().to_string() << ":" << port << " -> "
              << o.target << ", drop rate " << o.drop_rate << ", seed " << o.seed << std::endl;

    const auto save_stats = [&] {
      if (!o.stats_file.empty()) idem::testing::write_file_atomically(o.stats_file, stats_json(proxy.stats));
    };
    net::signal_set stop_signals(ioc, SIGINT, SIGTERM);
    stop_signals.async_wait([&](const error_code& ec, int) {
      if (ec) return;
      save_stats();
      std::cerr << "idem-fault-proxy: " << stats_json(proxy.stats) << std::endl;
      ioc.stop();
    });
    net::signal_set report_signal(ioc, SIGUSR1);
    std::function<void(const error_code&, int)> on_report = [&](const error_code& ec, int) {
      if (ec) return;
      save_stats();
      report_signal.async_wait(on_report);
    };
    report_signal.async_wait(on_report);

    net::co_spawn(ioc, accept_loop(acceptor, proxy), net::detached);
    ioc.run();
  } catch (const std::exception& e) {
    std::cerr << "idem-fault-proxy: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
