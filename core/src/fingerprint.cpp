#include "idem/fingerprint.hpp"

#include <openssl/evp.h>
#include <openssl/opensslv.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <new>
#include <stdexcept>
#include <vector>

#include "idem/jcs.hpp"

namespace idem {
namespace {

const EVP_MD* sha256_md() {
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
  // Fetched once: the implicit fetch behind EVP_sha256() costs a lookup on every init.
  static const EVP_MD* md = [] {
    const EVP_MD* fetched = EVP_MD_fetch(nullptr, "SHA256", nullptr);
    return fetched != nullptr ? fetched : EVP_sha256();
  }();
  return md;
#else
  return EVP_sha256();
#endif
}

EVP_MD_CTX* ctx_of(void* ctx) { return static_cast<EVP_MD_CTX*>(ctx); }

std::string to_hex(const unsigned char* data, std::size_t size) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out(size * 2, '\0');
  for (std::size_t i = 0; i < size; ++i) {
    out[2 * i] = kHex[data[i] >> 4];
    out[2 * i + 1] = kHex[data[i] & 0xF];
  }
  return out;
}

// Appends one field of the hashed message: decimal length, ':', the bytes, '\n'.
void append_field(std::string& out, std::string_view field) {
  char digits[24];
  const auto r = std::to_chars(digits, digits + sizeof digits, field.size());
  out.append(digits, r.ptr);
  out += ':';
  out += field;
  out += '\n';
}

// The length prefix of a field whose bytes are hashed separately.
void append_field_prefix(std::string& out, std::size_t size) {
  char digits[24];
  const auto r = std::to_chars(digits, digits + sizeof digits, size);
  out.append(digits, r.ptr);
  out += ':';
}

char ascii_lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

std::string_view trim_ows(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

enum class BodyKind { json, form, raw };

// From Content-Type's media type; parameters (charset, ...) do not matter.
BodyKind body_kind(std::span<const HeaderView> headers) {
  std::string_view media = find_header(headers, "Content-Type");
  media = trim_ows(media.substr(0, media.find(';')));
  if (iequals(media, "application/json")) return BodyKind::json;
  if (iequals(media, "application/x-www-form-urlencoded")) return BodyKind::form;
  constexpr std::string_view kJsonSuffix = "+json";  // application/problem+json, ...
  const std::size_t slash = media.find('/');
  if (slash != std::string_view::npos && slash > 0 &&
      media.size() > slash + 1 + kJsonSuffix.size() &&
      iequals(media.substr(media.size() - kJsonSuffix.size()), kJsonSuffix)) {
    return BodyKind::json;
  }
  return BodyKind::raw;
}

bool is_unreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '.' || c == '_' || c == '~';
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Percent-decodes `s` onto `out` ('+' is a space; a '%' not followed by two hex digits is kept).
void form_decode(std::string_view s, std::string& out) {
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (c == '+') {
      out += ' ';
    } else if (c == '%' && i + 2 < s.size() && hex_value(s[i + 1]) >= 0 &&
               hex_value(s[i + 2]) >= 0) {
      out += static_cast<char>(hex_value(s[i + 1]) * 16 + hex_value(s[i + 2]));
      i += 2;
    } else {
      out += c;
    }
  }
}

void form_encode(std::string_view s, std::string& out) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (is_unreserved(c)) {
      out += ch;
    } else {
      const char esc[] = {'%', kHex[c >> 4], kHex[c & 0xF]};
      out.append(esc, sizeof esc);
    }
  }
}

}  // namespace

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (ctx_ == nullptr) throw std::bad_alloc();
  if (EVP_DigestInit_ex(ctx_of(ctx_), sha256_md(), nullptr) != 1) {
    EVP_MD_CTX_free(ctx_of(ctx_));
    throw std::runtime_error("OpenSSL: SHA-256 unavailable");
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(ctx_of(ctx_)); }

