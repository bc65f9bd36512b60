#!/usr/bin/env bash
# What verifying webhooks costs (docs/webhooks.md): one idem-gateway binary run twice side by side,
# memory store, in front of one static nginx (`return 200 "ok"`), driven by wrk in interleaved
# rounds (P W, W P, P W, ...) so both see the same drift of these shared cores (see ab.sh).
#
# Both get the same requests (bench/gateway/webhook.lua): a POST of a GitHub-style event body with
# a fresh delivery id in X-GitHub-Delivery and Idempotency-Key, and the body's X-Hub-Signature-256.
# P's route is a plain keyed route (the key from Idempotency-Key, nothing verified); W's is a
# webhook route (provider = "github", two secrets as during a rotation, the signature made with
# the second: every request computes both HMACs). Per run: req/s and the gateway's CPU per request
# (user + system, all its threads); at the end the medians and the W/P ratios. Fails unless every
# request of both gateways was executed and answered 2xx (a 400 would count as not executed).
#
# usage: bench/gateway/webhook.sh [--quick] [--rounds N] [--duration SECONDS] [--threads N]
#                                 [--connections N] GATEWAY_BINARY
#   --quick   one 1 s round per side: proves the script works (CI); figures not meaningful
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here="$root/bench/gateway"
me=webhook.sh
# shellcheck source=bench/gateway/lib.sh
source "$here/lib.sh"

rounds=6
duration=8
threads=2
connections=64
binary=""
while (($#)); do
  case "$1" in
    --quick) rounds=1; duration=1; shift ;;
    --rounds) rounds=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --connections) connections=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "$me: unknown option: $1" >&2; exit 2 ;;
    *) [ -z "$binary" ] || { echo "$me: one gateway binary, please" >&2; exit 2; }; binary=$1; shift ;;
  esac
done
check_gateway_binary
check_positive_integers "$rounds" "$duration" "$threads" "$connections"
require_tools wrk nginx python3 curl openssl

make_work_dir webhook

# Two secrets, as during a rotation; the events are signed with the second, so every request
# computes two HMACs (the gateway tries every secret, whatever matched).
printf 'old-%s\nnew-%s\n' "$(openssl rand -hex 16)" "$(openssl rand -hex 16)" >"$work/github.secret"
chmod 600 "$work/github.secret"
export IDEM_BENCH_BODY='{"ref":"refs/heads/main","before":"6113728f27ae82c7b1a177c8d03f9e96e0adf246","after":"59b20b8d5c6ff8d09518454d4dd8b7b30f095ab5","repository":{"id":1296269,"full_name":"octocat/Hello-World"},"pusher":{"name":"octocat"}}'
IDEM_BENCH_SIGNATURE="sha256=$(printf '%s' "$IDEM_BENCH_BODY" |
  openssl dgst -sha256 -hmac "$(sed -n 2p "$work/github.secret")" -r | cut -d' ' -f1)"
export IDEM_BENCH_SIGNATURE

read -r upstream_port < <(free_ports 1)
start_nginx upstream "server { listen 127.0.0.1:$upstream_port; location / { return 200 \"ok\"; } }"
wait_http -X POST "http://127.0.0.1:$upstream_port/"

