#include "idem/outbox.hpp"

#include "idem/consume_loop.hpp"  // message_id_problem: the same id rules as consumers apply

namespace idem {

std::string_view to_string(OutboxState state) {
  switch (state) {
    case OutboxState::pending: return "pending";
    case OutboxState::sent: return "sent";
    case OutboxState::dead: return "dead";
  }
  return "unknown";
}

std::optional<std::string> outbox_message_problem(const OutboxMessage& message) {
  // The consumers dead-letter a message whose id they cannot use: refuse it at the source.
  if (auto problem = message_id_problem(message.message_id)) return problem;
  if (message.destination.size() > 256) return "the destination is longer than 256 characters";
  return std::nullopt;
}

}  // namespace idem
