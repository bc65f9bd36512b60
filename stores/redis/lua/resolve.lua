-- idem admin resolve: an unexpired, not completed record becomes completed with the operator's
-- response and a new token (fencing out a holder still running).
-- KEYS[1]  the record
-- ARGV     now, new token, expires, ttl_ms, status, headers, body
-- Returns 'done', 'not_found' or 'wrong_state'.
local cur, err = rec_load(KEYS[1])
if err then return redis.error_reply(err) end
if not cur or cur.expires <= tonumber(ARGV[1]) then return 'not_found' end
if cur.state == 'C' then return 'wrong_state' end
redis.call('SET', KEYS[1], rec_value('C', cur.attempt, ARGV[2], cur.lease, cur.created, ARGV[3], ARGV[1], ARGV[5],
                                     cur.hash, cur.lookup, ARGV[6], ARGV[7]), 'PX', ARGV[4])
return 'done'
