-- idem fail: the record becomes failed_retryable, fenced by the holder's token.
-- KEYS[1]  the record
-- ARGV     token, expires, ttl_ms
-- Returns 1 when applied, 0 when the caller no longer holds the record.
local cur, err = rec_load(KEYS[1])
if err then return redis.error_reply(err) end
if not cur or cur.state ~= 'I' or cur.token ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], rec_value('F', cur.attempt, cur.token, cur.lease, cur.created, ARGV[2], '', '', cur.hash,
                                     cur.lookup, '', ''), 'PX', ARGV[3])
return 1
