#include "idem/http/message.hpp"

#include <array>

#include "idem/http_view.hpp"

namespace idem::http {
namespace {

constexpr std::array<std::string_view, 9> kHopByHop = {
    "Connection", "Keep-Alive",          "Transfer-Encoding",   "TE",
    "Trailer",    "Upgrade",             "Proxy-Authenticate",  "Proxy-Authorization",
    "Proxy-Connection",
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

}  // namespace

bool is_hop_by_hop(std::string_view name) {
  // Every Proxy-* header (the rule), not only the RFC's Proxy-Authenticate/Authorization.
  if (name.size() >= 6 && iequals(name.substr(0, 6), "Proxy-")) return true;
  // Cheap pre-filter on length: most headers are longer or shorter than every hop-by-hop name.
  if (name.size() < 2 || name.size() > 19) return false;
  for (const auto h : kHopByHop) {
    if (iequals(name, h)) return true;
  }
  return false;
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

bool is_idempotent_method(std::string_view method) {
  return method == "GET" || method == "HEAD" || method == "OPTIONS" || method == "TRACE" ||
         method == "PUT" || method == "DELETE";
}

}  // namespace idem::http
