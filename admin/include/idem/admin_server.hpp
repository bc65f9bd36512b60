#pragma once

// A small HTTP listener for the sidecars' admin endpoints (/metrics, /healthz, /readyz) of
// idem-consume and idem-relay, and for the examples' small endpoints (examples/notifier's
// webhook). One connection and one request at a time, each bounded by a 2 s read and write
// timeout, an 8 KiB request head and a 1 MiB body: it serves probes, scrapers and a relay's
// sequential POSTs, not traffic. Boost.Beast is
// this module's dependency and stays out of this header.

#include <cstdint>
#include <expected>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace idem::admin {

/// What an admin endpoint answers.
struct AdminResponse {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
};

/// One request as the handler sees it; valid during the call.
struct AdminRequest {
  std::string_view method;
  std::string_view target;  ///< "/metrics", "/v1/receipts/pay_1?x=y"
  std::string_view body;
  /// The value of the first header called `name` (any case); empty when absent.
  std::function<std::string_view(std::string_view name)> header;
};

/// Answers one request; called on the server's thread.
using AdminHandler = std::function<AdminResponse(const AdminRequest& request)>;

/// A listener on its own thread, stopped by its destructor. Requests over the limits get 400/413.
class AdminServer {
 public:
  /// Binds HOST:PORT (port 0: a free one) and starts serving; fails with one line ("cannot
  /// listen on 127.0.0.1:9101: Address already in use").
  static std::expected<std::unique_ptr<AdminServer>, std::string> start(const std::string& host, std::uint16_t port,
                                                                        AdminHandler handler);
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  /// The port bound (the one given, or the one the system chose for 0).
  std::uint16_t port() const;

 private:
  struct Impl;
  explicit AdminServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The Prometheus text of one sample: `name{labels} value\n` (labels without braces; may be empty).
void append_sample(std::string& out, std::string_view name, std::string_view labels, double value);
/// `# HELP name help\n# TYPE name type\n`.
void append_family(std::string& out, std::string_view name, std::string_view type, std::string_view help);
/// A Prometheus histogram family: `bounds[i]` the upper bound of `counts[i]` (not cumulative;
/// counts has one more element, for +Inf), `sum` in the unit of the bounds.
void append_histogram(std::string& out, std::string_view name, std::string_view help, std::span<const double> bounds,
                      std::span<const std::uint64_t> counts, double sum, std::uint64_t count);
/// A label value escaped for the Prometheus text format (backslash, quote, newline).
std::string label_value(std::string_view value);

}  // namespace idem::admin
