#pragma once

// The operator's commands for keys held behind a dead letter (a consumer with ordering = key,
// docs/consumers.md "Held behind a dead letter"): `idemctl holds list`, `show`, `drop` and
// `forget` parse their arguments, open the store named by --store and call these. Each returns
// the process's exit status and writes only to `o`.

#include <string>

#include "common.hpp"
#include "idem/key_holds.hpp"
#include "idem/store_admin.hpp"

namespace idem::cli {

/// `holds list`: consumer `consumer`'s held keys in key order: the key, how many messages are
/// parked, the first one (the one to replay, or drop), since when.
int run_holds_list(StoreAdmin& admin, const std::string& consumer, const Output& o);

/// `holds show`: one key's parked message ids, oldest first. Exit 1 when the key is not held.
int run_holds_show(StoreKeyHolds& holds, const std::string& key, const Output& o);

/// `holds drop`: the key's first parked message is dropped (it will not run: its dead letter
/// must not be replayed); the next one runs when replayed. `message_id` must be the first, so a
/// drop typed twice cannot drop the next one. Exit 1 when not held or not first.
int run_holds_drop(StoreKeyHolds& holds, const std::string& key, const std::string& message_id, const Output& o);

/// `holds forget`: the key is no longer held; its parked messages, replayed, run as new ones in
/// whatever order they come. Exit 1 when it was not held.
int run_holds_forget(StoreKeyHolds& holds, const std::string& key, const Output& o);

}  // namespace idem::cli