void Sha256::update(std::string_view data) {
  EVP_DigestUpdate(ctx_of(ctx_), data.data(), data.size());
}

std::string Sha256::hex_digest() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_DigestFinal_ex(ctx_of(ctx_), md, &size);
  return to_hex(md, size);
}

void Sha256::reset() {
  if (EVP_DigestInit_ex(ctx_of(ctx_), sha256_md(), nullptr) != 1) {
    throw std::runtime_error("OpenSSL: SHA-256 unavailable");
  }
}

std::string sha256_hex(std::string_view data) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  if (EVP_Digest(data.data(), data.size(), md, &size, sha256_md(), nullptr) != 1) {
    throw std::runtime_error("OpenSSL: SHA-256 failed");
  }
  return to_hex(md, size);
}

std::string canonical_form_urlencoded(std::string_view text) {
  struct Pair {
    std::size_t name_off, name_len, value_off, value_len;
  };
  std::string decoded;
  decoded.reserve(text.size());
  std::vector<Pair> pairs;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find('&', begin), text.size());
    const std::string_view piece = text.substr(begin, end - begin);
    const std::size_t eq = piece.find('=');
    Pair pair{};
    pair.name_off = decoded.size();
    form_decode(piece.substr(0, eq), decoded);
    pair.name_len = decoded.size() - pair.name_off;
    pair.value_off = decoded.size();
    if (eq != std::string_view::npos) form_decode(piece.substr(eq + 1), decoded);
    pair.value_len = decoded.size() - pair.value_off;
    if (pair.name_len + pair.value_len > 0) pairs.push_back(pair);  // "" and "=" say nothing
    begin = end + 1;
  }
  auto name = [&](const Pair& p) { return std::string_view(decoded).substr(p.name_off, p.name_len); };
  auto value = [&](const Pair& p) {
    return std::string_view(decoded).substr(p.value_off, p.value_len);
  };
  std::sort(pairs.begin(), pairs.end(), [&](const Pair& a, const Pair& b) {
    const int c = name(a).compare(name(b));
    return c != 0 ? c < 0 : value(a) < value(b);
  });
  std::string out;
  out.reserve(text.size() + text.size() / 2);
  for (const Pair& p : pairs) {
    if (!out.empty()) out += '&';
    form_encode(name(p), out);
    out += '=';
    form_encode(value(p), out);
  }
  return out;
}

std::string fingerprint(const RequestView& request, const FingerprintOptions& options) {
  // Everything but the body goes into one buffer, so the hash sees three updates.
  std::string head;
  head.reserve(128 + request.path.size() + request.query.size());
  append_field(head, request.method);
  append_field(head, request.path);
  append_field(head, canonical_form_urlencoded(request.query));

  std::string headers;
  for (const std::string& configured : options.headers) {
    std::string name(configured);
    std::transform(name.begin(), name.end(), name.begin(), ascii_lower);
    for (const HeaderView& h : request.headers) {
      if (!iequals(h.name, name)) continue;
      append_field(headers, name);
      append_field(headers, trim_ows(h.value));
    }
  }
  append_field(head, headers);

  std::string canonical;
  std::string_view body = request.body;
  std::string_view kind = "raw";
  switch (body_kind(request.headers)) {
    case BodyKind::json:
      if (auto json = canonicalize_json(request.body, options.json_ignore)) {
        canonical = std::move(*json);
        body = canonical;
        kind = "json";
      }
      break;
    case BodyKind::form:
      canonical = canonical_form_urlencoded(request.body);
      body = canonical;
      kind = "form";
      break;
    case BodyKind::raw: break;
  }
  append_field(head, kind);
  append_field_prefix(head, body.size());

  // One context per thread, started over for each request: creating and freeing one costs two
  // allocations and about as much as hashing a small request.
  thread_local Sha256 hash;
  hash.reset();
  hash.update(head);
  hash.update(body);
  hash.update("\n");
  return hash.hex_digest();
}

}  // namespace idem
