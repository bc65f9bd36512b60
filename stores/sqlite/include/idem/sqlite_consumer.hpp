#pragma once

#include <string_view>

#include "idem/consumer.hpp"
#include "idem/sqlite_store.hpp"

namespace idem {

/// Consumer::process_once for a consumer whose effect is writes to the SQLite database the
/// store lives in (SPEC §10): `work` runs its SQL on the store's connection, inside the store's
/// transaction, and the "processed" record commits with it. A crash at any point leaves either
/// both or neither, so redelivered messages never apply twice, and a message whose consumer died
/// is simply processed again once its lease runs out.
///
/// `work` follows SqliteWork's rules (it runs on the store's writer thread: quick, no store
/// calls, no BEGIN/COMMIT of its own). It returns false (with `error` set) or throws to roll
/// its writes back: the result is MessageStatus::handler_failed and the next delivery runs it
/// again. `consumer` must have been created on `store`. Blocking, like Consumer::process_once;
/// the outcome's result is empty (the effect is in the application's tables).
StoreResult<MessageOutcome> process_once_in_transaction(Consumer& consumer, SqliteStore& store,
                                                        std::string_view message_id, std::string_view payload,
                                                        SqliteWork work);

}  // namespace idem
