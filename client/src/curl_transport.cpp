#include "idem/client/curl_transport.hpp"

#include <curl/curl.h>
#include <fcntl.h>
#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <vector>

#include "idem/private_file.hpp"

namespace idem::client {
namespace {

struct EasyCleanup {
  void operator()(CURL* h) const { curl_easy_cleanup(h); }
};
using Easy = std::unique_ptr<CURL, EasyCleanup>;

struct SlistFree {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};
using Slist = std::unique_ptr<curl_slist, SlistFree>;

void global_init() {
  // Once per process, before any handle; curl_global_init is not itself safe to race.
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\r' || s.front() == '\n')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n')) {
    s.remove_suffix(1);
  }
  return s;
}

// What the callbacks fill during one transfer.
struct Sink {
  HttpResponse response;
  std::size_t max_body = 0;
  bool too_large = false;
};

std::size_t on_body(char* data, std::size_t size, std::size_t count, void* user) noexcept {
  auto* sink = static_cast<Sink*>(user);
  const std::size_t n = size * count;
  if (sink->response.body.size() + n > sink->max_body) {
    sink->too_large = true;
    return 0;  // aborts the transfer with CURLE_WRITE_ERROR
  }
  try {
    sink->response.body.append(data, n);
  } catch (...) {
    return 0;
  }
  return n;
}

std::size_t on_header(char* data, std::size_t size, std::size_t count, void* user) noexcept {
  auto* sink = static_cast<Sink*>(user);
  const std::size_t n = size * count;
  const std::string_view line(data, n);
  try {
    if (line.starts_with("HTTP/")) {
      // A new response begins (after a 100 Continue, say): only the last one's headers count.
      sink->response.headers.clear();
    } else if (const auto colon = line.find(':'); colon != std::string_view::npos && colon > 0) {
      sink->response.headers.push_back({std::string(trim(line.substr(0, colon))),
                                        std::string(trim(line.substr(colon + 1)))});
    }
  } catch (...) {
    return 0;
  }
  return n;
}

// scheme://host:port of `url`, without its userinfo, path and query: what a TLS error names.
std::string origin_of(const std::string& url) {
  CURLU* u = curl_url();
  if (u == nullptr) return "the server";
  std::string out = "the server";
  if (curl_url_set(u, CURLUPART_URL, url.c_str(), 0) == CURLUE_OK) {
    char* scheme = nullptr;
    char* host = nullptr;
    char* port = nullptr;
    if (curl_url_get(u, CURLUPART_SCHEME, &scheme, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_HOST, &host, 0) == CURLUE_OK &&
        curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT) == CURLUE_OK) {
      out = std::string(scheme).append("://").append(host).append(1, ':').append(port);
    }
    curl_free(scheme);
    curl_free(host);
    curl_free(port);
  }
  curl_url_cleanup(u);
  return out;
}

bool tls_failure(CURLcode code) {
  switch (code) {
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_CLIENTCERT:
      return true;
    default:
      return false;
  }
}

