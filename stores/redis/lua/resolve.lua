-- idem admin resolve: an unexpired, not completed record becomes completed with the operator's
-- response and a new token (fencing out a holder still running).
-- KEYS[1]  the record
-- ARGV     now, new token, expires, ttl_ms, status, headers, body
-- Returns 'done', 'not_found' or 'wrong_state'.
local cur = redis.call('HMGET', KEYS[1], 'state', 'expires')
if not cur[1] or not tonumber(cur[2]) or tonumber(cur[2]) <= tonumber(ARGV[1]) then
  return 'not_found'
end
if cur[1] == 'completed' then return 'wrong_state' end
redis.call('HSET', KEYS[1], 'state', 'completed', 'token', ARGV[2], 'completed', ARGV[1],
           'expires', ARGV[3], 'status', ARGV[5], 'headers', ARGV[6], 'body', ARGV[7])
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 'done'
