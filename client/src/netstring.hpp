#pragma once

// How the journal stores headers: name and value of each header as netstrings, in order
// ("12:Content-Type,16:application/json,"). Any byte survives, and the column stays readable in
// the sqlite3 shell when an operator inspects a journal.

#include <optional>
#include <string>
#include <string_view>

#include "idem/record.hpp"

namespace idem::client::detail {

/// Encodes headers, in order, repeats included.
std::string encode_headers(const Headers& headers);

/// Decodes what encode_headers produced; nullopt for anything malformed.
std::optional<Headers> decode_headers(std::string_view text);

}  // namespace idem::client::detail
