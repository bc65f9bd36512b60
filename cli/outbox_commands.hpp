#pragma once

// The operator's outbox commands as functions over an OutboxReader: `idemctl outbox list`,
// `show`, `retry`, `drop` and `stats` parse their arguments, open the outbox named by --outbox
// (an operator's reader: no lock, no schema change, so they work while idem-relay runs) and call
// these. Each returns the process's exit status and writes only to `o`.

#include <cstddef>
#include <cstdint>
#include <optional>

#include "common.hpp"
#include "idem/outbox.hpp"

namespace idem::cli {

/// `outbox list`: rows in id order after `query.after_id`, without bodies. When a page is full,
/// says how to ask for the next one.
int run_outbox_list(OutboxReader& outbox, const OutboxQuery& query, TimePoint now, const Output& o);

/// `outbox show`: one row (message id, destination, content type, headers, body size, state,
/// attempts, times, last error), or with `body_only` the body's raw bytes. Exit 1 when absent.
int run_outbox_show(OutboxReader& outbox, std::int64_t id, bool body_only, TimePoint now, const Output& o);

/// `outbox retry`: a dead row becomes pending again, due now, its attempts reset. Exit 1 when
/// absent or not dead.
int run_outbox_retry(OutboxReader& outbox, std::int64_t id, TimePoint now, const Output& o);

/// `outbox drop`: deletes a dead row. Exit 1 when absent or not dead.
int run_outbox_drop(OutboxReader& outbox, std::int64_t id, const Output& o);

/// `outbox stats`: rows by state and the age of the oldest pending one.
int run_outbox_stats(OutboxReader& outbox, TimePoint now, const Output& o);

/// The JSON form of a row, as `outbox show --json` prints it (the body base64-encoded when
/// `with_body`, else only its size).
nlohmann::json outbox_row_json(const OutboxRow& row, TimePoint now, bool with_body);

}  // namespace idem::cli
