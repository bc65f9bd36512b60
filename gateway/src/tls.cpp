// The OpenSSL contexts of the TLS listener and of an https:// upstream (idem/gateway/tls.hpp).
#include "idem/gateway/tls.hpp"

#include <openssl/asn1.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstring>
#include <stdexcept>

#include "idem/private_file.hpp"

namespace idem::gateway {
namespace {

// TLS 1.2's suites: forward secrecy and AEAD only; TLS 1.3's are all of that already.
constexpr const char* kTls12Ciphers =
    "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE-ECDSA-AES256-GCM-SHA384:"
    "ECDHE-RSA-AES256-GCM-SHA384:ECDHE-ECDSA-CHACHA20-POLY1305:ECDHE-RSA-CHACHA20-POLY1305";
// ALPN, wire format: a length byte, then the name.
constexpr unsigned char kAlpnHttp11[] = {8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
constexpr unsigned char kAlpnH2Http11[] = {2, 'h', '2', 8, 'h', 't', 't', 'p', '/', '1', '.', '1'};
constexpr std::size_t kMaxPemFile = 1024 * 1024;

// OpenSSL's error queue as one line (and emptied), for a message after a failed call.
std::string openssl_errors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    // "error:0A00018F:SSL routines::ee key too small": the reason is after the last colon.
    const char* reason = std::strrchr(buf, ':');
    out += reason != nullptr && reason[1] != '\0' ? reason + 1 : buf;
  }
  return out.empty() ? std::string("unknown OpenSSL error") : out;
}

[[noreturn]] void fail(std::string_view key, const std::string& file, const std::string& why) {
  throw std::runtime_error(std::string(key) + " \"" + file + "\": " + why);
}

struct CtxFree {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
using CtxPtr = std::unique_ptr<SSL_CTX, CtxFree>;

CtxPtr new_context(const SSL_METHOD* method, TlsVersion min_version) {
  CtxPtr ctx(SSL_CTX_new(method));
  if (!ctx) throw std::runtime_error("TLS: cannot make an OpenSSL context: " + openssl_errors());
  SSL_CTX_set_min_proto_version(ctx.get(), min_version == TlsVersion::v1_3 ? TLS1_3_VERSION : TLS1_2_VERSION);
  SSL_CTX_set_options(ctx.get(), SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION | SSL_OP_CIPHER_SERVER_PREFERENCE);
  if (SSL_CTX_set_cipher_list(ctx.get(), kTls12Ciphers) != 1) {
    throw std::runtime_error("TLS: cannot set the cipher list: " + openssl_errors());
  }
  // Asio and Beast hand OpenSSL the same buffer again after a partial write.
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER | SSL_MODE_RELEASE_BUFFERS);
  return ctx;
}

// "not after" of a certificate, as days from now (negative: expired).
std::optional<int> days_left(X509* cert) {
  int days = 0;
  int seconds = 0;
  if (ASN1_TIME_diff(&days, &seconds, nullptr, X509_get0_notAfter(cert)) != 1) return std::nullopt;
  return days;
}

std::string subject_of(X509* cert) {
  std::string out;
  BIO* bio = BIO_new(BIO_s_mem());
  if (bio == nullptr) return out;
  X509_NAME_print_ex(bio, X509_get_subject_name(cert), 0, XN_FLAG_RFC2253);
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  if (n > 0) out.assign(data, static_cast<std::size_t>(n));
  BIO_free(bio);
  return out;
}

// The certificate chain and the key, the key read only if the file is private.
void load_certificate(SSL_CTX* ctx, const CertificateFiles& files, std::string_view prefix,
                      std::vector<std::string>* warnings) {
  const std::string cert_key = std::string(prefix) + "cert_file";
  const std::string key_key = std::string(prefix) + "key_file";
  if (SSL_CTX_use_certificate_chain_file(ctx, files.cert_file.c_str()) != 1) {
    fail(cert_key, files.cert_file, "cannot load a PEM certificate chain: " + openssl_errors());
  }
  if (files.key_file.empty()) throw std::runtime_error(key_key + ": missing (the private key of " + cert_key + ")");
  auto pem = read_private_file(files.key_file, "private key file", kMaxPemFile, "1 MiB");
  if (!pem) throw std::runtime_error(key_key + ": " + pem.error());
  std::string passphrase;
  if (!files.key_passphrase_file.empty()) {
    auto read = read_private_file(files.key_passphrase_file, "passphrase file", 4096, "4 KiB");
    if (!read) throw std::runtime_error(std::string(prefix) + "key_passphrase_file: " + read.error());
    passphrase = std::move(*read);
    while (!passphrase.empty() && (passphrase.back() == '\n' || passphrase.back() == '\r')) passphrase.pop_back();
  }
  BIO* bio = BIO_new_mem_buf(pem->data(), static_cast<int>(pem->size()));
  EVP_PKEY* key = bio != nullptr ? PEM_read_bio_PrivateKey(bio, nullptr, nullptr, passphrase.data()) : nullptr;
  BIO_free(bio);
  OPENSSL_cleanse(pem->data(), pem->size());
  OPENSSL_cleanse(passphrase.data(), passphrase.size());
  if (key == nullptr) {
    ERR_clear_error();  // its text could quote the file
    fail(key_key, files.key_file,
         files.key_passphrase_file.empty()
             ? "not a PEM private key, or an encrypted one (give key_passphrase_file)"
             : "not a PEM private key, or the passphrase in key_passphrase_file does not decrypt it");
  }
  // OpenSSL refuses a key that does not match the certificate already here (X509 "key values
  // mismatch"); SSL_CTX_check_private_key catches what it lets through.
  const bool used = SSL_CTX_use_PrivateKey(ctx, key) == 1 && SSL_CTX_check_private_key(ctx) == 1;
  EVP_PKEY_free(key);
  if (!used) {
    const std::string why = openssl_errors();
    fail(key_key, files.key_file,
         why.find("mismatch") != std::string::npos || why.find("does not match") != std::string::npos
             ? "the key does not belong to the certificate in " + cert_key
             : "cannot use the key: " + why);
  }
  if (X509* cert = SSL_CTX_get0_certificate(ctx); cert != nullptr && warnings != nullptr) {
    if (const auto days = days_left(cert)) {
      if (*days < 0) {
        warnings->push_back(cert_key + " \"" + files.cert_file + "\": the certificate (" + subject_of(cert) +
                            ") has expired; clients will refuse it");
      } else if (*days < 14) {
        warnings->push_back(cert_key + " \"" + files.cert_file + "\": the certificate (" + subject_of(cert) +
                            ") expires in " + std::to_string(*days) + " days");
      }
    }
  }
}

// ALPN on the listener: h2 when [http2] tls is on and the client offers it (`offer_h2` is not
// null), else http/1.1 when the client offers it; no ALPN (not a failed handshake) when it offers
// only protocols the gateway does not speak.
int select_alpn(SSL*, const unsigned char** out, unsigned char* outlen, const unsigned char* in, unsigned inlen,
                void* offer_h2) {
  const unsigned char* ours = offer_h2 != nullptr ? kAlpnH2Http11 : kAlpnHttp11;
  const unsigned ours_size = offer_h2 != nullptr ? sizeof kAlpnH2Http11 : sizeof kAlpnHttp11;
  unsigned char* selected = nullptr;
  if (SSL_select_next_proto(&selected, outlen, ours, ours_size, in, inlen) == OPENSSL_NPN_NEGOTIATED) {
    *out = selected;
    return SSL_TLSEXT_ERR_OK;
  }
  return SSL_TLSEXT_ERR_NOACK;
}

int failure_index() {
  static const int index = SSL_get_ex_new_index(0, nullptr, nullptr, nullptr, nullptr);
  return index;
}

// Upstream verification: records the first refusal (which certificate, why) for the 502's log line.
int record_verification(int preverified, X509_STORE_CTX* store) {
  if (preverified == 1) return 1;
  auto* ssl = static_cast<SSL*>(X509_STORE_CTX_get_ex_data(store, SSL_get_ex_data_X509_STORE_CTX_idx()));
  auto* failure = ssl != nullptr ? static_cast<std::string*>(SSL_get_ex_data(ssl, failure_index())) : nullptr;
  if (failure != nullptr && failure->empty()) {
    const int error = X509_STORE_CTX_get_error(store);
    X509* cert = X509_STORE_CTX_get_current_cert(store);
    *failure = "certificate " + (cert != nullptr ? subject_of(cert) : std::string("(none)")) + " (depth " +
               std::to_string(X509_STORE_CTX_get_error_depth(store)) + "): " + X509_verify_cert_error_string(error);
  }
  return 0;
}

}  // namespace

