-- wrk script: every request is a POST with a fresh Idempotency-Key and a small JSON body, so the
-- gateway claims, executes and completes a new record each time (never a replay).
-- The run id keeps keys unique across runs that share a durable store.

local run_id = os.getenv("IDEM_BENCH_RUN") or tostring(os.time())
local thread_count = 0
local body = '{"amount":100,"currency":"EUR","reference":"bench"}'

function setup(thread)
  thread_count = thread_count + 1
  thread:set("thread_id", thread_count)
end

local counter = 0

function request()
  counter = counter + 1
  local key = string.format("bench-%s-%d-%d", run_id, thread_id or 0, counter)
  return wrk.format("POST", nil, {
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = key,
  }, body)
end
