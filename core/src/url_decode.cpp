#include "idem/url_decode.hpp"

#include <set>

namespace idem {
namespace {

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::expected<std::string, std::string> percent_decode(std::string_view in, std::string_view what) {
  std::string out;
  out.reserve(in.size());
  for (std::size_t i = 0; i < in.size(); ++i) {
    if (in[i] != '%') {
      out.push_back(in[i]);
      continue;
    }
    const int hi = i + 1 < in.size() ? hex_digit(in[i + 1]) : -1;
    const int lo = i + 2 < in.size() ? hex_digit(in[i + 2]) : -1;
    if (hi < 0 || lo < 0) return std::unexpected("bad percent-escape in the " + std::string(what) + " (write '%' as %25)");
    out.push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return out;
}

std::expected<std::vector<UrlParameter>, std::string> query_parameters(std::string_view query) {
  std::vector<UrlParameter> out;
  std::set<std::string, std::less<>> seen;
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view item = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view{} : query.substr(amp + 1);
    if (item.empty()) continue;
    const auto eq = item.find('=');
    auto name = percent_decode(item.substr(0, eq), "parameter name");
    if (!name) return std::unexpected(name.error());
    auto value = percent_decode(eq == std::string_view::npos ? std::string_view{} : item.substr(eq + 1),
                                "value of parameter " + *name);
    if (!value) return std::unexpected(value.error());
    if (!seen.insert(*name).second) return std::unexpected("parameter " + *name + " is given twice");
    out.push_back(UrlParameter{std::move(*name), std::move(*value)});
  }
  return out;
}

}  // namespace idem
