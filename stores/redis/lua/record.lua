-- idem record layout, shared: CMake puts this file in front of every script.
-- A record is one string (stores/redis/src/record_codec.hpp documents the same layout):
--   <state><attempt>|token|lease_expires|created|expires|completed|status|hash_len|headers_len|lookup_len|
--   followed by the request hash, the lookup, the headers and the body, back to back.
-- state is I (in progress), C (completed) or F (failed, retryable), attempt the decimal attempt
-- number right after it; the numbers are decimal (token: compared as text, Lua numbers are
-- doubles); completed and status are empty, and headers and body absent, until the record
-- completes. An earlier layout has no attempt (the '|' follows the state) and no lookup_len: such
-- a record reads as attempt 1 without a lookup, and is written back in this layout.
local function rec_parse(v)
  local state, attempt, token, lease, created, expires, completed, status, hash_len, headers_len, at =
    string.match(v, '^([ICF])(%d*)|(%d+)|(%d*)|(%d+)|(%d+)|(%d*)|(%d*)|(%d+)|(%d+)|()')
  if not state then return nil end
  local lookup_len = 0
  if attempt == '' then
    attempt = '1'
  else
    local len, after = string.match(v, '^(%d+)|()', at)
    if not len then return nil end
    lookup_len, at = tonumber(len), after
  end
  local hash_end = at + tonumber(hash_len) - 1
  local lookup_end = hash_end + lookup_len
  if lookup_end + tonumber(headers_len) > #v then return nil end
  return {state = state, attempt = attempt, token = token, lease = lease, created = created,
          expires = tonumber(expires), completed = completed, status = status,
          hash = string.sub(v, at, hash_end), lookup = string.sub(v, hash_end + 1, lookup_end), raw = v}
end

local function rec_value(state, attempt, token, lease, created, expires, completed, status, hash, lookup, headers,
                         body)
  return state .. attempt .. '|' .. token .. '|' .. lease .. '|' .. created .. '|' .. expires .. '|' .. completed ..
         '|' .. status .. '|' .. #hash .. '|' .. #headers .. '|' .. #lookup .. '|' .. hash .. lookup .. headers ..
         body
end

-- The record at key: (record) or (false) when absent, or (nil, error text). A record an earlier
-- idem wrote as a hash (fields state, hash, token, ...) is rewritten in place as a string first,
-- keeping its TTL, so records survive an upgrade.
local function rec_load(key)
  local v = redis.pcall('GET', key)
  if type(v) == 'table' and v.err then
    if string.sub(v.err, 1, 9) ~= 'WRONGTYPE' then return nil, v.err end
    local list = redis.call('HGETALL', key)
    local f = {}
    for i = 1, #list, 2 do f[list[i]] = list[i + 1] end
    if not f.state then return false end  -- a stray hash without a state: as if absent
    local state = ({in_progress = 'I', completed = 'C', failed_retryable = 'F'})[f.state]
    if not state or not tonumber(f.expires) or not f.token or not f.created or not f.hash then
      return nil, 'IDEMCORRUPT unreadable record (hash)'
    end
    v = rec_value(state, '1', f.token, f.lease_expires or '', f.created, f.expires, f.completed or '', f.status or '',
                  f.hash, '', f.headers or '', f.body or '')
    local pttl = redis.call('PTTL', key)
    redis.call('DEL', key)
    if pttl > 0 then redis.call('SET', key, v, 'PX', pttl) else redis.call('SET', key, v) end
  end
  if not v then return false end
  local r = rec_parse(v)
  if not r then return nil, 'IDEMCORRUPT unreadable record' end
  return r
end

