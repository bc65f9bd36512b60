#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "idem/http_view.hpp"

namespace idem {

/// What goes into a request fingerprint besides method, path, query and body (SPEC §5).
struct FingerprintOptions {
  /// RFC 6901 JSON Pointers left out of JSON bodies, e.g. "/client_ts".
  std::vector<std::string> json_ignore;
  /// Header names whose values are included (none by default), e.g. "Content-Type".
  std::vector<std::string> headers;
};

/// The request fingerprint: lowercase hex of
/// sha256(method "\n" path "\n" canonical query "\n" selected headers "\n" canonical body).
/// JSON bodies (application/json, *+json) are canonicalised with RFC 8785; invalid JSON is hashed
/// raw. application/x-www-form-urlencoded bodies are decoded and sorted; anything else is raw.
std::string fingerprint(const RequestView& request, const FingerprintOptions& options = {});

/// The canonical form of a query string or form-urlencoded body: pairs percent-decoded ('+' is a
/// space), sorted by name then value, re-encoded uniformly, joined with '&'.
std::string canonical_form_urlencoded(std::string_view text);

/// Lowercase hex SHA-256 of `data` (OpenSSL).
std::string sha256_hex(std::string_view data);

/// Incremental SHA-256, so large inputs are hashed without concatenating them first.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  /// Adds bytes to the hash.
  void update(std::string_view data);
  /// Lowercase hex digest; the object must not be updated afterwards.
  std::string hex_digest();

 private:
  void* ctx_;  // EVP_MD_CTX*, kept opaque so OpenSSL stays out of public headers
};

}  // namespace idem
