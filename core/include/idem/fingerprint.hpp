#pragma once

#include <optional>
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
/// raw. application/x-www-form-urlencoded bodies are decoded and sorted; multipart/form-data
/// bodies are reduced to their parts (canonical_multipart), so the random boundary does not
/// count; anything else is raw.
///
/// Exact format (version 1). Every field is framed as its length in decimal, ':', its bytes and
/// '\n', so no content (a path or body holding "\n", say) can be read as a field boundary:
///
///   field(method) field(path) field(canonical_form_urlencoded(query))
///   field(selected headers) field(body kind) field(canonical body)
///
/// e.g. "4:POST\n9:/payments\n0:\n0:\n4:json\n9:{\"a\":1}\n". Method and path are taken as
/// given (no case folding, no path normalisation). Selected headers: for each name in
/// `options.headers`, in that order and lowercased, for each header of that name in request
/// order, field(name) field(value without leading/trailing spaces and tabs); a header that is
/// absent contributes nothing. The body kind is "json" (RFC 8785 form, `json_ignore` left out),
/// "form" (canonical_form_urlencoded), "multipart" (canonical_multipart, with the Content-Type's
/// boundary parameter) or "raw" (the bytes as received), chosen by the media type of the first
/// Content-Type header (case-insensitive, parameters ignored but the boundary); so a JSON body
/// that is not valid JSON, or a multipart body that does not parse, is "raw".
std::string fingerprint(const RequestView& request, const FingerprintOptions& options = {});

/// The canonical form of a query string or form-urlencoded body: pairs percent-decoded ('+' is a
/// space), sorted by name then value, re-encoded uniformly, joined with '&'.
///
/// Pairs split on '&', then on the first '='. A '%' not followed by two hex digits stays a
/// literal '%'. A name without '=' has an empty value ("a" reads as "a="); pairs with empty name
/// and value ("", "=") are dropped. Sorting is bytewise on the decoded bytes; re-encoding keeps
/// A-Z a-z 0-9 - . _ ~ and writes every other byte as %XX (uppercase), so "a=1&b" becomes
/// "a=1&b=" and "b=x+y&a=%7e" becomes "a=~&b=x%20y".
std::string canonical_form_urlencoded(std::string_view text);

/// The canonical form of a multipart/form-data body (RFC 7578, RFC 2046 §5.1) delimited by
/// `boundary`: for each part, in order, field("part") field(disposition type, lowercased)
/// field(name) field("1" or "0": has a filename) field(filename) field("1" or "0": has
/// filename*) field(filename*) field(Content-Type: media type lowercased, parameters as sent)
/// field(Content-Transfer-Encoding, lowercased) field(content bytes), each field framed as in
/// fingerprint(). The preamble, the epilogue, the boundary itself and every other part header are
/// left out. nullopt when the body is not a closed multipart body with that boundary.
std::optional<std::string> canonical_multipart(std::string_view body, std::string_view boundary);

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
  /// Lowercase hex digest; the object must not be updated afterwards, until reset().
  std::string hex_digest();
  /// Starts a new hash, reusing OpenSSL's context (no allocation).
  void reset();

 private:
  void* ctx_;  // EVP_MD_CTX*, kept opaque so OpenSSL stays out of public headers
};

}  // namespace idem
