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

char state_letter(RecordState state) {
  switch (state) {
    case RecordState::in_progress: return 'I';
    case RecordState::completed: return 'C';
    case RecordState::failed_retryable: return 'F';
  }
  return 'I';
}

std::optional<RecordState> state_of_letter(char c) {
  if (c == 'I') return RecordState::in_progress;
  if (c == 'C') return RecordState::completed;
  if (c == 'F') return RecordState::failed_retryable;
  return std::nullopt;
}

// Splits off the text up to the next '|'; nullopt when there is none.
std::optional<std::string_view> next_field(std::string_view& rest) {
  const auto bar = rest.find('|');
  if (bar == std::string_view::npos) return std::nullopt;
  auto field = rest.substr(0, bar);
  rest.remove_prefix(bar + 1);
  return field;
}

// Whether a header field is decimal digits only, as lua/record.lua's pattern demands (an empty
// field passes here; the fields that must not be empty fail to parse as numbers).
bool digits_only(std::string_view text) {
  for (char c : text) {
    if (c < '0' || c > '9') return false;
  }
  return true;
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

std::string encode_record(const Record& r) {
  std::string headers;
  std::string_view body;
  std::string status;
  if (r.response) {
    headers = encode_headers(r.response->headers);
    body = r.response->body;
    status = std::to_string(r.response->status);
  }
  std::string out;
  out.reserve(112 + r.request_hash.size() + r.lookup.size() + headers.size() + body.size());
  out.push_back(state_letter(r.state));
  out += std::to_string(r.attempt);
  for (const std::string& field :
       {std::to_string(r.fencing_token), ms_text(r.lease_expires), ms_text(r.created), ms_text(r.expires),
        r.completed ? ms_text(*r.completed) : std::string(), status, std::to_string(r.request_hash.size()),
        std::to_string(headers.size()), std::to_string(r.lookup.size())}) {
    out.push_back('|');
    out += field;
  }
  out.push_back('|');
  out += r.request_hash;
  out += r.lookup;
  out += headers;
  out += body;
  return out;
}

namespace {

// The state letter and the attempt digits after it; `v` is left after the first '|'. An attempt
// without digits is the earlier layout (no attempt, no lookup_len): `legacy` says so.
struct Lead {
  RecordState state;
  std::string_view attempt;
  bool legacy;
};
std::optional<Lead> split_lead(std::string_view& v) {
  auto first = next_field(v);
  if (!first || first->empty()) return std::nullopt;
  auto state = state_of_letter(first->front());
  const std::string_view attempt = first->substr(1);
  if (!state || !digits_only(attempt)) return std::nullopt;
  return Lead{*state, attempt, attempt.empty()};
}

}  // namespace

std::optional<RecordHead> parse_record_head(std::string_view v) {
  auto lead = split_lead(v);
  if (!lead) return std::nullopt;
  std::optional<std::string_view> expires;
  for (int i = 0; i < 4; ++i) expires = next_field(v);  // token, lease_expires, created, expires
  RecordHead head;
  head.state = lead->state;
  if (!expires || !parse_int(*expires, head.expires_ms)) return std::nullopt;
  return head;
}

StoreResult<Record> decode_record(const RecordId& id, std::string_view v) {
  auto bad = [&](std::string what) { return std::unexpected(corrupt(id, std::move(what))); };
  auto lead = split_lead(v);
  if (!lead) return bad("not a record");
  std::string_view fields[9];  // token .. headers_len, lookup_len
  const std::size_t count = lead->legacy ? 8 : 9;
  for (std::size_t i = 0; i < count; ++i) {
    auto next = next_field(v);
    if (!next || !digits_only(*next)) return bad("malformed header");
    fields[i] = *next;
  }
  const auto& [token, lease, created, expires, completed, status, hash_len, headers_len, lookup_len] = fields;
  Record r;
  r.tenant = id.tenant;
  r.key = id.key;
  r.state = lead->state;
  std::int64_t ms = 0;
  std::size_t hash_size = 0, headers_size = 0, lookup_size = 0;
  if (!lead->legacy && (!parse_int(lead->attempt, r.attempt) || r.attempt == 0)) return bad("bad attempt");
  if (!lead->legacy && !parse_int(lookup_len, lookup_size)) return bad("bad lengths");
  if (!parse_int(token, r.fencing_token)) return bad("bad token");
  if (!lease.empty()) {
    if (!parse_int(lease, ms)) return bad("bad lease_expires");
    r.lease_expires = from_epoch_ms(ms);
  }
  if (!parse_int(created, ms)) return bad("bad created");
  r.created = from_epoch_ms(ms);
  if (!parse_int(expires, ms)) return bad("bad expires");
  r.expires = from_epoch_ms(ms);
  if (!completed.empty()) {
    if (!parse_int(completed, ms)) return bad("bad completed");
    r.completed = from_epoch_ms(ms);
  }
  if (!parse_int(hash_len, hash_size) || !parse_int(headers_len, headers_size) || hash_size > v.size() ||
      lookup_size > v.size() - hash_size || headers_size > v.size() - hash_size - lookup_size) {
    return bad("bad lengths");
  }
  r.request_hash = std::string(v.substr(0, hash_size));
  v.remove_prefix(hash_size);
  r.lookup = std::string(v.substr(0, lookup_size));
  v.remove_prefix(lookup_size);
  if (!status.empty()) {
    StoredResponse response;
    if (!parse_int(status, response.status)) return bad("bad status");
    auto headers = idem::decode_headers(v.substr(0, headers_size));
    if (!headers) return bad("bad headers");
    response.headers = std::move(*headers);
    response.body = std::string(v.substr(headers_size));
    r.response = std::move(response);
  } else if (r.state == RecordState::completed) {
    return bad("completed without a status");
  }
  return r;
}

StoreResult<std::optional<Record>> decode_legacy_record(const RecordId& id, const Reply& fields) {
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