const std::string& ClientCertificate::identity(CertificateIdentity which) const {
  switch (which) {
    case CertificateIdentity::common_name: return common_name;
    case CertificateIdentity::uri: return uri;
    case CertificateIdentity::dns: return dns;
    case CertificateIdentity::subject: break;
  }
  return subject;
}

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

ssl_ctx_st* TlsContext::new_reference() const {
  SSL_CTX_up_ref(ctx_);
  return ctx_;
}

std::shared_ptr<const TlsContext> TlsContext::for_listener(const ListenerTls& setting, std::vector<std::string>* warnings) {
  CtxPtr ctx = new_context(TLS_server_method(), setting.min_version);
  load_certificate(ctx.get(), setting.certificate, "", warnings);
  // Session resumption: the server-side cache (ids, TLS 1.2) and tickets (TLS 1.3, and 1.2
  // clients that ask), both scoped to this gateway.
  static constexpr unsigned char kSessionContext[] = "idem-gateway";
  SSL_CTX_set_session_id_context(ctx.get(), kSessionContext, sizeof kSessionContext - 1);
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_SERVER);
  SSL_CTX_sess_set_cache_size(ctx.get(), 20000);
  static constexpr char kOfferH2 = 1;  // any non-null argument
  SSL_CTX_set_alpn_select_cb(ctx.get(), select_alpn, setting.offer_h2 ? const_cast<char*>(&kOfferH2) : nullptr);
  if (setting.client_certificates != ClientCertificates::off) {
    if (setting.client_ca_file.empty()) {
      throw std::runtime_error("client_ca_file: missing (client_certificates = \"optional\" or \"required\" verifies "
                               "client certificates against it)");
    }
    if (SSL_CTX_load_verify_locations(ctx.get(), setting.client_ca_file.c_str(), nullptr) != 1) {
      fail("client_ca_file", setting.client_ca_file, "cannot load CA certificates: " + openssl_errors());
    }
    // The CAs' names go to clients, so a client with several certificates picks the right one.
    if (STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(setting.client_ca_file.c_str())) {
      SSL_CTX_set_client_CA_list(ctx.get(), names);
    }
    int mode = SSL_VERIFY_PEER;
    if (setting.client_certificates == ClientCertificates::required) mode |= SSL_VERIFY_FAIL_IF_NO_PEER_CERT;
    // "optional": a certificate that does not verify still fails the handshake; only a client
    // that sends none is let in.
    SSL_CTX_set_verify(ctx.get(), mode, nullptr);
    SSL_CTX_set_verify_depth(ctx.get(), 8);
  }
  return std::shared_ptr<const TlsContext>(new TlsContext(ctx.release()));
}

