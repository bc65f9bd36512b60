#!/usr/bin/env bash
# gRPC unary calls through the gateway against the same calls direct to the service, in
# interleaved rounds (A B, B A, ...) so both sides see the same drift of these shared cores (see
# ab.sh). The service: bench/grpc's idem-grpc-echo-server (C++, gRPC's generic callback API, h2c),
# which answers every call's request message back. The load: bench/grpc's idem-grpc-load (C++,
# gRPC's generic stub, one CompletionQueue): N calls of /payments.Payments/Charge, C at a time over
# K channels (one HTTP/2 connection each), each with a fresh `idempotency-key` metadata.
#
#   D: direct to the echo service (h2c);
#   G: through idem-gateway: h2c listener ([http2] cleartext = true), upstream_protocol = "h2",
#      a [[route]] for POST /payments.Payments/Charge, so every call is claimed in the store,
#      executed, recorded and answered (store memory by default).
#
# Per run: calls/s, p50/p99 latency, and CPU per call (user + system from /proc/PID/stat: the
# gateway's threads, the service's; and the load client's own, from getrusage). At the end the
# medians and the G/D ratios. Then, for information, one run through the gateway with one key
# for every call (executed once before): the replay path, answered from the store.
#
# Fails unless every call was answered OK with its message, the service executed exactly as many
# calls as were sent (counted by the service itself, /idem.bench.Echo/Count, on every run: a
# gateway that replayed or dropped calls instead of forwarding them is caught), the gateway counted
# every keyed call as executed, and the replay run was replayed whole (the service called 0 times).
#
# usage: bench/gateway/grpc.sh [--quick] [--rounds N] [--calls N] [--concurrency C] [--channels K]
#          [--message-bytes B] [--store memory|sqlite] [--gateway-threads N] [--server-threads N]
#          [--server-bin PATH] [--load-bin PATH] GATEWAY_BINARY
#   --quick            one round of 300 calls per side and a 300-call replay run: proves the
#                      script works (CI); figures not meaningful
#   --rounds           runs per side (default 6); --calls: calls per run (default 50000)
#   --concurrency      calls in flight (default 64); --channels: client connections (default 4)
#   --message-bytes    the request (and response) message size (default 256)
#   --gateway-threads  the gateway's `threads` (default 0: one event loop per core)
#   --server-threads   idem-grpc-echo-server --threads (gRPC's thread quota; default: gRPC's)
#   --server-bin, --load-bin  default: bench/grpc/ in the gateway's build tree
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here="$root/bench/gateway"
me=grpc.sh
# shellcheck source=bench/gateway/lib.sh
source "$here/lib.sh"

rounds=6
calls=50000
concurrency=64
channels=4
message_bytes=256
store=memory
gateway_threads=0
server_threads=0
quick=0
binary=""
server_bin=""
load_bin=""
method=/payments.Payments/Charge
while (($#)); do
  case "$1" in
    --quick) quick=1; rounds=1; calls=300; concurrency=16; channels=2; shift ;;
    --rounds) rounds=$2; shift 2 ;;
    --calls) calls=$2; shift 2 ;;
    --concurrency) concurrency=$2; shift 2 ;;
    --channels) channels=$2; shift 2 ;;
    --message-bytes) message_bytes=$2; shift 2 ;;
    --store) store=$2; shift 2 ;;
    --gateway-threads) gateway_threads=$2; shift 2 ;;
    --server-threads) server_threads=$2; shift 2 ;;
    --server-bin) server_bin=$2; shift 2 ;;
    --load-bin) load_bin=$2; shift 2 ;;
    -h|--help) sed -n '2,34p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "$me: unknown option: $1" >&2; exit 2 ;;
    *) [ -z "$binary" ] || { echo "$me: one gateway binary, please" >&2; exit 2; }; binary=$1; shift ;;
  esac
done
check_gateway_binary
check_positive_integers "$rounds" "$calls" "$concurrency" "$channels" "$message_bytes"
for n in "$gateway_threads" "$server_threads"; do
  [[ "$n" =~ ^[0-9]+$ ]] || { echo "$me: expected a number of threads, got \"$n\"" >&2; exit 2; }
