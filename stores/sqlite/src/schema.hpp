#pragma once

// The store's schema and its versioned migrations.

#include "connection.hpp"

namespace idem::sqlite_detail {

/// The schema version this build writes and understands.
int latest_schema_version();

/// Brings the database to latest_schema_version() in one transaction: applies each missing
/// migration in order and records the version. Refuses (StoreErrc::corrupt, database untouched)
/// a database already at a newer version than this build knows.
StoreResult<Done> migrate(sqlite3* db);

/// Reads the recorded schema version: 0 for a database the store never touched.
StoreResult<int> read_schema_version(sqlite3* db);

}  // namespace idem::sqlite_detail
