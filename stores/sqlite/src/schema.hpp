#pragma once

// The store's schema and its versioned migrations.

#include <string_view>

#include "connection.hpp"

namespace idem::sqlite_detail {

/// The schema version this build writes and understands.
int latest_schema_version();

/// Brings the database to `target` (latest_schema_version() but in the migration tests, which
/// make databases of older versions) in one transaction: applies each missing migration in order
/// and records the version. Refuses (StoreErrc::corrupt, database untouched) a database already
/// at a newer version than this build knows.
StoreResult<Done> migrate(sqlite3* db, int target = latest_schema_version());

/// Makes sure the file has the outbox table (migration 2's), for an outbox reader on a database
/// that may hold no idem store: when it has none, creates it in a write transaction if `create`,
/// else fails (StoreErrc::internal, naming `path`). Refuses a database whose idem schema is newer
/// than this build. Takes no lock when the table is there.
StoreResult<Done> ensure_outbox(sqlite3* db, bool create, std::string_view path);

/// Whether the database has a table of that name.
StoreResult<bool> has_table(sqlite3* db, const char* name);
/// Whether `table` has a column `column`.
StoreResult<bool> has_column(sqlite3* db, const char* table, const char* column);

/// Reads the recorded schema version: 0 for a database the store never touched.
StoreResult<int> read_schema_version(sqlite3* db);

}  // namespace idem::sqlite_detail
