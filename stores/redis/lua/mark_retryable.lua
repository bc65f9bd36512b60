-- idem admin mark_retryable: an unexpired, not completed record becomes failed_retryable with a
-- new token (fencing out a holder still running).
-- KEYS[1]  the record
-- ARGV     now, new token
-- Returns 'done', 'not_found' or 'wrong_state'.
local cur = redis.call('HMGET', KEYS[1], 'state', 'expires')
if not cur[1] or not tonumber(cur[2]) or tonumber(cur[2]) <= tonumber(ARGV[1]) then
  return 'not_found'
end
if cur[1] == 'completed' then return 'wrong_state' end
redis.call('HSET', KEYS[1], 'state', 'failed_retryable', 'token', ARGV[2])
return 'done'
