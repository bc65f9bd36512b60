#!/usr/bin/env bash
# How well the gateway's Redis store pipelines, seen from the Redis server: one idem-gateway with
# the redis:// store (a fresh Redis 7, AOF appendfsync everysec, as in run.sh's case (e)) in front
# of a static nginx, driven by wrk with fresh keys (bench/gateway/post.lua) at several
# concurrencies. Per run, from Redis's INFO and /proc:
#   req/s           wrk's rate
#   calls/req       commands Redis executed per request, those a script ran included (a claim
#                   is one SET; a completion one EVALSHA that runs a GET and a SET: 4 in all)
#   cmds/read       the gateway's commands (a claim and a completion: 2 per request) per read()
#                   of Redis's event loop: how many commands its writes carried together (1.0 = no
#                   pipelining at all)
#   evalsha us      Redis's own time per completion script (INFO commandstats usec_per_call)
#   redis us/req    the Redis server's CPU (user + system, its AOF rewrite child included) per request
#   gateway us/req  the gateway's CPU per request
# Fails unless every request was answered 2xx and executed.
#
# usage: bench/gateway/redis_pipelining.sh [--quick] [--duration SECONDS] [--connections LIST]
#                                          GATEWAY_BINARY
#   --connections   comma-separated wrk concurrencies (default 8,64,256); wrk uses 2 threads
#   --quick         one 1 s run at 64 connections: proves the script works; figures not meaningful
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here="$root/bench/gateway"
me=redis_pipelining.sh
# shellcheck source=bench/gateway/lib.sh
source "$here/lib.sh"

duration=8
connection_list=8,64,256
binary=""
while (($#)); do
  case "$1" in
    --quick) duration=1; connection_list=64; shift ;;
    --duration) duration=$2; shift 2 ;;
    --connections) connection_list=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "$me: unknown option: $1" >&2; exit 2 ;;
    *) [ -z "$binary" ] || { echo "$me: one gateway binary, please" >&2; exit 2; }; binary=$1; shift ;;
  esac
done
check_gateway_binary
IFS=, read -r -a connections <<<"$connection_list"
check_positive_integers "$duration" "${connections[@]}"
require_tools wrk nginx python3 curl redis-cli

bench_cleanup_hook() { bash "$root/scripts/lib/servers.sh" stop "$work/servers" >/dev/null 2>&1 || true; }
make_work_dir redis-pipelining
chmod 755 "$work"

bash "$root/scripts/lib/servers.sh" start "$work/servers" redis >/dev/null
# shellcheck disable=SC1091
source "$work/servers/env"
redis_pid=$(cat "$work/servers/redis/redis.pid")
redis=(redis-cli -u "$IDEM_TEST_REDIS_URL")

read -r upstream_port port admin < <(free_ports 3)
start_nginx upstream "server { listen 127.0.0.1:$upstream_port; location / { return 200 \"ok\"; } }"
wait_http -X POST "http://127.0.0.1:$upstream_port/"
start_gateway "$binary" gw "$IDEM_TEST_REDIS_URL" "$port" "$admin"

IDEM_BENCH_RUN="$(date +%s)$$"
export IDEM_BENCH_RUN IDEM_BENCH_INVOCATION=0

# redis_stat NAME: one field of INFO stats.
redis_stat() { "${redis[@]}" info stats | tr -d '\r' | sed -n "s/^$1://p"; }

echo "$me: gateway with the redis:// store, wrk -t2 -d${duration}s at ${connection_list} connections; load average $(cut -d' ' -f1 /proc/loadavg)" >&2
printf '| connections | req/s | calls/req | cmds/read | evalsha us | redis us/req | gateway us/req |\n|---:|---:|---:|---:|---:|---:|---:|\n'
for c in "${connections[@]}"; do
  IDEM_BENCH_INVOCATION=$((IDEM_BENCH_INVOCATION + 1))
  ((duration > 1)) && settle 10
  "${redis[@]}" config resetstat >/dev/null
  cmds0=$(redis_stat total_commands_processed) reads0=$(redis_stat total_reads_processed)
  r0=$(ticks "$redis_pid") g0=$(ticks "${pid_of[gw]}")
  wrk -t2 -c"$c" -d"${duration}s" -s "$here/post.lua" "http://127.0.0.1:$port/" >"$work/wrk.txt"
  r1=$(ticks "$redis_pid") g1=$(ticks "${pid_of[gw]}")
  cmds1=$(redis_stat total_commands_processed) reads1=$(redis_stat total_reads_processed)
  evalsha=$("${redis[@]}" info commandstats | tr -d '\r' | sed -n 's/^cmdstat_evalsha:.*usec_per_call=\([0-9.]*\).*/\1/p')
  "$py" - "$work/wrk.txt" "$c" "$((cmds1 - cmds0))" "$((reads1 - reads0))" "$((r1 - r0))" "$((g1 - g0))" \
    "$(getconf CLK_TCK)" "${evalsha:-0}" <<'EOF'
import re, sys
text = open(sys.argv[1]).read()
c, cmds, reads, redis_ticks, gw_ticks, tick, evalsha = sys.argv[2], *map(float, sys.argv[3:9])
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
done = int(re.search(r"(\d+) requests in", text).group(1))
bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
errs = re.search(r"Socket errors:(.*)", text)
if bad or errs:
    sys.exit("redis_pipelining.sh: %s connections: %s non-2xx, socket errors: %s"
             % (c, bad.group(1) if bad else 0, errs.group(1).strip() if errs else "none"))
print("| %s | %.0f | %.2f | %.1f | %.1f | %.1f | %.1f |" % (c, rps, cmds / done, 2 * done / max(reads, 1), evalsha,
      redis_ticks / tick * 1e6 / done, gw_ticks / tick * 1e6 / done))
EOF
done
all_executed "gateway" "$admin"
