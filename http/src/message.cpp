#include "idem/http/message.hpp"

#include <string>

#include "idem/http_view.hpp"

namespace idem::http {
namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

bool is_hop_by_hop(std::string_view name) {
  // Every Proxy-* header (the rule), not only the RFC's Proxy-Authenticate/Authorization.
  if (name.size() >= 6 && iequals(name.substr(0, 6), "Proxy-")) return true;
  // By length first: this runs for every header of every forwarded message, and most names
  // match no hop-by-hop name's length.
  switch (name.size()) {
    case 2: return iequals(name, "TE");
    case 7: return iequals(name, "Trailer") || iequals(name, "Upgrade");
    case 10: return iequals(name, "Connection") || iequals(name, "Keep-Alive");
    case 17: return iequals(name, "Transfer-Encoding");
    default: return false;
  }
}

void ConnectionTokens::add(std::string_view value) {
  while (!value.empty()) {
    const auto comma = value.find(',');
    const auto token = trim(value.substr(0, comma));
    // "close" and "keep-alive" are the usual tokens; neither names an end-to-end header.
    if (!token.empty() && !iequals(token, "close") && !is_hop_by_hop(token)) tokens_.push_back(token);
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
}

bool ConnectionTokens::contains(std::string_view name) const {
  for (const auto t : tokens_) {
    if (iequals(t, name)) return true;
  }
  return false;
}

bool is_forwarded(std::string_view name, const ConnectionTokens& connection) {
  return !is_hop_by_hop(name) && !connection.contains(name);
}

bool is_stored(std::string_view name, const ConnectionTokens& connection) {
  return is_forwarded(name, connection) && !iequals(name, "Content-Length") &&
         !iequals(name, kReplayedHeader);
}

Target split_target(std::string_view target) {
  if (!target.empty() && target.front() != '/' && target != "*") {
    // Absolute form: skip "scheme://authority".
    const auto scheme = target.find("://");
    if (scheme != std::string_view::npos) {
      const auto slash = target.find_first_of("/?", scheme + 3);
      target = slash == std::string_view::npos ? std::string_view("/") : target.substr(slash);
      if (!target.empty() && target.front() == '?') {
        return Target{"/", target.substr(1)};
      }
    }
  }
  const auto q = target.find('?');
  if (q == std::string_view::npos) return Target{target, {}};
  return Target{target.substr(0, q), target.substr(q + 1)};
}

namespace {

// The transfer codings of one or more Transfer-Encoding values, in order; parameters dropped.
std::vector<std::string_view> transfer_codings(std::span<const std::string_view> values) {
  std::vector<std::string_view> codings;
  for (std::string_view value : values) {
    while (!value.empty()) {
      const auto comma = value.find(',');
      std::string_view coding = value.substr(0, comma);
      coding = trim(coding.substr(0, coding.find(';')));
      if (!coding.empty()) codings.push_back(coding);  // empty list elements are allowed
      if (comma == std::string_view::npos) break;
      value.remove_prefix(comma + 1);
    }
  }
  return codings;
}

// uri-host [ ":" port ] (RFC 3986 §3.2.2): reg-name or IPv4 characters, or an IP literal in
// brackets; no user info, path, query, fragment, whitespace or control bytes.
bool is_valid_host(std::string_view host) {
  if (host.empty()) return false;
  std::string_view port;
  if (host.front() == '[') {
    const auto close = host.find(']');
    if (close == std::string_view::npos || close == 1) return false;
    for (const char c : host.substr(1, close - 1)) {
      const bool ok = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == ':' ||
                      c == '.' || c == 'v' || c == 'V';
      if (!ok) return false;
    }
    const std::string_view rest = host.substr(close + 1);
    if (!rest.empty() && rest.front() != ':') return false;
    port = rest.empty() ? rest : rest.substr(1);
  } else {
    const auto colon = host.rfind(':');
    const std::string_view name = host.substr(0, colon);
    if (name.empty()) return false;
    for (const char c : name) {
      const bool unreserved = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                              c == '-' || c == '.' || c == '_' || c == '~';
      const bool sub_delim_or_pct = std::string_view("!$&'()*+,;=%").find(c) != std::string_view::npos;
      if (!unreserved && !sub_delim_or_pct) return false;
    }
    port = colon == std::string_view::npos ? std::string_view() : host.substr(colon + 1);
  }
  if (port.size() > 5) return false;
  for (const char c : port) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

HeadDefect bad_request(std::string detail) { return HeadDefect{400, "bad_request", std::move(detail)}; }

}  // namespace

std::optional<HeadDefect> check_request_head(const HeadFacts& head) {
  if (head.method == "CONNECT") {
    return HeadDefect{501, "not_implemented", "CONNECT is not supported: the gateway is a reverse proxy and opens no tunnels"};
  }
  if (!head.transfer_encodings.empty()) {
    if (head.version < 11) {
      return bad_request("Transfer-Encoding in an HTTP/1.0 request: the body's length cannot be trusted");
    }
    const std::vector<std::string_view> codings = transfer_codings(head.transfer_encodings);
    if (codings.empty() || !iequals(codings.back(), "chunked")) {
      return bad_request("Transfer-Encoding without chunked as its final coding: the body's length cannot be determined");
    }
    if (codings.size() > 1) {
      for (std::size_t i = 0; i + 1 < codings.size(); ++i) {
        if (iequals(codings[i], "chunked")) return bad_request("Transfer-Encoding applies chunked more than once");
      }
      return HeadDefect{501, "not_implemented",
                        "the transfer coding " + std::string(codings.front()) + " is not supported; send the body chunked or with a Content-Length"};
    }
  }
  if (head.version >= 11) {
    if (head.hosts.empty()) return bad_request("an HTTP/1.1 request needs a Host header");
    if (head.hosts.size() > 1) return bad_request("the Host header appears more than once");
  }
  if (head.hosts.size() == 1 && !is_valid_host(head.hosts.front())) {
    return bad_request("the Host header is not a host name or address with an optional port");
  }
  return std::nullopt;
}

bool is_idempotent_method(std::string_view method) {
  return method == "GET" || method == "HEAD" || method == "OPTIONS" || method == "TRACE" ||
         method == "PUT" || method == "DELETE";
}

}  // namespace idem::http
