-- idem release: forgets the record, fenced by the holder's token.
-- KEYS[1]  the record
-- ARGV     token
-- Returns 1 when applied, 0 when the caller no longer holds the record.
local cur, err = rec_load(KEYS[1])
if err then return redis.error_reply(err) end
if not cur or cur.state ~= 'I' or cur.token ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