done
case "$store" in memory|sqlite) ;; *) echo "$me: --store: expected memory or sqlite, got \"$store\"" >&2; exit 2 ;; esac
build_tree="$(cd "$(dirname "$binary")/.." && pwd)"
[ -n "$server_bin" ] || server_bin="$build_tree/bench/grpc/idem-grpc-echo-server"
[ -n "$load_bin" ] || load_bin="$build_tree/bench/grpc/idem-grpc-load"
[ -x "$server_bin" ] || { echo "$me: no echo server at $server_bin (--server-bin; target idem_grpc_echo_server)" >&2; exit 2; }
[ -x "$load_bin" ] || { echo "$me: no load client at $load_bin (--load-bin; target idem_grpc_load)" >&2; exit 2; }
require_tools python3 curl

bench_failure_logs() { show_logs "$work"/*.log "$work"/load.err; }
make_work_dir grpc

# The echo service, on a port of its choosing (written to a file once it listens).
server_args=(--listen 127.0.0.1:0 --port-file "$work/server.port")
((server_threads == 0)) || server_args+=(--threads "$server_threads")
"$server_bin" "${server_args[@]}" >"$work/server.log" 2>&1 &
pids+=($!)
pid_of[service]=$!
for _ in $(seq 200); do [ -s "$work/server.port" ] && break; sleep 0.05; done
[ -s "$work/server.port" ] || { echo "$me: the echo server did not start" >&2; exit 1; }
upstream_port=$(cat "$work/server.port")
service="127.0.0.1:$upstream_port"

# service_count: how many calls the service answered so far (asked directly, not counted).
service_count() { "$load_bin" --target "$service" --count 2>>"$work/load.err"; }

store_url="memory:"
[ "$store" = sqlite ] && store_url="sqlite:$work/gateway.db"
read -r gw_port gw_admin < <(free_ports 2)
start_gateway "$binary" gw "$store_url" "$gw_port" "$gw_admin" "threads = $gateway_threads
upstream_protocol = \"h2\"

[http2]
cleartext = true

[[route]]
method = \"POST\"
path = \"$method\""
pid_of[G]=${pid_of[gw]}
declare -A target=([D]="$service" [G]="127.0.0.1:$gw_port")

results="$work/results.tsv"
: >"$results"
load_args=(--method "$method" --concurrency "$concurrency" --channels "$channels" --message-bytes "$message_bytes")

# load SIDE CALLS [ARGS...]: one load run against that side, its JSON line in $work/load.json,
# the gateway's and the service's CPU ticks before and after in t0 t1 and s0 s1; checks that the
# service executed `expect_executed` calls (default CALLS), by its own count.
load() {
  local side=$1 n=$2
  shift 2
  local before after
  before=$(service_count)
  # CPU ticks around the calls only (not the count calls): read by run and the replay run.
  t0=$(ticks "${pid_of[G]}")
  s0=$(ticks "${pid_of[service]}")
  if ! "$load_bin" --target "${target[$side]}" --calls "$n" "${load_args[@]}" "$@" >"$work/load.json" 2>>"$work/load.err"; then
    echo "$me: calls to $side failed: $(cat "$work/load.json")" >&2
    exit 1
  fi
  t1=$(ticks "${pid_of[G]}")
  s1=$(ticks "${pid_of[service]}")
  after=$(service_count)
  local want=${expect_executed:-$n}
  if ((after - before != want)); then
    echo "$me: $side: the service executed $((after - before)) calls, expected $want: $(cat "$work/load.json")" >&2
    exit 1
  fi
}

# run SIDE ROUND: one measured run; appends
# "round side calls/s gateway_cpu_us service_cpu_us client_cpu_us p50_us p99_us replayed".
run() {
  local side=$1 round=$2
  ((quick)) || settle 10
  load "$side" "$calls"
  "$py" - "$work/load.json" "$side" "$round" "$t0" "$t1" "$s0" "$s1" "$(getconf CLK_TCK)" >>"$results" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
side, round_no = sys.argv[2], sys.argv[3]
t0, t1, s0, s1, tick = map(float, sys.argv[4:9])
n = r["calls"]
print("%s\t%s\t%.0f\t%.1f\t%.1f\t%.1f\t%d\t%d\t%d" % (round_no, side, r["calls_per_s"], (t1 - t0) / tick * 1e6 / n,
      (s1 - s0) / tick * 1e6 / n, r["client_cpu_us_per_call"], r["p50_us"], r["p99_us"], r["replayed"]))
EOF
  IFS=$'\t' read -r _ _ cps gcpu scpu ccpu p50 p99 replayed < <(tail -1 "$results")
  if ((replayed != 0)); then echo "$me: $side: $replayed calls with unique keys were replayed" >&2; exit 1; fi
  printf '%s: round %d  %s  %7s calls/s  us CPU/call: gateway %6s, service %5s, client %5s  p50 %s us, p99 %s us\n' \
    "$me" "$round" "$side" "$cps" "$gcpu" "$scpu" "$ccpu" "$p50" "$p99" >&2
}

# Warm-up: both paths answer, and the gateway's upstream connections are open.
load D 200
load G 200

echo "$me: D = direct to idem-grpc-echo-server (h2c); G = idem-gateway (h2c listener, upstream_protocol h2," \
  "a [[route]] for $method, store $store, threads $gateway_threads); $(nproc) cores" >&2
echo "$me: $rounds rounds of $calls calls per side, concurrency $concurrency over $channels channels," \
  "$message_bytes-byte messages, a fresh idempotency-key per call; load average $(cut -d' ' -f1 /proc/loadavg)" >&2
for round in $(seq "$rounds"); do
  # Alternate who goes first, so neither always runs right after the other.
  if ((round % 2)); then run D "$round"; run G "$round"; else run G "$round"; run D "$round"; fi
done

# The gateway executed every keyed call (none replayed, refused or failed).
all_executed gateway "$gw_admin" || { echo "$me: failed: not every call through the gateway was executed" >&2; exit 1; }
executed=$(curl -fsS "http://127.0.0.1:$gw_admin/metrics" | awk '/^idem_requests_total\{/ && /outcome="executed"/ { n += $2 } END { print n + 0 }')
want=$((200 + rounds * calls))
((executed == want)) || { echo "$me: the gateway counted $executed executed calls, expected $want" >&2; exit 1; }

# The replay path: one key, executed once, then every call answered from the store.
key="grpc-bench-replay-$(date +%s)-$$"
load G 1 --key "$key"
((quick)) || settle 10
expect_executed=0 load G "$calls" --key "$key"
replay_line=$("$py" - "$work/load.json" "$t0" "$t1" "$s0" "$s1" "$(getconf CLK_TCK)" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
t0, t1, s0, s1, tick = map(float, sys.argv[2:7])
n = r["calls"]
if r["replayed"] != n:
    print("REPLAYED %d of %d" % (r["replayed"], n))
    sys.exit(1)
print("%.0f calls/s, us CPU/call: gateway %.1f, service %.1f, client %.1f; p50 %d us, p99 %d us (%d calls, all replayed)" % (
    r["calls_per_s"], (t1 - t0) / tick * 1e6 / n, (s1 - s0) / tick * 1e6 / n, r["client_cpu_us_per_call"],
    r["p50_us"], r["p99_us"], n))
EOF
) || { echo "$me: the replay run was not replayed whole: $replay_line; $(cat "$work/load.json")" >&2; exit 1; }

"$py" - "$results" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
rounds = sorted({r[0] for r in rows}, key=int)
val = {(r[0], r[1], c): float(r[c]) for r in rows for c in range(2, 8)}
col = lambda side, c: [val[(n, side, c)] for n in rounds]
med = statistics.median
print("gRPC unary calls: D = direct to the service, G = through idem-gateway (a fresh key per call)")
print("  side  median calls/s  range            us CPU/call: gateway  service  client   p50 us   p99 us")
for s in ("D", "G"):
    cps = col(s, 2)
    print("  %-4s  %14.0f  %6.0f-%-8.0f  %20.1f  %7.1f  %6.1f  %7.0f  %7.0f" % (
        s, med(cps), min(cps), max(cps), med(col(s, 3)), med(col(s, 4)), med(col(s, 5)), med(col(s, 6)), med(col(s, 7))))
for name, c in (("calls/s", 2), ("service CPU per call", 4), ("p50 latency", 6), ("p99 latency", 7)):
    ratios = [val[(n, "G", c)] / val[(n, "D", c)] for n in rounds if val[(n, "D", c)] > 0]
    if ratios:
        print("  G/D: %s %.3f of the medians, %.3f median of the rounds' ratios (rounds %s)" % (
            name, med(col("G", c)) / med(col("D", c)), med(ratios), ", ".join("%.2f" % r for r in ratios)))
EOF
echo "  replay (G, one key executed once, then $calls calls answered from the store): $replay_line"
