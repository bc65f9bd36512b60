#pragma once

#include <chrono>
#include <cstddef>
#include <expected>
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
  /// A client certificate (PEM; intermediates after it) presented for mutual TLS; empty for none.
  /// Needs key_file.
  std::string cert_file;
  /// The client certificate's private key (PEM). Read once, when the transport is made, under
  /// read_private_file's rules (a regular file that other users can neither read nor write: 0600,
  /// or 0640 for the service's group) and kept in memory, so the bytes checked are the bytes used.
  std::string key_file;
  /// For an encrypted key: a file whose first line is its passphrase (the same rules as the key
  /// file). A passphrase is never taken from a command line and never printed.
  std::string key_passphrase_file;
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
///
/// https:// is TLS 1.2 or later. TLS failures (an unknown CA, a host name the certificate does
/// not name, an expired certificate, a refused client certificate) are TransportErrors whose
/// message names the server (scheme://host:port, never the userinfo) and curl's reason; never a
/// fallback to plain HTTP or to an unverified connection.
class CurlTransport final : public Transport {
 public:
  /// Checks the TLS files of `options` (ca_file and cert_file readable; key_file and
  /// key_passphrase_file as read_private_file requires; the key opens with the passphrase and
  /// belongs to the certificate): an error is one line naming the file and what is wrong.
  static std::expected<std::unique_ptr<CurlTransport>, std::string> create(CurlOptions options);
  /// The same, for options without a client certificate; with one, a problem with its files
  /// throws std::invalid_argument (create's message).
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
