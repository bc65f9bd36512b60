#pragma once

// A store connection from its opening to its first use: connected within connect_timeout, in
// pipeline mode, with the session settings and every statement prepared.

#include <array>
#include <chrono>
#include <expected>
#include <optional>
#include <string>

#include "connection.hpp"
#include "idem/postgres_store.hpp"
#include "schema.hpp"

namespace idem::postgres_detail {

/// The statements' SQL, by Stmt, for one schema.
using StatementSql = std::array<std::string, kStatementCount>;

/// Puts a fresh connection in pipeline mode with the session settings and every statement
/// prepared, in one round trip.
std::optional<Failure> setup_connection(PGconn* conn, const StatementSql& sql, const PostgresOptions& o,
                                        std::chrono::milliseconds silence);

/// How long the client waits for a silent connection.
std::chrono::milliseconds silence_of(const PostgresOptions& o);

/// Connects and, given the statements, sets the connection up; without them (the first
/// connection, which migrates first) it is left outside pipeline mode.
std::expected<Conn, Failure> open_connection(const PostgresOptions& o, const StatementSql* sql);

}  // namespace idem::postgres_detail
