-- idem complete: stores the response, fenced by the holder's token.
-- KEYS[1]  the record
-- ARGV     token, now, expires, ttl_ms, status, headers, body
-- Returns 1 when applied, 0 when the caller no longer holds the record.
local cur, err = rec_load(KEYS[1])
if err then return redis.error_reply(err) end
if not cur or cur.state ~= 'I' or cur.token ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], rec_value('C', cur.attempt, cur.token, cur.lease, cur.created, ARGV[3], ARGV[2], ARGV[5],
                                     cur.hash, cur.lookup, ARGV[6], ARGV[7]), 'PX', ARGV[4])
return 1
