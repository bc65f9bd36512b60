-- idem fail: the record becomes failed_retryable, fenced by the holder's token.
-- KEYS[1]  the record
-- ARGV     token, expires, ttl_ms
-- Returns 1 when applied, 0 when the caller no longer holds the record.
local cur = redis.call('HMGET', KEYS[1], 'state', 'token')
if cur[1] ~= 'in_progress' or cur[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'failed_retryable', 'expires', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1
