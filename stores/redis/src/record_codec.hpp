#pragma once

// How a record lives in Redis.
//
// Key:   <prefix>{<tenant>:<key>}
//        where tenant and key are percent-escaped: `%`, `{`, `}`, `:` and every byte outside
//        0x21-0x7E become %XX. The escaping is injective and leaves neither brace nor colon in
//        the parts, so (tenant, key) pairs never collide, the hash tag is exactly the whole
//        identity (one record, one slot) and keys stay readable in redis-cli.
// Value: a hash with the fields
//        state          "in_progress" | "completed" | "failed_retryable"
//        hash           the request fingerprint
//        token          fencing token, decimal (compared as a string: Lua numbers are doubles)
//        lease_expires  created  completed  expires      Unix epoch milliseconds, decimal
//        status         response status, decimal      (only once completed)
//        headers        idem::encode_headers() blob    (only once completed)
//        body           response body bytes            (only once completed)

#include <optional>
#include <string>
#include <string_view>

#include "idem/record.hpp"
#include "idem/result.hpp"
#include "idem/store.hpp"
#include "reply.hpp"

namespace idem::redis_detail {

/// The Redis key of (tenant, key) under `prefix`.
std::string record_key(std::string_view prefix, const RecordId& id);

/// Inverse of record_key; nullopt for a key that record_key cannot have produced.
std::optional<RecordId> parse_record_key(std::string_view prefix, std::string_view redis_key);

/// A SCAN MATCH pattern selecting exactly the record keys under `prefix` (glob characters in
/// the prefix escaped).
std::string scan_pattern(std::string_view prefix);

/// A record from the flat field/value array HGETALL returns; nullopt for an empty array (no
/// such key); StoreErrc::corrupt for fields this version cannot read.
StoreResult<std::optional<Record>> decode_record(const RecordId& id, const Reply& fields);

/// Epoch milliseconds as the decimal text the scripts compare.
std::string ms_text(TimePoint t);

}  // namespace idem::redis_detail
