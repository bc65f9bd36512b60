#pragma once

// The interactive transactions: the application's (complete_in_transaction, with its
// PostgresTransaction) and the operator's (mark_retryable, resolve). Each runs on a Session.

#include <string>
#include <vector>

#include "idem/postgres_store.hpp"
#include "idem/store_admin.hpp"
#include "records.hpp"
#include "session.hpp"

namespace idem::postgres_detail {

/// An operator's release: an in-progress or failed record becomes failed_retryable under a new
/// token (fencing out a holder still running).
StoreResult<AdminStatus> run_mark_retryable(Session& s, const RecordId& id, TimePoint now);

/// resolve's arguments, the headers encoded once.
struct ResolveArgs {
  RecordId id;
  StoredResponse response;
  std::string headers;
  TimePoint now, expires;
};

/// An operator's resolve: the record becomes completed with the given response, under a new token.
StoreResult<AdminStatus> run_resolve(Session& s, const ResolveArgs& a);

/// complete_in_transaction: locks the fenced record, runs `work`, completes, commits.
StoreResult<FenceStatus> run_complete_in_transaction(Session& s, const CompleteWrite& w, PostgresWork& work);

/// One item of complete_many_in_transaction, its headers encoded once.
struct WorkWrite {
  CompleteWrite completion;
  PostgresWork work;
};

/// complete_many_in_transaction: locks every item's fenced record (in key order), then runs each
/// item's work and completion in a savepoint of its own, then commits. One answer per item.
BatchResults<WorkResult> run_complete_many_in_transaction(Session& s, std::vector<WorkWrite>& items);

}  // namespace idem::postgres_detail
