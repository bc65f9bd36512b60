-- wrk script: every request is a POST with a fresh Idempotency-Key and a small JSON body, so the
-- gateway claims, executes and completes a new record each time (never a replay).
--
-- Keys look like the UUIDv4s real clients send (idem::client does): random, so a store sees no
-- locality a sequential key would give it. The first 64 bits come from a generator seeded with
-- the run id (IDEM_BENCH_RUN) and the thread, the last 48 bits are the thread and a counter, so
-- keys never repeat within a run and are new to a durable store that earlier runs filled.

local run_id = os.getenv("IDEM_BENCH_RUN") or tostring(os.time())
local thread_count = 0
local body = '{"amount":100,"currency":"EUR","reference":"bench"}'

function setup(thread)
  thread_count = thread_count + 1
  thread:set("thread_id", thread_count)
end

local counter = 0

function init(args)
  -- run_id is digits (the script's start time and PID); keep it within a double's precision.
  math.randomseed((tonumber(string.sub(run_id, -12)) or os.time()) * 64 + (thread_id or 0))
end

function request()
  counter = counter + 1
  local key = string.format("%08x-%04x-4%03x-%04x-%04x%08x",
    math.random(0, 0xffffffff), math.random(0, 0xffff), math.random(0, 0xfff),
    0x8000 + math.random(0, 0x3fff), thread_id or 0, counter)
  return wrk.format("POST", nil, {
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = key,
  }, body)
end