// The one place that decides what a libcurl failure means for a retry.
TransportError map_error(CURLcode code, CURL* h, const char* detail, bool too_large, std::size_t max_body,
                         const std::string& url) {
  TransportError error;
  std::string message = "curl: ";
  // Which server a certificate problem is about: the operator fixes that one's certificate or
  // the CA file (the URL's userinfo, path and query stay out).
  if (tls_failure(code)) message += "TLS with " + origin_of(url) + " failed: ";
  message += (detail && *detail) ? detail : curl_easy_strerror(code);
  message += " (" + std::to_string(static_cast<int>(code)) + ")";

  curl_off_t connect_us = 0;
  curl_easy_getinfo(h, CURLINFO_CONNECT_TIME_T, &connect_us);
  switch (code) {
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_SSL_CONNECT_ERROR:  // handshake failed: no request bytes left
      error.code = TransportErrc::could_not_connect;
      break;
    case CURLE_OPERATION_TIMEDOUT:
      // Timed out before a connection existed, or while waiting for the answer.
      error.code = connect_us == 0 ? TransportErrc::could_not_connect : TransportErrc::no_answer;
      break;
    case CURLE_UNSUPPORTED_PROTOCOL:
    case CURLE_URL_MALFORMAT:
    case CURLE_NOT_BUILT_IN:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_PINNEDPUBKEYNOTMATCH:
    case CURLE_SSL_CLIENTCERT:
    case CURLE_BAD_FUNCTION_ARGUMENT:
    case CURLE_FILESIZE_EXCEEDED:
    case CURLE_OUT_OF_MEMORY:
      error.code = TransportErrc::failed;
      break;
    case CURLE_WRITE_ERROR:
      if (too_large) {
        error.code = TransportErrc::failed;
        message = "response body larger than " + std::to_string(max_body) + " bytes";
      } else {
        error.code = TransportErrc::no_answer;
      }
      break;
    default:
      // Send/receive errors, empty replies, broken HTTP: the request may have arrived. Retrying is
      // safe because the key makes the server replay instead of executing twice.
      error.code = TransportErrc::no_answer;
      break;
  }
  error.message = std::move(message);
  return error;
}

}  // namespace

std::string_view to_string(TransportErrc code) {
  switch (code) {
    case TransportErrc::could_not_connect: return "could_not_connect";
    case TransportErrc::no_answer: return "no_answer";
    case TransportErrc::failed: return "failed";
  }
  return "unknown";
}

struct CurlTransport::Impl {
  CurlOptions options;
  std::string key_pem;     // key_file's bytes, read once (read_private_file)
  std::string passphrase;  // key_passphrase_file's first line
  std::mutex mutex;
  std::vector<Easy> idle;  // handles keep their connection caches between calls

  ~Impl() {
    OPENSSL_cleanse(key_pem.data(), key_pem.size());
    OPENSSL_cleanse(passphrase.data(), passphrase.size());
  }

  Easy acquire() {
    {
      std::lock_guard lock(mutex);
      if (!idle.empty()) {
        Easy h = std::move(idle.back());
        idle.pop_back();
        return h;
      }
    }
    return Easy(curl_easy_init());
  }

  void release(Easy h) {
    // Options go (they point into the finished call's stack); live connections, DNS and TLS
    // session caches stay for the next call.
    curl_easy_reset(h.get());
    std::lock_guard lock(mutex);
    if (idle.size() < options.max_idle_handles) idle.push_back(std::move(h));
  }
};

namespace {

// OpenSSL's reason for the last failure, or `otherwise`; the error queue is emptied.
std::string openssl_reason(const char* otherwise) {
  const unsigned long e = ERR_peek_last_error();
  std::string out = otherwise;
  if (e != 0) {
    if (const char* reason = ERR_reason_error_string(e)) out = reason;
  }
  ERR_clear_error();
  return out;
}

std::expected<void, std::string> check_readable(const std::string& path, std::string_view option) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::unexpected(std::string(option) + ": " + path + ": cannot read it: " + std::strerror(errno));
  ::close(fd);
  return {};
}

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct CertFree {
  void operator()(X509* c) const { X509_free(c); }
};

int passphrase_callback(char* buffer, int size, int, void* user) {
  const auto* passphrase = static_cast<const std::string*>(user);
  // No passphrase: fail (OpenSSL's own default would prompt on the terminal).
  if (passphrase == nullptr || passphrase->empty() || passphrase->size() > static_cast<std::size_t>(size)) return -1;
  std::memcpy(buffer, passphrase->data(), passphrase->size());
  return static_cast<int>(passphrase->size());
}

