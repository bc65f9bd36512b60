#include "idem/broker.hpp"

#include "idem/key.hpp"

namespace idem {

std::string_view to_string(BrokerErrc code) {
  switch (code) {
    case BrokerErrc::unavailable: return "unavailable";
    case BrokerErrc::timeout: return "timeout";
    case BrokerErrc::refused: return "refused";
    case BrokerErrc::rejected: return "rejected";
    case BrokerErrc::stale: return "stale";
    case BrokerErrc::invalid: return "invalid";
    case BrokerErrc::internal: return "internal";
  }
  return "unknown";
}

bool valid_ordering_key(std::string_view key) {
  return !key.empty() && key.size() <= kMaxOrderingKey && all_visible_ascii(key);
}

}  // namespace idem
