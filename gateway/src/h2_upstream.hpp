#pragma once

// Internal to idem-gateway: HTTP/2 to the upstream (upstream_protocol = "h2"), one set of
// connections per event loop, each carrying many requests at once as streams (h2_upstream.cpp).

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "proxy.hpp"

namespace idem::gateway {

class H2ClientConnection;

/// What the upstream answered to one request, or why it did not.
struct H2Reply {
  bool ok = false;  // a complete response: status, head, body, trailers
  unsigned status = 0;
  bhttp::fields head;
  std::string body;
  std::vector<std::pair<std::string, std::string>> trailers;
  // When !ok:
  UpstreamError error = UpstreamError::dropped;
  bool sent_nothing = false;  // the upstream cannot have seen the request: safe to send again
  bool too_large = false;     // it answered (`status`, `head`), with a body above the limit
  std::string detail;         // for the 502/504 and the log
};

/// The HTTP/2 connections of one event loop to the upstream.
class H2Upstream {
 public:
  explicit H2Upstream(Worker& w) : w_(w) {}
  ~H2Upstream();
  H2Upstream(const H2Upstream&) = delete;
  H2Upstream& operator=(const H2Upstream&) = delete;

  /// Sends `req` (an HTTP/1.1-shaped request: its Host becomes :authority) on a stream and waits
  /// for the whole response, at most `timeout`; a response body above `max_body` is refused.
  Task<H2Reply> exchange(const http::Request& req, LoopConfig& config, Millis timeout, std::size_t max_body);

 private:
  Task<std::shared_ptr<H2ClientConnection>> connection(LoopConfig& config, H2Reply& failure);

  Worker& w_;
  std::vector<std::shared_ptr<H2ClientConnection>> connections_;
  bool connecting_ = false;
  std::unique_ptr<asio::steady_timer> connected_;  // waited on while another request connects
};

}  // namespace idem::gateway
