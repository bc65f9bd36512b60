-- idem release: forgets the record, fenced by the holder's token.
-- KEYS[1]  the record
-- ARGV     token
-- Returns 1 when applied, 0 when the caller no longer holds the record.
local cur = redis.call('HMGET', KEYS[1], 'state', 'token')
if cur[1] ~= 'in_progress' or cur[2] ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1
