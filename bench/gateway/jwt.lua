-- wrk script for bench/gateway/jwt.sh: post.lua's requests (a POST with a fresh Idempotency-Key
-- and a small JSON body, never a replay) plus the two tenant headers, identical for both
-- gateways being compared: `Authorization: Bearer <JWT>` and `X-Tenant-Id`. The header-tenant
-- gateway reads the second, the JWT one verifies the first; each forwards both.
--
-- IDEM_BENCH_TOKENS names a file of tokens, one a line, one per wrk connection (jwt.sh makes as
-- many as -c). Each wrk thread cycles through its share of them: wrk's Lua sees requests, not
-- connections, but the gateway sees what matters, as many distinct tokens as connections, each
-- sent again and again (so verified once per event loop, then found in its cache).

local run_id = os.getenv("IDEM_BENCH_RUN") or tostring(os.time())
local invocation = tonumber(os.getenv("IDEM_BENCH_INVOCATION") or "0") % 0x10000
local body = '{"amount":100,"currency":"EUR","reference":"bench"}'

local all_tokens = {}
for line in io.lines(os.getenv("IDEM_BENCH_TOKENS")) do
  if #line > 0 then all_tokens[#all_tokens + 1] = line end
end

local thread_count = 0
function setup(thread)
  thread_count = thread_count + 1
  thread:set("thread_id", thread_count)
end

local mine = {}       -- this thread's tokens
local mine_index = {} -- their lines in the file: the X-Tenant-Id of the same client
local counter = 0

function init(args)
  local id = thread_id or 1
  -- Thread t takes tokens t, t + T, t + 2T, ... (T = wrk -t, passed as the first script argument).
  local threads = tonumber(args[1] or "1")
  for i = id, #all_tokens, threads do
    mine[#mine + 1] = all_tokens[i]
    mine_index[#mine_index + 1] = i
  end
  if #mine == 0 then
    mine, mine_index = all_tokens, {}
    for i = 1, #all_tokens do mine_index[i] = i end
  end
  local name = run_id .. ":" .. invocation .. ":" .. id
  local seed = 0
  for i = 1, #name do seed = (seed * 131 + string.byte(name, i)) % 0x7fffffff end
  math.randomseed(seed)
  for _ = 1, 32 do math.random() end
end

function request()
  counter = counter + 1
  local key = string.format("%08x-%04x-4%03x-%04x-%04x%02x%06x",
    math.random(0, 0xffffffff), math.random(0, 0xffff), math.random(0, 0xfff),
    0x8000 + math.random(0, 0x3fff), invocation, (thread_id or 0) % 0x100, counter % 0x1000000)
  local n = (counter - 1) % #mine + 1
  return wrk.format("POST", nil, {
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = key,
    ["Authorization"] = "Bearer " .. mine[n],
    ["X-Tenant-Id"] = "client-" .. mine_index[n],
  }, body)
end