std::shared_ptr<const TlsContext> TlsContext::for_upstream(const UpstreamTls& setting, std::string_view host,
                                                           std::vector<std::string>* warnings) {
  CtxPtr ctx = new_context(TLS_client_method(), TlsVersion::v1_2);
  if (setting.ca_file.empty()) {
    if (SSL_CTX_set_default_verify_paths(ctx.get()) != 1) {
      throw std::runtime_error("[upstream_tls]: cannot load the system's trust store: " + openssl_errors());
    }
  } else if (SSL_CTX_load_verify_locations(ctx.get(), setting.ca_file.c_str(), nullptr) != 1) {
    fail("ca_file", setting.ca_file, "cannot load CA certificates: " + openssl_errors());
  }
  if (!setting.client.empty()) load_certificate(ctx.get(), setting.client, "", warnings);
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, record_verification);
  SSL_CTX_set_verify_depth(ctx.get(), 8);
  // Sessions are kept by the connection pool (one per event loop), not in OpenSSL's store; the
  // client cache mode must be on for TLS 1.3 tickets to be kept on the session at all.
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_CLIENT | SSL_SESS_CACHE_NO_INTERNAL_STORE);
  auto out = std::shared_ptr<TlsContext>(new TlsContext(ctx.release()));
  out->server_name_ = setting.server_name.empty() ? std::string(host) : setting.server_name;
  return out;
}

