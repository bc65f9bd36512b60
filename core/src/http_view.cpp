#include "idem/http_view.hpp"

namespace idem {

std::string_view find_header(std::span<const HeaderView> headers, std::string_view name) {
  for (const auto& h : headers) {
    if (iequals(h.name, name)) return h.value;
  }
  return {};
}

}  // namespace idem
