-- wrk script for bench/consumers/run.py: POST /v1/payments with a fresh Idempotency-Key each
-- (thread id and a counter), 1 cent from acct_a to acct_b, so every request is a new payment.
local thread_count = 0
function setup(thread)
  thread_count = thread_count + 1
  thread:set("thread_id", thread_count)
end
local counter = 0
function request()
  counter = counter + 1
  local key = string.format("bench-%d-%d-%d-%012d", os.time(), thread_id or 0, math.random(1, 1e9), counter)
  return wrk.format("POST", "/v1/payments",
    {["Content-Type"] = "application/json", ["Idempotency-Key"] = key},
    '{"from":"acct_a","to":"acct_b","amount":1,"currency":"EUR"}')
end
