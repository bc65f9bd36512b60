-- wrk script for bench/gateway/webhook.sh: a POST of one fixed JSON event body, each request a new
-- delivery (a fresh id in both X-GitHub-Delivery and Idempotency-Key, never a replay), with the
-- body's X-Hub-Signature-256 (IDEM_BENCH_SIGNATURE, computed by webhook.sh with the route's
-- secret). The same requests go to both gateways: the webhook route verifies the signature and
-- takes its key from X-GitHub-Delivery, the plain route takes Idempotency-Key and checks nothing.
-- GitHub signs the body only, so one signature serves every delivery; the other profiles sign a
-- timestamp or the id too, which would need a signature per request made outside wrk.

local run_id = os.getenv("IDEM_BENCH_RUN") or tostring(os.time())
local invocation = tonumber(os.getenv("IDEM_BENCH_INVOCATION") or "0") % 0x10000
local body = os.getenv("IDEM_BENCH_BODY")
local signature = os.getenv("IDEM_BENCH_SIGNATURE")

local thread_count = 0
function setup(thread)
  thread_count = thread_count + 1
  thread:set("thread_id", thread_count)
end

local counter = 0

function init(args)
  local name = run_id .. ":" .. invocation .. ":" .. (thread_id or 1)
  local seed = 0
  for i = 1, #name do seed = (seed * 131 + string.byte(name, i)) % 0x7fffffff end
  math.randomseed(seed)
  for _ = 1, 32 do math.random() end
end

function request()
  counter = counter + 1
  local id = string.format("%08x-%04x-4%03x-%04x-%04x%02x%06x",
    math.random(0, 0xffffffff), math.random(0, 0xffff), math.random(0, 0xfff),
    0x8000 + math.random(0, 0x3fff), invocation, (thread_id or 0) % 0x100, counter % 0x1000000)
  return wrk.format("POST", "/hooks/github", {
    ["Content-Type"] = "application/json",
    ["Idempotency-Key"] = id,
    ["X-GitHub-Delivery"] = id,
    ["X-GitHub-Event"] = "push",
    ["X-Hub-Signature-256"] = signature,
  }, body)
end