// Reads and checks the TLS files of `o` (see CurlOptions): the key's bytes into `key_pem`, the
// passphrase into `passphrase`.
std::expected<void, std::string> load_tls_files(const CurlOptions& o, std::string& key_pem, std::string& passphrase) {
  if (!o.ca_file.empty()) {
    if (auto ok = check_readable(o.ca_file, "CA file"); !ok) return ok;
  }
  if (o.cert_file.empty() != o.key_file.empty()) {
    return std::unexpected(o.cert_file.empty() ? "a client key file without a client certificate file: give both"
                                               : "a client certificate file without its key file: give both");
  }
  if (!o.key_passphrase_file.empty() && o.key_file.empty()) {
    return std::unexpected("a key passphrase file without a client key file");
  }
  if (o.cert_file.empty()) return {};
  if (auto ok = check_readable(o.cert_file, "client certificate file"); !ok) return ok;

  auto key = read_private_file(o.key_file, "client key file", std::size_t{1} << 20, "1 MiB");
  if (!key) return std::unexpected(key.error());
  key_pem = std::move(*key);
  if (!o.key_passphrase_file.empty()) {
    auto pass = read_private_file(o.key_passphrase_file, "key passphrase file", 4096, "4 KiB");
    if (!pass) return std::unexpected(pass.error());
    const auto end = pass->find_first_of("\r\n");
    passphrase.assign(*pass, 0, end);
    OPENSSL_cleanse(pass->data(), pass->size());
    if (passphrase.empty()) return std::unexpected(o.key_passphrase_file + ": the key passphrase file's first line is empty");
  }

  // Opened here, once, so that a wrong passphrase or a key of another certificate is a clear
  // error at start instead of a failed handshake at every delivery.
  ERR_clear_error();
  std::unique_ptr<BIO, BioFree> key_bio(BIO_new_mem_buf(key_pem.data(), static_cast<int>(key_pem.size())));
  if (!key_bio) return std::unexpected("out of memory reading the client key");
  std::unique_ptr<EVP_PKEY, KeyFree> pkey(
      PEM_read_bio_PrivateKey(key_bio.get(), nullptr, &passphrase_callback, static_cast<void*>(&passphrase)));
  if (!pkey) {
    const std::string why = openssl_reason("not a PEM private key");
    return std::unexpected(o.key_file + ": cannot open the client key file: " + why +
                           (o.key_passphrase_file.empty() ? " (an encrypted key needs key_passphrase_file)"
                                                          : " (is the passphrase right?)"));
  }
  std::unique_ptr<BIO, BioFree> cert_bio(BIO_new_file(o.cert_file.c_str(), "r"));
  std::unique_ptr<X509, CertFree> cert(cert_bio ? PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!cert) {
    return std::unexpected(o.cert_file + ": not a PEM certificate: " + openssl_reason("no certificate in it"));
  }
  if (X509_check_private_key(cert.get(), pkey.get()) != 1) {
    ERR_clear_error();
    return std::unexpected(o.key_file + ": the client key file does not hold the key of " + o.cert_file);
  }
  return {};
}

}  // namespace

CurlTransport::CurlTransport(CurlOptions options) : impl_(std::make_unique<Impl>()) {
  global_init();
  impl_->options = std::move(options);
  if (auto loaded = load_tls_files(impl_->options, impl_->key_pem, impl_->passphrase); !loaded) {
    throw std::invalid_argument(loaded.error());
  }
}

std::expected<std::unique_ptr<CurlTransport>, std::string> CurlTransport::create(CurlOptions options) {
  try {
    return std::make_unique<CurlTransport>(std::move(options));
  } catch (const std::invalid_argument& e) {
    return std::unexpected(std::string(e.what()));
  }
}

CurlTransport::~CurlTransport() = default;

