-- idem admin mark_retryable: an unexpired, not completed record becomes failed_retryable with a
-- new token (fencing out a holder still running).
-- KEYS[1]  the record
-- ARGV     now, new token
-- Returns 'done', 'not_found' or 'wrong_state'.
local cur, err = rec_load(KEYS[1])
if err then return redis.error_reply(err) end
if not cur or cur.expires <= tonumber(ARGV[1]) then return 'not_found' end
if cur.state == 'C' then return 'wrong_state' end
redis.call('SET', KEYS[1], rec_value('F', cur.attempt, ARGV[2], cur.lease, cur.created, cur.expires, '', '', cur.hash,
                                     cur.lookup, '', ''), 'KEEPTTL')
return 'done'
