#include "record_codec.hpp"

#include <charconv>
#include <cstdint>

#include "idem/headers_codec.hpp"

namespace idem::redis_detail {
namespace {

constexpr char kHex[] = "0123456789ABCDEF";

bool needs_escape(unsigned char c) { return c < 0x21 || c > 0x7e || c == '%' || c == '{' || c == '}' || c == ':'; }

void escape_into(std::string& out, std::string_view in) {
  for (unsigned char c : in) {
    if (needs_escape(c)) {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0x0f]);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;  // lowercase never comes out of escape_into: accepting it would make two spellings
}

std::optional<std::string> unescape(std::string_view in) {
  std::string out;
  out.reserve(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    const auto c = static_cast<unsigned char>(in[i]);
    if (c != '%') {
      if (needs_escape(c)) return std::nullopt;
      out.push_back(static_cast<char>(c));
      continue;
    }
    if (i + 2 >= in.size()) return std::nullopt;
    const int hi = hex_value(in[i + 1]), lo = hex_value(in[i + 2]);
    if (hi < 0 || lo < 0) return std::nullopt;
    const auto decoded = static_cast<unsigned char>(hi * 16 + lo);
    if (!needs_escape(decoded)) return std::nullopt;  // canonical form only
    out.push_back(static_cast<char>(decoded));
    i += 2;
  }
  return out;
}

template <class Int>
bool parse_int(std::string_view text, Int& out) {
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  return ec == std::errc{} && ptr == text.data() + text.size() && !text.empty();
}

StoreError corrupt(const RecordId& id, std::string what) {
  return StoreError{StoreErrc::corrupt, "redis record (" + id.tenant + ", " + id.key + "): " + what, false};
}

}  // namespace

std::string record_key(std::string_view prefix, const RecordId& id) {
  std::string out;
  out.reserve(prefix.size() + id.tenant.size() + id.key.size() + 3);
  out.append(prefix);
  out.push_back('{');
  escape_into(out, id.tenant);
  out.push_back(':');
  escape_into(out, id.key);
  out.push_back('}');
  return out;
}

std::optional<RecordId> parse_record_key(std::string_view prefix, std::string_view k) {
  if (!k.starts_with(prefix)) return std::nullopt;
  k.remove_prefix(prefix.size());
  if (k.size() < 3 || k.front() != '{' || k.back() != '}') return std::nullopt;
  k = k.substr(1, k.size() - 2);
  const auto colon = k.find(':');
  if (colon == std::string_view::npos) return std::nullopt;
  auto tenant = unescape(k.substr(0, colon));
  auto key = unescape(k.substr(colon + 1));
  if (!tenant || !key) return std::nullopt;
  return RecordId{std::move(*tenant), std::move(*key)};
}

std::string scan_pattern(std::string_view prefix) {
  std::string out;
  for (char c : prefix) {
    if (c == '*' || c == '?' || c == '[' || c == ']' || c == '\\') out.push_back('\\');
    out.push_back(c);
  }
  out += "{*";
  return out;
}

std::string ms_text(TimePoint t) { return std::to_string(to_epoch_ms(t)); }

StoreResult<std::optional<Record>> decode_record(const RecordId& id, const Reply& fields) {
  if (!fields.is_array() || fields.elements.size() % 2 != 0) return std::unexpected(corrupt(id, "not a field list"));
  if (fields.elements.empty()) return std::optional<Record>{};
  Record r;
  r.tenant = id.tenant;
  r.key = id.key;
  bool have_state = false, have_hash = false, have_token = false, have_expires = false, have_created = false;
  std::optional<int> status;
  std::optional<std::string> headers_blob, body;
  for (std::size_t i = 0; i < fields.elements.size(); i += 2) {
    const std::string& name = fields.elements[i].str;
    const std::string& value = fields.elements[i + 1].str;
    std::int64_t ms = 0;
    if (name == "state") {
      auto s = parse_record_state(value);
      if (!s) return std::unexpected(corrupt(id, "unknown state \"" + value + "\""));
      r.state = *s;
      have_state = true;
    } else if (name == "hash") {
      r.request_hash = value;
      have_hash = true;
    } else if (name == "token") {
      if (!parse_int(value, r.fencing_token)) return std::unexpected(corrupt(id, "bad token"));
      have_token = true;
    } else if (name == "lease_expires" || name == "created" || name == "completed" || name == "expires") {
      if (!parse_int(value, ms)) return std::unexpected(corrupt(id, "bad " + name));
      if (name == "lease_expires") r.lease_expires = from_epoch_ms(ms);
      if (name == "created") r.created = from_epoch_ms(ms), have_created = true;
      if (name == "completed") r.completed = from_epoch_ms(ms);
      if (name == "expires") r.expires = from_epoch_ms(ms), have_expires = true;
    } else if (name == "status") {
      int s = 0;
      if (!parse_int(value, s)) return std::unexpected(corrupt(id, "bad status"));
      status = s;
    } else if (name == "headers") {
      headers_blob = value;
    } else if (name == "body") {
      body = value;
    }
    // Unknown fields are ignored: a later version may add some.
  }
  if (!have_state || !have_hash || !have_token || !have_expires || !have_created) {
    return std::unexpected(corrupt(id, "missing fields"));
  }
  if (status) {
    StoredResponse response;
    response.status = *status;
    if (headers_blob) {
      auto h = idem::decode_headers(*headers_blob);
      if (!h) return std::unexpected(corrupt(id, "bad headers"));
      response.headers = std::move(*h);
    }
    if (body) response.body = std::move(*body);
    r.response = std::move(response);
  }
  return std::optional<Record>{std::move(r)};
}

}  // namespace idem::redis_detail
