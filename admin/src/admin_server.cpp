#include "idem/admin_server.hpp"

// Boost 1.74's asio/awaitable.hpp uses std::exchange without including <utility>.
#include <utility>

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include <sys/socket.h>
#include <sys/time.h>

#include <cmath>
#include <cstdio>
#include <thread>

namespace idem::admin {
namespace asio = boost::asio;
namespace beast = boost::beast;
namespace bhttp = boost::beast::http;
using tcp = asio::ip::tcp;

namespace {

constexpr int kTimeoutSeconds = 2;
constexpr std::uint32_t kMaxHead = 8 * 1024;
constexpr std::uint64_t kMaxBody = 1024 * 1024;

void set_timeouts(tcp::socket& socket) {
  timeval tv{kTimeoutSeconds, 0};
  ::setsockopt(socket.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(socket.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

}  // namespace

struct AdminServer::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  AdminHandler handler;
  std::thread thread;

  void accept() {
    acceptor.async_accept([this](const beast::error_code& ec, tcp::socket socket) {
      if (ec == asio::error::operation_aborted) return;
      if (!ec) serve(std::move(socket));
      accept();
    });
  }

  // One request, answered, then the connection closes: probes and scrapers open one each.
  void serve(tcp::socket socket) {
    set_timeouts(socket);
    beast::error_code ec;
    beast::flat_buffer buffer(kMaxHead);
    bhttp::request_parser<bhttp::string_body> parser;
    parser.header_limit(kMaxHead);
    parser.body_limit(kMaxBody);
    bhttp::read(socket, buffer, parser, ec);
    bhttp::response<bhttp::string_body> res;
    res.version(11);
    res.keep_alive(false);
    if (ec) {
      if (ec == bhttp::error::end_of_stream || ec == asio::error::eof) return;
      const bool too_large = ec == bhttp::error::body_limit;
      res.result(too_large ? bhttp::status::payload_too_large : bhttp::status::bad_request);
      res.set(bhttp::field::content_type, "text/plain; charset=utf-8");
      res.body() = too_large ? "request body too large\n" : "bad request\n";
    } else {
      const auto& req = parser.get();
      AdminResponse answer;
      try {
        AdminRequest request;
        request.method = std::string_view(req.method_string().data(), req.method_string().size());
        request.target = std::string_view(req.target().data(), req.target().size());
        request.body = req.body();
        request.header = [&req](std::string_view name) -> std::string_view {
          const auto it = req.find(boost::beast::string_view(name.data(), name.size()));
          if (it == req.end()) return {};
          return std::string_view(it->value().data(), it->value().size());
        };
        answer = handler(request);
      } catch (const std::exception& e) {
        answer = AdminResponse{500, "text/plain; charset=utf-8", std::string("internal error: ") + e.what() + "\n"};
      }
      res.result(static_cast<unsigned>(answer.status));
      res.set(bhttp::field::content_type, answer.content_type);
      res.set(bhttp::field::cache_control, "no-store");
      if (req.method() != bhttp::verb::head) res.body() = std::move(answer.body);
    }
    res.prepare_payload();
    bhttp::write(socket, res, ec);
    socket.shutdown(tcp::socket::shutdown_both, ec);
  }
};

AdminServer::AdminServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

AdminServer::~AdminServer() {
  asio::post(impl_->io, [impl = impl_.get()] {
    beast::error_code ec;
    impl->acceptor.close(ec);
    impl->io.stop();
  });
  if (impl_->thread.joinable()) impl_->thread.join();
}

std::uint16_t AdminServer::port() const { return impl_->acceptor.local_endpoint().port(); }

std::expected<std::unique_ptr<AdminServer>, std::string> AdminServer::start(const std::string& host, std::uint16_t port,
                                                                            AdminHandler handler) {
  auto impl = std::make_unique<Impl>();
  impl->handler = std::move(handler);
  const std::string where = (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
  beast::error_code ec;
  const auto address = asio::ip::make_address(host, ec);
  if (ec) return std::unexpected("cannot listen on " + where + ": not an IP address");
  const tcp::endpoint endpoint(address, port);
  impl->acceptor.open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor.bind(endpoint, ec);
  if (!ec) impl->acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return std::unexpected("cannot listen on " + where + ": " + ec.message());
  impl->accept();
  impl->thread = std::thread([io = &impl->io] { io->run(); });
  return std::unique_ptr<AdminServer>(new AdminServer(std::move(impl)));
}

void append_family(std::string& out, std::string_view name, std::string_view type, std::string_view help) {
  out.append("# HELP ").append(name).append(" ").append(help).append("\n");
  out.append("# TYPE ").append(name).append(" ").append(type).append("\n");
}

void append_sample(std::string& out, std::string_view name, std::string_view labels, double value) {
  out.append(name);
  if (!labels.empty()) out.append("{").append(labels).append("}");
  char buf[64];
  if (std::isinf(value)) {
    std::snprintf(buf, sizeof buf, value > 0 ? "+Inf" : "-Inf");
  } else if (value == std::floor(value) && std::fabs(value) < 1e15) {
    std::snprintf(buf, sizeof buf, "%.0f", value);
  } else {
    std::snprintf(buf, sizeof buf, "%.9g", value);
  }
  out.append(" ").append(buf).append("\n");
}

void append_histogram(std::string& out, std::string_view name, std::string_view help, std::span<const double> bounds,
                      std::span<const std::uint64_t> counts, double sum, std::uint64_t count) {
  append_family(out, name, "histogram", help);
  const std::string bucket = std::string(name) + "_bucket";
  std::uint64_t cumulative = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    cumulative += counts[i];
    char le[48];
    if (i < bounds.size()) {
      std::snprintf(le, sizeof le, "le=\"%g\"", bounds[i]);
    } else {
      std::snprintf(le, sizeof le, "le=\"+Inf\"");
    }
    append_sample(out, bucket, le, static_cast<double>(cumulative));
  }
  append_sample(out, std::string(name) + "_sum", "", sum);
  append_sample(out, std::string(name) + "_count", "", static_cast<double>(count));
}

std::string label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size() + 2);
  out.push_back('"');
  for (const char c : value) {
    if (c == '\\' || c == '"') {
      out.push_back('\\');
      out.push_back(c);
    } else if (c == '\n') {
      out.append("\\n");
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
  return out;
}

}  // namespace idem::admin
