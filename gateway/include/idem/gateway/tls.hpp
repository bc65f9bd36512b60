#pragma once

// TLS for idem-gateway (docs/gateway.md, TLS): the [tls] listener's and [upstream_tls]'s settings,
// and the OpenSSL contexts loaded from them. OpenSSL's types stay opaque here (no Boost, no
// OpenSSL header); the Asio streams that use them live in the executable.

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

struct ssl_ctx_st;  // SSL_CTX
struct ssl_st;      // SSL

namespace idem::gateway {

/// The oldest protocol version a listener accepts. TLS 1.0 and 1.1 are never offered.
enum class TlsVersion { v1_2, v1_3 };

/// Whether the listener asks clients for a certificate (mutual TLS).
enum class ClientCertificates {
  off,       ///< never asked for
  optional,  ///< asked for; a client without one is served (its tenant cannot come from one)
  required,  ///< a client without a valid one fails the handshake
};

/// A certificate, its chain and its private key, from PEM files.
struct CertificateFiles {
  std::string cert_file;            ///< the certificate, then its intermediates (leaf first)
  std::string key_file;             ///< the private key: a file only its owner (and group) can read
  std::string key_passphrase_file;  ///< the key's passphrase when the key is encrypted; same rule

  bool empty() const { return cert_file.empty(); }
};

/// [tls]: a TLS listener, beside the plain one or instead of it.
struct ListenerTls {
  std::string listen_text;  ///< HOST:PORT, parsed into Config::tls_listen
  CertificateFiles certificate;
  TlsVersion min_version = TlsVersion::v1_2;
  ClientCertificates client_certificates = ClientCertificates::off;
  std::string client_ca_file;  ///< the CAs client certificates are verified against
  bool offer_h2 = false;       ///< ALPN: h2 before http/1.1 ([http2] tls = true)
};

/// [upstream_tls]: how an https:// upstream is verified and what the gateway presents to it.
struct UpstreamTls {
  std::string ca_file;         ///< empty: the system's trust store
  CertificateFiles client;     ///< empty: no client certificate
  std::string server_name;     ///< sent as SNI and checked against the certificate; empty: the URL's host
};

/// Which of a verified client certificate's names is its tenant ([tenant] identity).
enum class CertificateIdentity {
  subject,     ///< the whole subject, RFC 2253 form ("CN=payments-a,O=Example")
  common_name, ///< the subject's CN
  uri,         ///< the first URI subject alternative name (a SPIFFE ID, say)
  dns,         ///< the first DNS subject alternative name
};

/// What a verified client certificate names; a field is empty when the certificate has none.
struct ClientCertificate {
  std::string subject;
  std::string common_name;
  std::string uri;
  std::string dns;

  const std::string& identity(CertificateIdentity which) const;
};

/// An OpenSSL context (SSL_CTX) loaded from a [tls] or [upstream_tls] setting. Immutable once
/// made and shared by every connection made with it; a reload makes a new one, and connections
/// made with the old one keep it until they close.
class TlsContext {
 public:
  /// The listener's. Throws std::runtime_error naming the file and the reason ("cert_file
  /// \"/etc/idem/tls/gw.pem\": no certificate in it"); adds warnings (a certificate expiring
  /// within 14 days, or already expired) to `warnings`.
  static std::shared_ptr<const TlsContext> for_listener(const ListenerTls& setting, std::vector<std::string>* warnings);
  /// The upstream's, for an https:// upstream on `host`. Throws like for_listener.
  static std::shared_ptr<const TlsContext> for_upstream(const UpstreamTls& setting, std::string_view host,
                                                        std::vector<std::string>* warnings);

  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  /// Another reference to the SSL_CTX, for a wrapper that frees it (Asio's ssl::context).
  ssl_ctx_st* new_reference() const;
  /// The upstream's name: SNI and the certificate check. Empty for a listener.
  const std::string& server_name() const { return server_name_; }

 private:
  explicit TlsContext(ssl_ctx_st* ctx) : ctx_(ctx) {}
  ssl_ctx_st* ctx_;
  std::string server_name_;
};

/// Prepares a new upstream connection's SSL: SNI, the host-name (or IP address) check, ALPN
/// http/1.1, and a verification callback that writes why a certificate was refused into
/// `*failure` ("certificate CN=localhost (depth 0): certificate has expired"). `failure` must
/// outlive the handshake. Returns false (with the reason in `*failure`) when OpenSSL refuses.
bool prepare_upstream_connection(ssl_st* ssl, const TlsContext& context, std::string* failure);

/// The verified client certificate of a finished handshake; nullopt when the client sent none
/// (or it did not verify: with client_certificates = "optional" OpenSSL lets such a client in).
std::optional<ClientCertificate> verified_client_certificate(ssl_st* ssl);

/// The negotiated protocol and cipher, for the debug log ("TLSv1.3 TLS_AES_128_GCM_SHA256").
std::string describe_connection(ssl_st* ssl);

}  // namespace idem::gateway
