#pragma once

// The operator's store commands as functions over a Store and its StoreAdmin: `idemctl get`,
// `list`, `purge`, `release`, `resolve` and `stats` parse their arguments, open the store named by
// --store and call these. Each returns the process's exit status and writes only to `o`.

#include <cstddef>
#include <optional>

#include "common.hpp"
#include "idem/store.hpp"
#include "idem/store_admin.hpp"

namespace idem::cli {

/// `get`: prints one record (state, hash, token, times, response status, headers, body size), or
/// with `body_only` the stored body's raw bytes. Exit 1 when absent (or, with `body_only`, when no
/// response is stored).
int run_get(Store& store, const RecordId& id, bool body_only, TimePoint now, const Output& o);

/// What `list` shows.
struct ListArgs {
  std::optional<RecordState> state;  ///< only this state
  std::optional<RecordId> after;     ///< start after this record (paging)
  std::optional<std::string> tenant; ///< only this tenant's records
  std::size_t limit = 100;           ///< records per page
  bool all = false;                  ///< keep paging until the end
};

/// `list`: records in (tenant, key) order, without bodies. When a page is full, says how to ask
/// for the next one.
int run_list(StoreAdmin& admin, const ListArgs& args, TimePoint now, const Output& o);

/// `purge`: deletes expired records, `batch` per store call, until fewer remain; prints how many.
int run_purge(Store& store, TimePoint now, std::size_t batch, const Output& o);

/// `release`: an in_progress (stuck, or "outcome unknown") record becomes failed_retryable, so the
/// next request with the same fingerprint executes. Exit 1 if absent or completed.
int run_release(StoreAdmin& admin, const RecordId& id, TimePoint now, const Output& o);

/// `resolve`: an in_progress or failed_retryable record becomes completed with `response` for
/// `retention`; retries replay it. Exit 1 if absent or already completed.
int run_resolve(StoreAdmin& admin, const RecordId& id, StoredResponse response, TimePoint now, Millis retention,
                const Output& o);

/// `stats`: counts of records by state (expired-but-not-purged apart).
int run_stats(StoreAdmin& admin, TimePoint now, const Output& o);

/// The JSON form of a record, as `get --json` prints it (the body base64-encoded when
/// `with_body`, else only its size).
nlohmann::json record_json(const Record& record, TimePoint now, bool with_body);

}  // namespace idem::cli
