#include "idem/http/lookup.hpp"

#include <charconv>
#include <initializer_list>
#include <optional>
#include <vector>

#include "idem/engine.hpp"
#include "idem/http/message.hpp"
#include "idem/http_view.hpp"

namespace idem::http {
namespace {

constexpr std::string_view kKeyPlaceholder = "{key}";
constexpr std::string_view kTenantPlaceholder = "{tenant}";
constexpr std::size_t kMaxTarget = 2048;

bool unreserved(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '.' ||
         c == '_' || c == '~';
}

void append_encoded(std::string& out, std::string_view value) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (const char ch : value) {
    const auto c = static_cast<unsigned char>(ch);
    if (unreserved(c)) {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0x0f]);
    }
  }
}

// The values of every header called `name`.
std::vector<std::string_view> values_of(const Headers& headers, std::string_view name) {
  std::vector<std::string_view> out;
  for (const Header& h : headers) {
    if (iequals(h.name, name)) out.push_back(h.value);
  }
  return out;
}

LookupResult answer(LookupAnswer a, std::string detail) {
  LookupResult r;
  r.answer = a;
  r.detail = std::move(detail);
  return r;
}

std::string quoted(std::string_view s) {
  std::string out = "\"";
  for (const char c : s.substr(0, 80)) out.push_back(static_cast<unsigned char>(c) < 0x20 ? '?' : c);
  if (s.size() > 80) out += "...";
  return out + "\"";
}

// nullopt when the answer names `key` in exactly one key header; else why not.
std::optional<LookupResult> check_key(const LookupReply& reply, std::string_view key, const LookupRules& rules) {
  const auto named = values_of(reply.headers, rules.key_header);
  if (named.empty()) {
    return answer(LookupAnswer::malformed, "the answer (" + std::to_string(reply.status) + ") has no " +
                                               rules.key_header + " header naming the key it is about");
  }
  if (named.size() > 1) {
    return answer(LookupAnswer::malformed, "the answer has " + std::to_string(named.size()) + " " + rules.key_header +
                                               " headers");
  }
  if (named.front() != key) {
    return answer(LookupAnswer::mismatch, "the answer is about the key " + quoted(named.front()) + ", not this one");
  }
  return std::nullopt;
}

bool is_contract_header(std::string_view name, const LookupRules& rules) {
  for (const std::string_view own : {std::string_view(rules.key_header), kTenantHeader, kAttemptHeader,
                                     kLookupHeader, kOriginalStatusHeader}) {
    if (iequals(name, own)) return true;
  }
  return false;
}

}  // namespace

std::expected<Lookup, std::string> parse_lookup(std::string_view text) {
  const auto space = text.find(' ');
  if (space == std::string_view::npos) {
    return std::unexpected("expected \"GET /path/{key}\" (a method, one space, a path with {key} or {tenant})");
  }
  const std::string_view method = text.substr(0, space);
  const std::string_view target = text.substr(space + 1);
  if (method != "GET") {
    return std::unexpected("the lookup must be a GET (it only asks; it must change nothing), not " + quoted(method));
  }
  if (target.empty() || target.front() != '/') return std::unexpected("the lookup's path must start with \"/\"");
  if (target.size() > kMaxTarget) return std::unexpected("the lookup's path is longer than 2048 characters");
  for (std::size_t i = 0; i < target.size(); ++i) {
    const auto c = static_cast<unsigned char>(target[i]);
    if (c <= 0x20 || c >= 0x7f || c == '#') {
      return std::unexpected("the lookup's path has a space, a control or non-ASCII character, or a '#'");
    }
    if (c == '{') {
      const std::string_view rest = target.substr(i);
      const std::size_t len = rest.starts_with(kKeyPlaceholder)      ? kKeyPlaceholder.size()
                              : rest.starts_with(kTenantPlaceholder) ? kTenantPlaceholder.size()
                                                                     : 0;
      if (len == 0) return std::unexpected("the lookup's only placeholders are {key} and {tenant}");
      i += len - 1;
    } else if (c == '}') {
      return std::unexpected("the lookup's path has a '}' that closes no {key} or {tenant}");
    }
  }
  return Lookup{std::string(target)};
}

