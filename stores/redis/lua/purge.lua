-- idem purge: deletes the record if its logical expiry has passed.
-- KEYS[1]  the record
-- ARGV     now
-- Returns 1 when deleted, else 0.
local cur, err = rec_load(KEYS[1])
if err then return redis.error_reply(err) end
if cur and cur.expires <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
