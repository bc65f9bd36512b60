-- idem complete: stores the response, fenced by the holder's token.
-- KEYS[1]  the record
-- ARGV     token, now, expires, ttl_ms, status, headers, body
-- Returns 1 when applied, 0 when the caller no longer holds the record.
local cur = redis.call('HMGET', KEYS[1], 'state', 'token')
if cur[1] ~= 'in_progress' or cur[2] ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], 'state', 'completed', 'completed', ARGV[2], 'expires', ARGV[3],
           'status', ARGV[5], 'headers', ARGV[6], 'body', ARGV[7])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 1
