#include "idem/client/curl_transport.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <mutex>
#include <vector>

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

// The one place that decides what a libcurl failure means for a retry.
TransportError map_error(CURLcode code, CURL* h, const char* detail, bool too_large, std::size_t max_body) {
  TransportError error;
  std::string message = "curl: ";
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
  std::mutex mutex;
  std::vector<Easy> idle;  // handles keep their connection caches between calls

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

CurlTransport::CurlTransport(CurlOptions options) : impl_(std::make_unique<Impl>()) {
  global_init();
  impl_->options = std::move(options);
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
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, options.verify_tls ? 1L : 0L);
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, options.verify_tls ? 2L : 0L);
  if (!options.ca_file.empty()) curl_easy_setopt(h, CURLOPT_CAINFO, options.ca_file.c_str());
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
    auto error = map_error(rc, h, error_buffer, sink.too_large, sink.max_body);
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
