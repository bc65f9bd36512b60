#pragma once

#include <string_view>

#include "idem/consumer.hpp"
#include "idem/postgres_store.hpp"

namespace idem {

/// Consumer::process_once for a consumer whose effect is writes to the PostgreSQL database the
/// store lives in (SPEC §10): `work` runs its statements on the store's connection, inside the
/// transaction that also records the message as processed. A crash at any point leaves either
/// both or neither, so redelivered messages never apply twice, and a message whose consumer died
/// is simply processed again once its lease runs out. Several consumer processes may share the
/// store: the claim lets one of them run a message at a time.
///
/// `work` follows PostgresWork's rules (it runs on a store thread while the record is locked:
/// quick, no store calls). It returns false (with `error` set) or throws to roll its writes
/// back: the result is MessageStatus::handler_failed, with the failed statement's error (if one
/// failed) as its detail, and the next delivery runs it again. `consumer` must have been created
/// on `store`. Blocking,
/// like Consumer::process_once; the outcome's result is empty (the effect is in the
/// application's tables).
StoreResult<MessageOutcome> process_once_in_transaction(Consumer& consumer, PostgresStore& store,
                                                        std::string_view message_id, std::string_view payload,
                                                        PostgresWork work);

}  // namespace idem
