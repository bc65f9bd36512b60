#pragma once

// Records and requests as the store's statements read and bind them: the one place that knows the
// columns' order and encodings (tokens' bits in a bigint, epoch milliseconds, encoded headers).

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include "connection.hpp"
#include "idem/store.hpp"

namespace idem::postgres_detail {

/// PostgreSQL has no unsigned 64-bit type; the token's bits are stored as they are.
inline std::int64_t token_to_db(std::uint64_t token) { return static_cast<std::int64_t>(token); }
/// Inverse of token_to_db.
inline std::uint64_t token_from_db(std::int64_t value) { return static_cast<std::uint64_t>(value); }

/// A count as a bigint parameter, clamped.
std::int64_t limit_to_db(std::size_t limit);

/// A StoreErrc::internal error.
StoreError internal_error(std::string message);

/// Text the server would refuse (invalid UTF-8, NUL) is turned away before it can abort a batch.
std::optional<StoreError> unstorable(std::initializer_list<std::string_view> texts);
/// unstorable for a record's tenant and key.
std::optional<StoreError> unstorable(const RecordId& id);

/// A record from its kRecordColumnCount columns, starting at `col0`.
StoreResult<Record> read_record(const PGresult* r, int row, int col0, std::string tenant, std::string key);

/// idem_claim's answer.
StoreResult<ClaimResult> parse_claim(const ClaimRequest& req, const PGresult* r);

/// A fenced write's answer: ok when it changed the row.
StoreResult<FenceStatus> fenced(const PGresult* r);

/// $1 tenant, $2 key, $3 token.
void bind_fence(const Fence& fence, Params& p);

/// A completion with its headers encoded once, as the statement binds them.
struct CompleteWrite {
  CompleteRequest req;
  std::string headers;  // req.response.headers, encoded
};

/// purge_expired's arguments.
struct PurgeArgs {
  TimePoint now;
  std::size_t limit;
};

/// idem_claim's parameters.
void bind_claim(const ClaimRequest& req, Params& p);

/// The completion's parameters: the fence, then status, headers, body, completed, expires.
void bind_complete(const CompleteWrite& w, Params& p);

}  // namespace idem::postgres_detail
