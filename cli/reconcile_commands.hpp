#pragma once

// `idemctl reconcile`: resolves the keys whose outcome is unknown (in progress with their lease
// run out: a gateway died, an upstream timed out, or a route's lookup could not answer) by asking
// the upstream's lookup each record carries (Record::lookup, stored by routes with
// on_lease_expiry = "ask"), exactly as a gateway does on a retry: a takeover fences the old
// holder out (a new token, a higher attempt), then the lookup decides. Safe while gateways serve:
// every step is a claim or a fenced write, so a key a gateway or another reconcile holds is left.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "common.hpp"
#include "idem/client/transport.hpp"
#include "idem/http/lookup.hpp"
#include "idem/store.hpp"
#include "idem/store_admin.hpp"

namespace idem::cli {

/// What `reconcile` does, from its flags.
struct ReconcileArgs {
  std::string upstream;                     ///< http://HOST[:PORT], the gateway's upstream
  std::optional<std::string> tenant{};      ///< only this tenant's keys
  Millis timeout = std::chrono::seconds(5);  ///< each lookup, from connect to the last byte
  Millis lease = std::chrono::seconds(30);  ///< how long a key is held while asked (> timeout)
  Millis retention = std::chrono::hours(24);  ///< how long a resolved outcome is replayed
  http::LookupHeaders headers{};            ///< the names the gateway uses (key, tenant, attempt)
  bool store_server_errors = false;         ///< the routes' store_server_errors
  std::size_t max_stored_response = 1024 * 1024;  ///< the gateway's max_stored_response
  bool dry_run = false;                     ///< only list what would be asked
};

/// How one key ended (a line of output, and the counts).
enum class Reconciled : std::uint8_t {
  resolved,    ///< the lookup found the outcome: completed with it, retries replay it
  retryable,   ///< the lookup said it never happened: failed_retryable, the next retry executes
  unknown,     ///< the lookup could not say (or failed): left as it was, to ask again
  no_lookup,   ///< the record has no lookup (not from an "ask" route): resolve it by hand
  skipped,     ///< someone else holds or finished the key meanwhile
  would_ask,   ///< --dry-run
};

/// "resolved", "retryable", ...
std::string_view to_string(Reconciled r);

/// Runs `reconcile` over `store` (its records through `admin`), asking through `transport`.
/// Exit 0 when every key asked got an answer that decides it (or was left to its holder), 1 when
/// some stay unknown or a store call failed.
int run_reconcile(Store& store, StoreAdmin& admin, client::Transport& transport, const ReconcileArgs& args,
                  const Clock& clock, const Output& o);

}  // namespace idem::cli
