-- idem claim (SPEC 4.2): mirrors decide_claim and claimed_record in core/src/store.cpp.
-- The store first tries `SET key <record> NX GET PX ttl`, which claims a fresh key without Lua;
-- this script runs when a record is there and the claim may take it over (or on an old Redis).
-- KEYS[1]  the record
-- ARGV     now, request_hash, token, lease_expires, expires, take_over ('1' or '0'), ttl_ms, lookup
-- Times are the caller's Unix epoch milliseconds; Redis's own clock is never read.
-- Returns {'claimed', kind, created, attempt} or {status, '', the stored record}.
local key = KEYS[1]
local now = tonumber(ARGV[1])
local cur, err = rec_load(key)
if err then return redis.error_reply(err) end
local kind, created, attempt = 'fresh', ARGV[1], '1'
if cur and cur.expires > now then
  if cur.hash ~= ARGV[2] then return {'mismatch', '', cur.raw} end
  if cur.state == 'C' then return {'completed', '', cur.raw} end
  if cur.state == 'I' then
    if (tonumber(cur.lease) or 0) > now then return {'in_progress', '', cur.raw} end
    if ARGV[6] ~= '1' then return {'outcome_unknown', '', cur.raw} end
    kind = 'after_lease_expiry'
  else
    kind = 'after_failure'
  end
  created = cur.created
  -- A takeover counts one more attempt (saturating at the uint32 range the stores share).
  attempt = string.format('%.0f', math.min(tonumber(cur.attempt) + 1, 4294967295))
end
-- An expired or taken-over record: none of its fields survive but the creation time and count.
redis.call('SET', key, rec_value('I', attempt, ARGV[3], ARGV[4], created, ARGV[5], '', '', ARGV[2], ARGV[8], '', ''),
           'PX', ARGV[7])
return {'claimed', kind, created, attempt}