std::string lookup_target(const Lookup& lookup, std::string_view tenant, std::string_view key) {
  std::string out;
  const std::string_view t = lookup.target;
  out.reserve(t.size() + key.size() * 3 + tenant.size() * 3);
  for (std::size_t i = 0; i < t.size();) {
    const std::string_view rest = t.substr(i);
    if (rest.starts_with(kKeyPlaceholder)) {
      append_encoded(out, key);
      i += kKeyPlaceholder.size();
    } else if (rest.starts_with(kTenantPlaceholder)) {
      append_encoded(out, tenant);
      i += kTenantPlaceholder.size();
    } else {
      out.push_back(t[i++]);
    }
  }
  return out;
}

Headers lookup_request_headers(const LookupHeaders& names, std::string_view tenant, std::string_view key,
                               std::uint32_t attempt) {
  return Headers{{names.key, std::string(key)},
                 {names.tenant, std::string(tenant)},
                 {names.attempt, std::to_string(attempt)}};
}

std::string_view to_string(LookupAnswer answer) {
  switch (answer) {
    case LookupAnswer::happened: return "happened";
    case LookupAnswer::not_found: return "not_found";
    case LookupAnswer::unknown: return "unknown";
    case LookupAnswer::malformed: return "malformed";
    case LookupAnswer::mismatch: return "mismatch";
  }
  return "unknown";
}

LookupResult interpret_lookup(const LookupReply& reply, std::string_view key, const LookupRules& rules) {
  if (reply.status == 404) {
    const auto marker = values_of(reply.headers, kLookupHeader);
    if (marker.empty()) {
      return answer(LookupAnswer::unknown,
                    "404 without " + std::string(kLookupHeader) + ": " + std::string(kLookupNotFound) +
                        " (a 404 from a missing lookup route does not say the operation never happened)");
    }
    if (marker.size() != 1 || !iequals(marker.front(), kLookupNotFound)) {
      return answer(LookupAnswer::malformed, "404 with " + std::string(kLookupHeader) + " " + quoted(marker.front()) +
                                                 ", not \"" + std::string(kLookupNotFound) + "\"");
    }
    if (auto bad = check_key(reply, key, rules)) return std::move(*bad);
    return answer(LookupAnswer::not_found, "");
  }
  if (reply.status < 200 || reply.status > 299) {
    return answer(LookupAnswer::unknown, "the lookup answered " + std::to_string(reply.status));
  }
  if (auto bad = check_key(reply, key, rules)) return std::move(*bad);

  int status = reply.status;
  const auto original = values_of(reply.headers, kOriginalStatusHeader);
  if (original.size() > 1) {
    return answer(LookupAnswer::malformed, "the answer has " + std::to_string(original.size()) + " " +
                                               std::string(kOriginalStatusHeader) + " headers");
  }
  if (!original.empty()) {
    const std::string_view v = original.front();
    const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), status);
    if (ec != std::errc{} || end != v.data() + v.size() || v.size() != 3 || status < 200 || status > 599) {
      return answer(LookupAnswer::malformed,
                    std::string(kOriginalStatusHeader) + " " + quoted(v) + " is not a status from 200 to 599");
    }
  }
  // Only what the gateway would have stored can be the stored outcome: a 5xx (unless stored) or a
  // 408/409/425/429 says "not processed", which a lookup must answer as "never happened".
  if (classify_status(status, rules.store_server_errors) != Disposition::store) {
    return answer(LookupAnswer::malformed, "original status " + std::to_string(status) +
                                               " is not an outcome that is stored (SPEC 4.3); an operation that "
                                               "did not take effect is answered 404 not_found");
  }
  LookupResult result;
  result.answer = LookupAnswer::happened;
  result.response.status = status;
  if (reply.truncated) {
    result.oversized = true;
    return result;
  }
  ConnectionTokens connection;
  for (const Header& h : reply.headers) {
    if (iequals(h.name, "Connection")) connection.add(h.value);
  }
  for (const Header& h : reply.headers) {
    if (is_stored(h.name, connection) && !is_contract_header(h.name, rules)) result.response.headers.push_back(h);
  }
  result.response.body = reply.body;
  return result;
}

}  // namespace idem::http
