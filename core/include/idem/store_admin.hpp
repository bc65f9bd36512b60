#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "idem/store.hpp"

namespace idem {

/// Which records `StoreAdmin::list` returns: ordered by (tenant, key), starting after `after`.
struct ListQuery {
  std::optional<RecordState> state;  ///< only this state; all when empty
  std::optional<RecordId> after;     ///< resume after this record (paging)
  std::size_t limit = 100;
  std::optional<std::string> tenant;  ///< only this tenant's records; all when empty
};

/// How many records a store holds, by state. Expired records still stored are counted apart.
struct StateCounts {
  std::uint64_t in_progress = 0;
  std::uint64_t completed = 0;
  std::uint64_t failed_retryable = 0;
  std::uint64_t expired = 0;  ///< past `expires`, not yet purged (in no other count)
};

/// The answer to an operator's action on one record.
enum class AdminStatus : std::uint8_t {
  done,         ///< applied
  not_found,    ///< no record (or only an expired one)
  wrong_state,  ///< the record's state does not allow it (e.g. resolving a completed record)
};

/// Operator actions (`idemctl`), kept apart from Store so the request path's interface stays
/// small. Every backend implements both. Nothing here is fenced by a holder's token: an operator
/// overrides; each action installs a new token so a holder still running is fenced out.
class StoreAdmin {
 public:
  virtual ~StoreAdmin() = default;

  /// Records in (tenant, key) order, with their responses.
  virtual void list(ListQuery query, Callback<std::vector<Record>> done) = 0;

  /// Makes an in_progress (stuck or "outcome unknown") record failed_retryable, so the next
  /// request with the same fingerprint executes again. Completed records are `wrong_state`.
  virtual void mark_retryable(RecordId id, TimePoint now, Callback<AdminStatus> done) = 0;

  /// Records a known outcome for an in_progress or failed_retryable record: it becomes completed
  /// with `response` until `expires`, and retries replay it. Completed records are `wrong_state`.
  virtual void resolve(RecordId id, StoredResponse response, TimePoint now, TimePoint expires,
                       Callback<AdminStatus> done) = 0;

  /// Counts of records by state at `now`.
  virtual void count(TimePoint now, Callback<StateCounts> done) = 0;
};

/// "done", "not_found", "wrong_state".
std::string_view to_string(AdminStatus status);

}  // namespace idem
