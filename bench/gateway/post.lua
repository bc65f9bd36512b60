-- wrk script: every request is a POST with a fresh Idempotency-Key and a small JSON body, so the
-- gateway claims, executes and completes a new record each time (never a replay; run.sh checks
-- the gateways' metrics for that).
--
-- Keys look like the UUIDv4s real clients send (idem::client does): random, so a store sees no
-- locality a sequential key would give it. The first 64 bits come from a generator seeded with
-- the run (IDEM_BENCH_RUN), the last 48 bits are this wrk invocation (IDEM_BENCH_INVOCATION:
-- run.sh counts its wrk runs, warm-ups included), the thread and a counter, so keys never
-- repeat within a run, and are new to a durable store that earlier runs filled.

local run_id = os.getenv("IDEM_BENCH_RUN") or tostring(os.time())
local invocation = tonumber(os.getenv("IDEM_BENCH_INVOCATION") or "0") % 0x10000
local thread_count = 0
local body = '{"amount":100,"currency":"EUR","reference":"bench"}'

function setup(thread)
  thread_count = thread_count + 1
  thread:set("thread_id", thread_count)
end

local counter = 0

function init(args)
  local name = run_id .. ":" .. invocation .. ":" .. (thread_id or 0)
  local seed = 0
  for i = 1, #name do seed = (seed * 131 + string.byte(name, i)) % 0x7fffffff end
  math.randomseed(seed)
  -- Nearby seeds start with similar numbers: move away from the start.
  for _ = 1, 32 do math.random() end
end

function request()
  counter = counter + 1
  local key = string.format("%08x-%04x-4%03x-%04x-%04x%02x%06x",
    math.random(0, 0xffffffff), math.random(0, 0xffff), math.random(0, 0xfff),
    0x8000 + math.random(0, 0x3fff), invocation, (thread_id or 0) % 0x100, counter % 0x1000000)
  return wrk.format("POST", nil, {
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = key,
  }, body)
end
