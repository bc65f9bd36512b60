#include "idem/gateway/routes.hpp"

#include <stdexcept>

namespace idem::gateway {
namespace {

// Next '/'-separated segment of `rest` (which starts after a '/'); advances `rest`.
std::string_view next_segment(std::string_view& rest, bool& more) {
  const auto slash = rest.find('/');
  if (slash == std::string_view::npos) {
    auto seg = rest;
    rest = {};
    more = false;
    return seg;
  }
  auto seg = rest.substr(0, slash);
  rest.remove_prefix(slash + 1);
  more = true;
  return seg;
}

}  // namespace

PathPattern::PathPattern(std::string_view pattern) : text_(pattern) {
  if (pattern.empty() || pattern.front() != '/') {
    throw std::invalid_argument("must start with \"/\"");
  }
  if (pattern.find_first_of("?# \t") != std::string_view::npos) {
    throw std::invalid_argument("must be a path without query, fragment or spaces");
  }
  std::string_view rest = pattern.substr(1);
  if (rest.empty()) return;  // "/": the root only (one empty segment)
  bool more = true;
  while (more) {
    const auto seg = next_segment(rest, more);
    if (seg == "**") {
      if (more) throw std::invalid_argument("\"**\" may only be the last segment");
      rest_ = true;
      break;
    }
    if (seg != "*" && seg.find('*') != std::string_view::npos) {
      throw std::invalid_argument("\"*\" must be a whole segment (\"/a/*/b\"), not part of one");
    }
    segments_.emplace_back(seg);
  }
}

bool PathPattern::matches(std::string_view path) const {
  if (path.empty() || path.front() != '/') return false;
  std::string_view rest = path.substr(1);
  if (segments_.empty() && !rest_) return rest.empty();  // "/"
  bool more = true;
  for (const auto& want : segments_) {
    if (!more) return false;  // the path has fewer segments
    const auto seg = next_segment(rest, more);
    if (want == "*") {
      if (seg.empty()) return false;
    } else if (seg != want) {
      return false;
    }
  }
  if (rest_) return true;  // "/**": whatever remains, including nothing
  return !more;
}

Router::Router(const std::vector<Route>& routes, const Policy& defaults) : routes_(routes), unlisted_(defaults) {
  unlisted_.key_required = false;
}

Router::Match Router::match(std::string_view method, std::string_view path) const {
  if (is_safe_method(method)) return {};
  for (std::size_t i = 0; i < routes_.size(); ++i) {
    const Route& route = routes_[i];
    for (const auto& m : route.methods) {
      if (m == method) {
        if (route.path.matches(path)) return {&route.policy, i};
        break;
      }
    }
  }
  if (method == "POST" || method == "PATCH") return {&unlisted_, kNoRoute};
  return {};
}

}  // namespace idem::gateway
