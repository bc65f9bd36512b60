#include "idem/http_view.hpp"

namespace idem {

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    unsigned char x = a[i], y = b[i];
    if (x >= 'A' && x <= 'Z') x += 'a' - 'A';
    if (y >= 'A' && y <= 'Z') y += 'a' - 'A';
    if (x != y) return false;
  }
  return true;
}

std::string_view find_header(std::span<const HeaderView> headers, std::string_view name) {
  for (const auto& h : headers) {
    if (iequals(h.name, name)) return h.value;
  }
  return {};
}

}  // namespace idem
