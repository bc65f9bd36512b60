-- idem abandon: the holder gives the record back without an outcome; it stays in progress with
-- the holder's token, and its lease ends now, so the next claim meets an expired lease.
-- KEYS[1]  the record
-- ARGV     token, now
-- Returns 1 when applied, 0 when the caller no longer holds the record.
local cur, err = rec_load(KEYS[1])
if err then return redis.error_reply(err) end
if not cur or cur.state ~= 'I' or cur.token ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], rec_value('I', cur.attempt, cur.token, ARGV[2], cur.created, cur.expires, '', '', cur.hash,
                                     cur.lookup, '', ''), 'KEEPTTL')
return 1
