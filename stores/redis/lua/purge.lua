-- idem purge: deletes the record if its logical expiry has passed.
-- KEYS[1]  the record
-- ARGV     now
-- Returns 1 when deleted, else 0.
local expires = tonumber(redis.call('HGET', KEYS[1], 'expires'))
if expires and expires <= tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
