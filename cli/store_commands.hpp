#pragma once

// The operator's store commands as functions over a Store and its StoreAdmin: `idemctl get`,
// `list`, `purge`, `release`, `resolve` and `stats` parse their arguments, open the store named by
// --store and call these. Each returns the process's exit status and writes only to `o`.

#include <cstddef>
#include <optional>

#include "common.hpp"
#include "idem/encryption.hpp"
#include "idem/open_store.hpp"
#include "idem/store.hpp"
#include "idem/store_admin.hpp"

namespace idem::cli {

/// How a record's response was stored encrypted (docs/security.md), as the commands show it.
struct Encryption {
  std::string key_id;  ///< the key that sealed it ("" when its marker is unreadable)
  bool opened = false; ///< decrypted with the given keys: the record now holds the original
  std::string error;   ///< with keys given: why it could not be decrypted
};

/// Decrypts `record`'s response in place when it is sealed and `keys` are given. nullopt for a
/// plaintext response (or none); otherwise how it was sealed and whether it could be opened.
std::optional<Encryption> open_for_display(Record& record, const KeyRing* keys);

/// `get`: prints one record (state, hash, token, times, response status, headers, body size), or
/// with `body_only` the stored body's raw bytes. Exit 1 when absent (or, with `body_only`, when no
/// response is stored). `store` is the backend itself (sealed responses as stored): with `keys`
/// an encrypted response is decrypted and shown, without them only its key id (and `body_only`
/// is exit 1); one that cannot be decrypted is exit 1 with the reason.
int run_get(Store& store, const RecordId& id, bool body_only, TimePoint now, const Output& o,
            const KeyRing* keys = nullptr);

/// What `list` shows.
struct ListArgs {
  std::optional<RecordState> state;  ///< only this state
  std::optional<RecordId> after;     ///< start after this record (paging)
  std::optional<std::string> tenant; ///< only this tenant's records
  std::size_t limit = 100;           ///< records per page
  bool all = false;                  ///< keep paging until the end
};

/// `list`: records in (tenant, key) order, without bodies. When a page is full, says how to ask
/// for the next one. `admin` is the backend's: encrypted responses show as "enc" without `keys`,
/// with their status when `keys` open them; any that cannot be opened make it exit 1.
int run_list(StoreAdmin& admin, const ListArgs& args, TimePoint now, const Output& o,
             const KeyRing* keys = nullptr);

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
/// `with_body`, else only its size). An encrypted response adds "encrypted": true and "key_id";
/// one not opened has no status, headers or body, and "error" when it could not be.
nlohmann::json record_json(const Record& record, TimePoint now, bool with_body,
                           const std::optional<Encryption>& encryption = std::nullopt);

/// Opens the store named by `url` for an operator's command, or ends the command (exit 2 for a
/// bad URL, 1 when it cannot be opened; an SQLite path that does not exist is never created).
/// With `keys`, through an EncryptedStore.
OpenedStore open_store_or_fail(const std::string& url, std::shared_ptr<const KeyRing> keys = nullptr);

}  // namespace idem::cli
