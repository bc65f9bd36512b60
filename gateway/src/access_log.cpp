#include "idem/gateway/access_log.hpp"

#include <cstdint>
#include <cstdio>
#include <random>

#include "idem/gateway/log.hpp"

namespace idem::gateway {
namespace {

void append_number(std::string& out, double value) {
  char buf[32];
  const int n = std::snprintf(buf, sizeof buf, "%.2f", value);
  out.append(buf, static_cast<std::size_t>(n));
}

bool is_lower_hex(std::string_view s) {
  for (const char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}

bool all_zero(std::string_view s) { return s.find_first_not_of('0') == std::string_view::npos; }

// Request ids need to be unique, not secret: a per-thread generator seeded once from the OS.
std::uint64_t next_random() {
  thread_local std::mt19937_64 generator{[] {
    std::random_device device;
    return (static_cast<std::uint64_t>(device()) << 32) ^ device();
  }()};
  return generator();
}

void json_member(std::string& out, std::string_view name) {
  out += ",\"";
  out += name;
  out += "\":";
}

void json_optional_string(std::string& out, std::string_view name, const std::optional<std::string_view>& v) {
  json_member(out, name);
  if (v) {
    append_log_json_string(out, *v);
  } else {
    out += "null";
  }
}

}  // namespace

void append_log_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out += '"';
  for (const char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += ch;
    } else if (c < 0x20 || c >= 0x7f) {
      out += "\\u00";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    } else {
      out += ch;
    }
  }
  out += '"';
}

std::string render_text(const KeyLine& l) {
  std::string line;
  line.reserve(320);
  line += "key tenant=";
  if (l.tenant) {
    log::append_quoted(line, *l.tenant);
  } else {
    line += '-';
  }
  line += " key=";
  if (l.key) {
    log::append_quoted(line, *l.key);
  } else {
    line += '-';
  }
  line += " method=";
  line += l.method;
  line += " path=";
  log::append_quoted(line, l.path);
  line += " verdict=";
  line += l.verdict;
  if (!l.takeover.empty()) {
    line += " takeover=";
    line += l.takeover;
  }
  if (!l.lookup.empty()) {
    line += " lookup=";
    line += l.lookup;
  }
  if (l.attempt > 1) {
    line += " attempt=";
    line += std::to_string(l.attempt);
  }
  line += " status=";
  line += std::to_string(l.status);
  if (!l.record.empty()) {
    line += " record=";
    line += l.record;
  }
  if (!l.upstream_error.empty()) {
    line += " upstream=";
    line += l.upstream_error;
  }
  if (l.store_error) {
    line += " store_error=";
    log::append_quoted(line, *l.store_error);
  }
  if (l.reason) {
    line += " reason=";
    log::append_quoted(line, *l.reason);
  }
  line += " ms=";
  append_number(line, l.ms);
  if (l.upstream_ms) {
    line += " upstream_ms=";
    append_number(line, *l.upstream_ms);
  }
  line += " request_id=";
  log::append_quoted(line, l.request_id);
  if (l.trace_id) {
    line += " trace_id=";
    line += *l.trace_id;
  }
  return line;
}

std::string render_json_members(const KeyLine& l) {
  std::string out;
  out.reserve(384);
  out += "\"tenant\":";
  if (l.tenant) {
    append_log_json_string(out, *l.tenant);
  } else {
    out += "null";
  }
  json_optional_string(out, "key", l.key);
  json_member(out, "method");
  append_log_json_string(out, l.method);
  json_member(out, "path");
  append_log_json_string(out, l.path);
  json_member(out, "verdict");
  append_log_json_string(out, l.verdict);
  if (!l.takeover.empty()) {
    json_member(out, "takeover");
    append_log_json_string(out, l.takeover);
  }
  if (!l.lookup.empty()) {
    json_member(out, "lookup");
    append_log_json_string(out, l.lookup);
  }
  if (l.attempt > 0) {
    json_member(out, "attempt");
    out += std::to_string(l.attempt);
  }
  json_member(out, "status");
  out += std::to_string(l.status);
  if (!l.record.empty()) {
    json_member(out, "record");
    append_log_json_string(out, l.record);
  }
  if (!l.upstream_error.empty()) {
    json_member(out, "upstream_error");
    append_log_json_string(out, l.upstream_error);
  }
  if (l.store_error) {
    json_member(out, "store_error");
    append_log_json_string(out, *l.store_error);
  }
  if (l.reason) {
    json_member(out, "reason");
    append_log_json_string(out, *l.reason);
  }
  json_member(out, "ms");
  append_number(out, l.ms);
  json_member(out, "upstream_ms");
  if (l.upstream_ms) {
    append_number(out, *l.upstream_ms);
  } else {
    out += "null";
  }
  json_member(out, "request_id");
  append_log_json_string(out, l.request_id);
  json_optional_string(out, "trace_id", l.trace_id);
  return out;
}

std::optional<std::string_view> trace_id_of(std::span<const HeaderView> headers) {
  std::optional<std::string_view> value;
  for (const auto& h : headers) {
    if (!iequals(h.name, "traceparent")) continue;
    if (value) return std::nullopt;  // W3C: several traceparent headers are invalid
    value = h.value;
  }
  if (!value) return std::nullopt;
  // version "-" trace-id "-" parent-id "-" flags: 2 + 1 + 32 + 1 + 16 + 1 + 2 = 55 characters; a
  // later version may append "-..." fields, version 00 may not.
  const std::string_view v = *value;
  if (v.size() < 55 || v[2] != '-' || v[35] != '-' || v[52] != '-') return std::nullopt;
  const std::string_view version = v.substr(0, 2), trace = v.substr(3, 32), parent = v.substr(36, 16),
                         flags = v.substr(53, 2);
  if (!is_lower_hex(version) || version == "ff" || !is_lower_hex(trace) || !is_lower_hex(parent) ||
      !is_lower_hex(flags) || all_zero(trace) || all_zero(parent)) {
    return std::nullopt;
  }
  if (version == "00" ? v.size() != 55 : (v.size() > 55 && v[55] != '-')) return std::nullopt;
  return trace;
}

std::string_view request_id_of(std::span<const HeaderView> headers, std::string& generated) {
  for (const auto& h : headers) {
    if (!iequals(h.name, "X-Request-Id")) continue;
    const std::string_view v = h.value;
    bool visible = !v.empty() && v.size() <= 128;
    for (const char c : v) visible = visible && c > 0x20 && c < 0x7f;
    if (visible) return v;
    break;
  }
  static constexpr char kHex[] = "0123456789abcdef";
  generated.clear();
  for (int word = 0; word < 2; ++word) {
    std::uint64_t bits = next_random();
    for (int i = 0; i < 16; ++i, bits >>= 4) generated += kHex[bits & 0xf];
  }
  return generated;
}

}  // namespace idem::gateway
