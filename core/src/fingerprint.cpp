#include "idem/fingerprint.hpp"

#include <openssl/evp.h>
#include <openssl/opensslv.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <new>
#include <optional>
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

// The value of parameter `name` in a header value `type; a=b; name="x"` (case-insensitive
// names; quoted-string values unescaped); nullopt when absent or malformed.
std::optional<std::string> header_parameter(std::string_view value, std::string_view name) {
  std::size_t i = value.find(';');
  while (i != std::string_view::npos && i < value.size()) {
    ++i;  // past ';'
    while (i < value.size() && (value[i] == ' ' || value[i] == '\t')) ++i;
    const std::size_t eq = value.find('=', i);
    if (eq == std::string_view::npos) return std::nullopt;
    const std::string_view key = trim_ows(value.substr(i, eq - i));
    std::size_t j = eq + 1;
    while (j < value.size() && (value[j] == ' ' || value[j] == '\t')) ++j;
    std::string parsed;
    if (j < value.size() && value[j] == '"') {
      ++j;
      bool closed = false;
      while (j < value.size()) {
        if (value[j] == '\\' && j + 1 < value.size()) {
          parsed += value[j + 1];
          j += 2;
        } else if (value[j] == '"') {
          closed = true;
          ++j;
          break;
        } else {
          parsed += value[j++];
        }
      }
      if (!closed) return std::nullopt;
      i = value.find(';', j);
    } else {
      const std::size_t end = value.find(';', j);
      parsed = std::string(trim_ows(value.substr(j, end == std::string_view::npos ? std::string_view::npos : end - j)));
      i = end;
    }
    if (iequals(key, name)) return parsed;
  }
  return std::nullopt;
}

std::string lowered(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), ascii_lower);
  return out;
}

enum class BodyKind { json, form, multipart, raw };

// From Content-Type's media type; parameters (charset, ...) do not matter, except a multipart
// body's boundary, which is returned in `boundary`.
BodyKind body_kind(std::span<const HeaderView> headers, std::string& boundary) {
  const std::string_view content_type = find_header(headers, "Content-Type");
  const std::string_view media = trim_ows(content_type.substr(0, content_type.find(';')));
  if (iequals(media, "application/json")) return BodyKind::json;
  if (iequals(media, "application/x-www-form-urlencoded")) return BodyKind::form;
  if (iequals(media, "multipart/form-data")) {
    if (auto b = header_parameter(content_type, "boundary"); b && !b->empty() && b->size() <= 200) {
      boundary = std::move(*b);
      return BodyKind::multipart;
    }
    return BodyKind::raw;  // no boundary: the parts cannot be found
  }
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

std::optional<std::string> canonical_multipart(std::string_view body, std::string_view boundary) {
  if (boundary.empty()) return std::nullopt;
  const std::string delimiter = "--" + std::string(boundary);
  const std::string separator = "\r\n" + delimiter;
  // The first delimiter opens the body or follows the preamble's CRLF (RFC 2046 §5.1.1).
  std::size_t pos;
  if (body.starts_with(delimiter)) {
    pos = delimiter.size();
  } else {
    const std::size_t found = body.find(separator);
    if (found == std::string_view::npos) return std::nullopt;
    pos = found + separator.size();
  }
  std::string out;
  out.reserve(body.size() + 64);
  for (;;) {
    // After a delimiter: "--" closes the body (the epilogue is ignored), else padding and CRLF.
    if (body.compare(pos, 2, "--") == 0) return out;
    while (pos < body.size() && (body[pos] == ' ' || body[pos] == '\t')) ++pos;
    if (body.compare(pos, 2, "\r\n") != 0) return std::nullopt;
    pos += 2;
    const std::size_t end = body.find(separator, pos);
    if (end == std::string_view::npos) return std::nullopt;  // never closed: not a multipart body
    const std::string_view part = body.substr(pos, end - pos);
    pos = end + separator.size();

    // The part's headers end at the first empty line; a part may have none.
    std::string_view head, content;
    if (part.starts_with("\r\n")) {
      content = part.substr(2);
    } else {
      const std::size_t blank = part.find("\r\n\r\n");
      if (blank == std::string_view::npos) return std::nullopt;
      head = part.substr(0, blank);
      content = part.substr(blank + 4);
    }
    // What identifies a part: its Content-Disposition (type, name, filename, filename*),
    // Content-Type and Content-Transfer-Encoding. Other part headers (a client's own
    // Content-Length, say) say nothing about the request.
    std::string disposition_type, name, filename, filename_ext, type, encoding;
    bool has_filename = false, has_filename_ext = false;
    std::size_t line_start = 0;
    while (line_start <= head.size()) {
      std::size_t line_end = head.find("\r\n", line_start);
      if (line_end == std::string_view::npos) line_end = head.size();
      // Obsolete line folding: continuation lines start with a space or a tab.
      while (line_end + 2 < head.size() && (head[line_end + 2] == ' ' || head[line_end + 2] == '\t')) {
        const std::size_t next = head.find("\r\n", line_end + 2);
        line_end = next == std::string_view::npos ? head.size() : next;
      }
      const std::string_view line = head.substr(line_start, line_end - line_start);
      line_start = line_end + 2;
      const std::size_t colon = line.find(':');
      if (colon == std::string_view::npos) {
        if (trim_ows(line).empty()) continue;
        return std::nullopt;
      }
      const std::string_view field = trim_ows(line.substr(0, colon));
      const std::string_view value = trim_ows(line.substr(colon + 1));
      if (iequals(field, "Content-Disposition")) {
        disposition_type = lowered(trim_ows(value.substr(0, value.find(';'))));
        name = header_parameter(value, "name").value_or("");
        if (auto f = header_parameter(value, "filename")) {
          has_filename = true;
          filename = std::move(*f);
        }
        if (auto f = header_parameter(value, "filename*")) {
          has_filename_ext = true;
          filename_ext = std::move(*f);
        }
      } else if (iequals(field, "Content-Type")) {
        const std::size_t semi = value.find(';');
        type = lowered(trim_ows(value.substr(0, semi)));
        if (semi != std::string_view::npos) type += std::string(value.substr(semi));
      } else if (iequals(field, "Content-Transfer-Encoding")) {
        encoding = lowered(value);
      }
    }
    append_field(out, "part");
    append_field(out, disposition_type);
    append_field(out, name);
    append_field(out, has_filename ? "1" : "0");
    append_field(out, filename);
    append_field(out, has_filename_ext ? "1" : "0");
    append_field(out, filename_ext);
    append_field(out, type);
    append_field(out, encoding);
    append_field(out, content);
  }
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
  std::string boundary;
  switch (body_kind(request.headers, boundary)) {
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
    case BodyKind::multipart:
      // The boundary is random per request (curl -F makes a new one each run): the parts are
      // the request, not the bytes between them. A body that does not parse is hashed raw.
      if (auto parts = canonical_multipart(request.body, boundary)) {
        canonical = std::move(*parts);
        body = canonical;
        kind = "multipart";
      }
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
