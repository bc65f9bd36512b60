#include "idem/record.hpp"

#include "idem/result.hpp"
#include "idem/store_admin.hpp"

namespace idem {

std::string_view to_string(RecordState state) {
  switch (state) {
    case RecordState::in_progress: return "in_progress";
    case RecordState::completed: return "completed";
    case RecordState::failed_retryable: return "failed_retryable";
  }
  return "unknown";
}

std::optional<RecordState> parse_record_state(std::string_view name) {
  for (auto s : {RecordState::in_progress, RecordState::completed, RecordState::failed_retryable}) {
    if (to_string(s) == name) return s;
  }
  return std::nullopt;
}

std::string_view to_string(StoreErrc code) {
  switch (code) {
    case StoreErrc::unavailable: return "unavailable";
    case StoreErrc::timeout: return "timeout";
    case StoreErrc::corrupt: return "corrupt";
    case StoreErrc::internal: return "internal";
    case StoreErrc::undecryptable: return "undecryptable";
  }
  return "unknown";
}

std::string_view to_string(AdminStatus status) {
  switch (status) {
    case AdminStatus::done: return "done";
    case AdminStatus::not_found: return "not_found";
    case AdminStatus::wrong_state: return "wrong_state";
  }
  return "unknown";
}

}  // namespace idem
