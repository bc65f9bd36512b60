#pragma once

// `sqlite:PATH[?OPTION=VALUE&...]`: the file, and the SqliteOptions an operator may set without
// writing code (docs/gateway.md, "Stores").

#include <expected>
#include <string>
#include <string_view>

#include "idem/sqlite_store.hpp"

namespace idem::open_detail {

/// The options a `sqlite:` URL names, on top of SqliteOptions' defaults; the error is one line
/// saying what is wrong. Recognised options: synchronous (off, normal, full, extra),
/// busy_timeout_ms, max_batch, wal_autocheckpoint. The first '?' ends the path.
std::expected<SqliteOptions, std::string> parse_sqlite_url(std::string_view url);

}  // namespace idem::open_detail