declare -A port=() admin=() route=()
route[P]='[[route]]
method = "POST"
path = "/hooks/github"'
route[W]="[[route]]
method = \"POST\"
path = \"/hooks/github\"
webhook = { provider = \"github\", secret_file = \"$work/github.secret\" }"
for side in P W; do
  read -r port[$side] admin[$side] < <(free_ports 2)
  start_gateway "$binary" "gw-$side" "memory:" "${port[$side]}" "${admin[$side]}" "${route[$side]}"
done

export IDEM_BENCH_RUN="$(date +%s)$$"
export IDEM_BENCH_INVOCATION=0
results="$work/results.tsv"
: >"$results"

# run SIDE ROUND: one wrk run against that gateway; appends "round side req/s cpu_us non2xx errors".
run() {
  local side=$1 round=$2 out="$work/wrk.txt" t0 t1
  IDEM_BENCH_INVOCATION=$((IDEM_BENCH_INVOCATION + 1))
  ((duration > 1)) && settle 10  # not when --quick: CI proves the script, not the figures
  t0=$(ticks "${pid_of[gw-$side]}")
  wrk -t"$threads" -c"$connections" -d"${duration}s" -s "$here/webhook.lua" "http://127.0.0.1:${port[$side]}/" \
    -- "$threads" >"$out"
  t1=$(ticks "${pid_of[gw-$side]}")
  "$py" - "$out" "$side" "$round" "$t0" "$t1" "$(getconf CLK_TCK)" >>"$results" <<'EOF'
import re, sys
path, side, round_no, t0, t1, tick = sys.argv[1], sys.argv[2], sys.argv[3], *map(float, sys.argv[4:7])
text = open(path).read()
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
done = int(re.search(r"(\d+) requests in", text).group(1))
bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
errs = re.search(r"Socket errors:(.*)", text)
print("%s\t%s\t%.0f\t%.1f\t%d\t%d" % (round_no, side, rps, (t1 - t0) / tick * 1e6 / done,
      int(bad.group(1)) if bad else 0, sum(map(int, re.findall(r"\d+", errs.group(1)))) if errs else 0))
EOF
  IFS=$'\t' read -r _ _ rps cpu _ _ < <(tail -1 "$results")
  printf '%s: round %d  %s  %8s req/s  %6s us CPU/request\n' "$me" "$round" "$side" "$rps" "$cpu" >&2
}

echo "$me: P = a plain keyed route; W = the same route with webhook = { provider = \"github\" } (2 secrets)" >&2
echo "$me: store memory; $rounds rounds of wrk -t$threads -c$connections -d${duration}s each; load average $(cut -d' ' -f1 /proc/loadavg)" >&2
for round in $(seq "$rounds"); do
  if ((round % 2)); then run P "$round"; run W "$round"; else run W "$round"; run P "$round"; fi
done

failed=0
awk -F'\t' '$5 > 0 || $6 > 0 { printf "webhook.sh: round %s, %s: %d non-2xx, %d socket errors\n", $1, $2, $5, $6; bad = 1 }
  END { exit bad }' "$results" >&2 || failed=1
for side in P W; do all_executed "gateway $side" "${admin[$side]}" || failed=1; done
((failed == 0)) || { echo "$me: failed: not every request was answered 2xx and executed" >&2; exit 1; }

"$py" - "$results" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
side = lambda s, col: [float(r[col]) for r in rows if r[1] == s]
p_rps, w_rps, p_cpu, w_cpu = side("P", 2), side("W", 2), side("P", 3), side("W", 3)
rounds = sorted({r[0] for r in rows}, key=int)
by = {(r[0], r[1]): float(r[2]) for r in rows}
ratios = [by[(n, "W")] / by[(n, "P")] for n in rounds]
cpu_by = {(r[0], r[1]): float(r[3]) for r in rows}
cpu_ratios = [cpu_by[(n, "W")] / cpu_by[(n, "P")] for n in rounds]
print("route    median req/s  range            median us CPU/request  range")
for name, rps, cpu in (("plain", p_rps, p_cpu), ("webhook", w_rps, w_cpu)):
    print("%-7s  %12.0f  %6.0f-%-8.0f  %21.1f  %.1f-%.1f" % (name, statistics.median(rps), min(rps), max(rps),
                                                           statistics.median(cpu), min(cpu), max(cpu)))
print("webhook/plain: req/s %.3f of the medians, %.3f median of the rounds' ratios (rounds %s)" % (
    statistics.median(w_rps) / statistics.median(p_rps), statistics.median(ratios),
    ", ".join("%.2f" % r for r in ratios)))
print("webhook/plain: CPU per request %.3f of the medians, %.3f median of the rounds' ratios (rounds %s)" % (
    statistics.median(w_cpu) / statistics.median(p_cpu), statistics.median(cpu_ratios),
    ", ".join("%.2f" % r for r in cpu_ratios)))
EOF
