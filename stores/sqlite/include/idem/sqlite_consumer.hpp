#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

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

/// The application's part of process_batch_in_transaction: applies messages[index] with its
/// statements on `db`, under SqliteWork's rules (quick, no store calls). Returns false (with
/// `error` set) or throws to roll that message's writes back. Called once per message to run,
/// in order.
using SqliteBatchWork = std::move_only_function<bool(std::size_t index, sqlite3* db, std::string& error)>;

/// process_once_in_transaction for many messages at once: claims them with one store call, then
/// applies the new ones in ONE transaction (SqliteStore::complete_many_in_transaction), each in
/// a savepoint of its own with its "processed" record, and commits once. One outcome per message,
/// in order, each what process_once_in_transaction would give: processed, duplicate, in_progress
/// (also for an id that appears twice in `messages`: the first runs), conflict, invalid_id,
/// outcome_unknown, handler_failed (its work declined or threw: only its writes roll back, the
/// claim is forgotten so the next delivery runs it, the others commit), lost (only it), or a
/// store error (the transaction failed: no message of it committed, unless the error is in
/// doubt). `work` gets each message's index in `messages`. Blocking.
std::vector<StoreResult<MessageOutcome>> process_batch_in_transaction(Consumer& consumer, SqliteStore& store,
                                                                      const std::vector<Consumer::Message>& messages,
                                                                      SqliteBatchWork work);

}  // namespace idem