std::expected<HttpResponse, TransportError> CurlTransport::perform(const HttpRequest& request, Millis timeout) {
  const CurlOptions& options = impl_->options;
  Easy handle = impl_->acquire();
  if (!handle) return std::unexpected(TransportError{TransportErrc::failed, "curl: curl_easy_init failed"});
  CURL* h = handle.get();

  Sink sink;
  sink.max_body = options.max_response_bytes;
  char error_buffer[CURL_ERROR_SIZE] = {};

  // Exactly the caller's headers. Empty "Name:" entries switch off what curl would add on its own:
  // a form Content-Type the caller never chose (it would change the server's fingerprint) and
  // Expect: 100-continue (a round trip of delay for large bodies).
  Slist headers;
  bool has_content_type = false;
  bool has_expect = false;
  auto add = [&](const std::string& line) {
    // The first append creates the list; later ones return the same head (or null, list intact).
    curl_slist* head = curl_slist_append(headers.get(), line.c_str());
    if (head && !headers) headers.reset(head);
    return head != nullptr;
  };
  for (const auto& header : request.headers) {
    has_content_type = has_content_type || header_name_equals(header.name, "Content-Type");
    has_expect = has_expect || header_name_equals(header.name, "Expect");
    // "Name;" is curl's way to send a header with an empty value.
    if (!add(header.value.empty() ? header.name + ";" : header.name + ": " + header.value)) {
      return std::unexpected(TransportError{TransportErrc::failed, "curl: out of memory building headers"});
    }
  }
  if (!has_content_type) add("Content-Type:");
  if (!has_expect) add("Expect:");

  const long timeout_ms = std::max<long>(1, static_cast<long>(timeout.count()));
  const long connect_ms = std::max<long>(1, std::min<long>(timeout_ms, static_cast<long>(options.connect_timeout.count())));

  curl_easy_setopt(h, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
  curl_easy_setopt(h, CURLOPT_ERRORBUFFER, error_buffer);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &sink);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, &on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &sink);
  curl_easy_setopt(h, CURLOPT_SSLVERSION, static_cast<long>(CURL_SSLVERSION_TLSv1_2));  // at least 1.2
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, options.verify_tls ? 1L : 0L);
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, options.verify_tls ? 2L : 0L);
  if (!options.ca_file.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, options.ca_file.c_str());
  curl_blob key_blob{};
  if (!options.cert_file.empty()) {
    // The key as read (and checked) at start, from memory: no second look at the file.
    curl_easy_setopt(h, CURLOPT_SSLCERT, options.cert_file.c_str());
    curl_easy_setopt(h, CURLOPT_SSLCERTTYPE, "PEM");
    key_blob.data = impl_->key_pem.data();
    key_blob.len = impl_->key_pem.size();
    key_blob.flags = CURL_BLOB_NOCOPY;
    curl_easy_setopt(h, CURLOPT_SSLKEY_BLOB, &key_blob);
    curl_easy_setopt(h, CURLOPT_SSLKEYTYPE, "PEM");
    if (!impl_->passphrase.empty()) curl_easy_setopt(h, CURLOPT_KEYPASSWD, impl_->passphrase.c_str());
  }
  if (!options.user_agent.empty() && !find_header(request.headers, "User-Agent")) {
    curl_easy_setopt(h, CURLOPT_USERAGENT, options.user_agent.c_str());
  }

  const std::string& method = request.method;
  if (method == "HEAD") {
    curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
  } else if (method == "GET" && request.body.empty()) {
    curl_easy_setopt(h, CURLOPT_HTTPGET, 1L);
  } else {
    // A body (possibly empty, sent as Content-Length: 0 for POST, PUT and PATCH) from memory.
    if (!request.body.empty() || method == "POST" || method == "PUT" || method == "PATCH") {
      curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
      curl_easy_setopt(h, CURLOPT_POSTFIELDS, request.body.data());
    }
    if (method != "POST") curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method.c_str());
  }

  const CURLcode rc = curl_easy_perform(h);
  if (rc != CURLE_OK) {
    auto error = map_error(rc, h, error_buffer, sink.too_large, sink.max_body, request.url);
    impl_->release(std::move(handle));
    return std::unexpected(std::move(error));
  }
  long status = 0;
  curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  sink.response.status = static_cast<int>(status);
  impl_->release(std::move(handle));
  return std::move(sink.response);
}

}  // namespace idem::client
