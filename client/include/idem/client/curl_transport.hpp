#pragma once

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>

#include "idem/client/transport.hpp"

namespace idem::client {

/// Settings of the libcurl transport.
struct CurlOptions {
  /// Upper bound for TCP connect plus TLS handshake (the attempt timeout still bounds the whole).
  Millis connect_timeout = std::chrono::seconds(10);
  /// Verify the server's certificate and host name. Turn off only against a test server.
  bool verify_tls = true;
  /// A CA bundle file to verify against instead of the system's; empty for the system's.
  std::string ca_file;
  /// Responses with a larger body fail with TransportErrc::failed instead of filling memory.
  std::size_t max_response_bytes = std::size_t{64} << 20;
  /// Sent unless the request carries its own User-Agent.
  std::string user_agent = "idem-client/0.1";
  /// Easy handles (each with its connection cache) kept for reuse between calls.
  std::size_t max_idle_handles = 16;
};

/// The production Transport: libcurl, http and https only, redirects not followed (a redirected
/// POST is the caller's decision). Thread-safe: each call borrows an easy handle from a pool, so
/// connections are reused across calls and threads. No curl header leaks from here.
class CurlTransport final : public Transport {
 public:
  explicit CurlTransport(CurlOptions options = {});
  ~CurlTransport() override;
  CurlTransport(const CurlTransport&) = delete;
  CurlTransport& operator=(const CurlTransport&) = delete;

  std::expected<HttpResponse, TransportError> perform(const HttpRequest& request, Millis timeout) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace idem::client