bool prepare_upstream_connection(ssl_st* ssl, const TlsContext& context, std::string* failure) {
  const std::string& name = context.server_name();
  SSL_set_ex_data(ssl, failure_index(), failure);
  SSL_set_alpn_protos(ssl, kAlpnHttp11, sizeof kAlpnHttp11);
  if (ASN1_OCTET_STRING* ip = a2i_IPADDRESS(name.c_str())) {
    // An address: checked against the certificate's IP SANs; no SNI (RFC 6066 §3).
    ASN1_OCTET_STRING_free(ip);
    if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), name.c_str()) != 1) {
      *failure = "cannot check the upstream's certificate against " + name + ": " + openssl_errors();
      return false;
    }
    return true;
  }
  if (SSL_set_tlsext_host_name(ssl, name.c_str()) != 1 || SSL_set1_host(ssl, name.c_str()) != 1) {
    *failure = "cannot check the upstream's certificate against " + name + ": " + openssl_errors();
    return false;
  }
  return true;
}

std::optional<ClientCertificate> verified_client_certificate(ssl_st* ssl) {
  X509* cert = SSL_get0_peer_certificate(ssl);
  if (cert == nullptr || SSL_get_verify_result(ssl) != X509_V_OK) return std::nullopt;
  ClientCertificate out;
  out.subject = subject_of(cert);
  X509_NAME* subject = X509_get_subject_name(cert);
  const int cn = X509_NAME_get_index_by_NID(subject, NID_commonName, -1);
  if (cn >= 0) {
    ASN1_STRING* data = X509_NAME_ENTRY_get_data(X509_NAME_get_entry(subject, cn));
    unsigned char* utf8 = nullptr;
    const int n = ASN1_STRING_to_UTF8(&utf8, data);
    if (n > 0) out.common_name.assign(reinterpret_cast<const char*>(utf8), static_cast<std::size_t>(n));
    OPENSSL_free(utf8);
  }
  auto* names = static_cast<GENERAL_NAMES*>(X509_get_ext_d2i(cert, NID_subject_alt_name, nullptr, nullptr));
  for (int i = 0; names != nullptr && i < sk_GENERAL_NAME_num(names); ++i) {
    const GENERAL_NAME* name = sk_GENERAL_NAME_value(names, i);
    std::string* field = name->type == GEN_URI ? &out.uri : name->type == GEN_DNS ? &out.dns : nullptr;
    if (field == nullptr || !field->empty()) continue;
    const ASN1_IA5STRING* text = name->d.ia5;
    field->assign(reinterpret_cast<const char*>(ASN1_STRING_get0_data(text)), static_cast<std::size_t>(ASN1_STRING_length(text)));
  }
  GENERAL_NAMES_free(names);
  return out;
}

std::string describe_connection(ssl_st* ssl) {
  return std::string(SSL_get_version(ssl)) + " " + SSL_get_cipher_name(ssl);
}

}  // namespace idem::gateway
