-- idem claim (SPEC 4.2): mirrors decide_claim and claimed_record in core/src/store.cpp.
-- KEYS[1]  the record (a hash)
-- ARGV     now, request_hash, token, lease_expires, expires, take_over ('1' or '0'), ttl_ms
-- Times are the caller's Unix epoch milliseconds; Redis's own clock is never read.
-- Returns {'claimed', kind, created} or {status, '', HGETALL of the stored record}.
local key = KEYS[1]
local now = tonumber(ARGV[1])
local cur = redis.call('HMGET', key, 'state', 'hash', 'lease_expires', 'created', 'expires')
local kind, created = 'fresh', ARGV[1]
if cur[1] then
  local expires = tonumber(cur[5])
  if not expires then return redis.error_reply('IDEMCORRUPT record without expires') end
  if expires > now then
    if cur[2] ~= ARGV[2] then return {'mismatch', '', redis.call('HGETALL', key)} end
    if cur[1] == 'completed' then
      return {'completed', '', redis.call('HGETALL', key)}
    elseif cur[1] == 'in_progress' then
      if tonumber(cur[3]) > now then return {'in_progress', '', redis.call('HGETALL', key)} end
      if ARGV[6] ~= '1' then return {'outcome_unknown', '', redis.call('HGETALL', key)} end
      kind = 'after_lease_expiry'
    elseif cur[1] == 'failed_retryable' then
      kind = 'after_failure'
    else
      return redis.error_reply('IDEMCORRUPT unknown state')
    end
    created = cur[4]
  end
end
-- An expired or taken-over record (or a stray hash without a state): none of its fields survive.
-- A fresh key, the common case, has nothing to delete.
if cur[1] or cur[2] or cur[3] or cur[4] or cur[5] then redis.call('DEL', key) end
redis.call('HSET', key, 'state', 'in_progress', 'hash', ARGV[2], 'token', ARGV[3],
           'lease_expires', ARGV[4], 'created', created, 'expires', ARGV[5])
redis.call('PEXPIRE', key, ARGV[7])
return {'claimed', kind, created}
