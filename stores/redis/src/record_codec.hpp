#pragma once

// How a record lives in Redis.
//
// Key:   <prefix>{<tenant>:<key>}
//        where tenant and key are percent-escaped: `%`, `{`, `}`, `:` and every byte outside
//        0x21-0x7E become %XX. The escaping is injective and leaves neither brace nor colon in
//        the parts, so (tenant, key) pairs never collide, the hash tag is exactly the whole
//        identity (one record, one slot) and keys stay readable in redis-cli.
// Value: one string (lua/record.lua reads and writes the same layout)
//          <state><attempt>|token|lease_expires|created|expires|completed|status|hash_len|headers_len|lookup_len|
//          followed by the request hash, the lookup, the headers blob and the body, back to back.
//        state          I (in progress) | C (completed) | F (failed, retryable)
//        attempt        Record::attempt, decimal, right after the state letter
//        token          fencing token, decimal (compared as text: Lua numbers are doubles)
//        lease_expires  created  completed  expires      Unix epoch milliseconds, decimal
//        status         response status, decimal       (empty until completed)
//        hash_len  headers_len  lookup_len              byte lengths of what follows
//        lookup         Record::lookup                  (empty but for "ask" routes)
//        headers        idem::encode_headers() blob     (empty until completed)
//        body           the rest of the value           (empty until completed)
//        The layout before attempt numbers had no attempt digits and no lookup_len
//        (`I|token|...|headers_len|hash headers body`); such a value reads as attempt 1 without a
//        lookup, and every script writes it back in this layout.
//        One string lets a claim of a fresh key be a plain `SET key value NX GET PX ttl`, which
//        costs Redis a third of a script call, and the numbers in front let a script read the
//        state and token without splitting the value.
// Legacy: idem before this layout stored a hash with the fields state, hash, token,
//        lease_expires, created, completed, expires, status, headers, body. Every script
//        rewrites such a record as a string before it touches it; reads decode either.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "idem/record.hpp"
#include "idem/result.hpp"
#include "idem/store.hpp"
#include "idem/redis_wire/reply.hpp"

namespace idem::redis_detail {

/// The Redis key of (tenant, key) under `prefix`.
std::string record_key(std::string_view prefix, const RecordId& id);

/// Inverse of record_key; nullopt for a key that record_key cannot have produced.
std::optional<RecordId> parse_record_key(std::string_view prefix, std::string_view redis_key);

/// A SCAN MATCH pattern selecting exactly the record keys under `prefix` (glob characters in
/// the prefix escaped).
std::string scan_pattern(std::string_view prefix);

/// The value of `record` (the layout above).
std::string encode_record(const Record& record);

/// The record stored as `value` under `id`; StoreErrc::corrupt for a value this version cannot
/// read.
StoreResult<Record> decode_record(const RecordId& id, std::string_view value);

/// A legacy (hash) record from the flat field/value array HGETALL returns; nullopt for an empty
/// array (no such key); StoreErrc::corrupt for fields this version cannot read.
StoreResult<std::optional<Record>> decode_legacy_record(const RecordId& id, const Reply& fields);

/// What the first bytes of a value say (GETRANGE key 0 kHeadBytes-1 is enough for them).
struct RecordHead {
  RecordState state = RecordState::in_progress;
  std::int64_t expires_ms = 0;
};
inline constexpr std::size_t kHeadBytes = 128;
std::optional<RecordHead> parse_record_head(std::string_view value_prefix);

/// Epoch milliseconds as the decimal text the scripts compare.
std::string ms_text(TimePoint t);

}  // namespace idem::redis_detail
