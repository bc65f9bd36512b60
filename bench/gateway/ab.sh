#!/usr/bin/env bash
# Interleaved A/B of two idem-gateway builds: how a change to the gateway or a store is measured
# here. On shared virtual cores the speed drifts by tens of percent within a minute, so two runs
# minutes apart say little; runs that alternate (A B, B A, A B, ...) against one upstream see the
# same drift. Every figure in docs/benchmarks.md's "what was done" lists comes from such runs.
#
# Both gateways run side by side in front of one static nginx (`return 200 "ok"`), each with its
# own store, and wrk (bench/gateway/post.lua: a fresh key per request) drives one at a time. Per
# run it prints req/s and the gateway's CPU per request (user + system, all its threads); at the
# end, per build, the medians, and how many rounds B won. It fails unless every request of both
# gateways was executed (no replay) and answered 2xx.
#
# usage: bench/gateway/ab.sh [--store memory|sqlite] [--rounds N] [--duration SECONDS]
#                            [--threads N] [--connections N] A_BINARY B_BINARY
#   --store   memory (default) or sqlite (a fresh file per gateway)
#   --rounds  how many runs each build gets (default 6)
#
# Example: build a commit's gateway twice (git worktree), then
#   bench/gateway/ab.sh /tmp/old/idem-gateway build/release/gateway/idem-gateway
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here="$root/bench/gateway"
me=ab.sh
# shellcheck source=bench/gateway/lib.sh
source "$here/lib.sh"

store=memory
rounds=6
duration=8
threads=2
connections=64
binaries=()
while (($#)); do
  case "$1" in
    --store) store=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --connections) connections=$2; shift 2 ;;
    -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "$me: unknown option: $1" >&2; exit 2 ;;
    *) binaries+=("$1"); shift ;;
  esac
done
((${#binaries[@]} == 2)) || { echo "$me: expected two idem-gateway binaries (A and B); see --help" >&2; exit 2; }
for b in "${binaries[@]}"; do [ -x "$b" ] || { echo "$me: not an executable: $b" >&2; exit 2; }; done
case "$store" in memory|sqlite) ;; *) echo "$me: --store: expected memory or sqlite, got \"$store\"" >&2; exit 2 ;; esac
check_positive_integers "$rounds" "$duration" "$threads" "$connections"
require_tools wrk nginx python3 curl

make_work_dir ab

read -r upstream_port < <(free_ports 1)
start_nginx upstream "server { listen 127.0.0.1:$upstream_port; location / { return 200 \"ok\"; } }"
wait_http -X POST "http://127.0.0.1:$upstream_port/"

declare -A port=() admin=()
for side in A B; do
  binary=${binaries[0]}
  [ "$side" = B ] && binary=${binaries[1]}
  url="memory:"
  [ "$store" = sqlite ] && url="sqlite:$work/$side.db"
  read -r port[$side] admin[$side] < <(free_ports 2)
  start_gateway "$binary" "gw-$side" "$url" "${port[$side]}" "${admin[$side]}"
done

export IDEM_BENCH_RUN="$(date +%s)$$"
export IDEM_BENCH_INVOCATION=0
results="$work/results.tsv"
: >"$results"

# run SIDE ROUND: one wrk run against that gateway; appends "round side req/s cpu_us non2xx errors".
run() {
  local side=$1 round=$2 out="$work/wrk.txt" t0 t1
  IDEM_BENCH_INVOCATION=$((IDEM_BENCH_INVOCATION + 1))
  t0=$(ticks "${pid_of[gw-$side]}")
  wrk -t"$threads" -c"$connections" -d"${duration}s" -s "$here/post.lua" "http://127.0.0.1:${port[$side]}/" >"$out"
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

echo "$me: A = ${binaries[0]}" >&2
echo "$me: B = ${binaries[1]}" >&2
echo "$me: store $store; $rounds rounds of wrk -t$threads -c$connections -d${duration}s each; load average $(cut -d' ' -f1 /proc/loadavg)" >&2
for round in $(seq "$rounds"); do
  # Alternate who goes first, so neither always runs right after the other.
  if ((round % 2)); then run A "$round"; run B "$round"; else run B "$round"; run A "$round"; fi
done

failed=0
awk -F'\t' '$5 > 0 || $6 > 0 { printf "ab.sh: round %s, %s: %d non-2xx, %d socket errors\n", $1, $2, $5, $6; bad = 1 }
  END { exit bad }' "$results" >&2 || failed=1
for side in A B; do all_executed "gateway $side" "${admin[$side]}" || failed=1; done
((failed == 0)) || { echo "$me: failed: not every request was answered 2xx and executed" >&2; exit 1; }

"$py" - "$results" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
side = lambda s, col: [float(r[col]) for r in rows if r[1] == s]
a_rps, b_rps, a_cpu, b_cpu = side("A", 2), side("B", 2), side("A", 3), side("B", 3)
rounds = sorted({r[0] for r in rows}, key=int)
by = {(r[0], r[1]): float(r[2]) for r in rows}
wins = sum(by[(n, "B")] > by[(n, "A")] for n in rounds)
print("build  median req/s  range            median us CPU/request  range")
for name, rps, cpu in (("A", a_rps, a_cpu), ("B", b_rps, b_cpu)):
    print("%-5s  %12.0f  %6.0f-%-8.0f  %21.1f  %.1f-%.1f" % (name, statistics.median(rps), min(rps), max(rps),
                                                          statistics.median(cpu), min(cpu), max(cpu)))
print("B/A: req/s %.3f, CPU per request %.3f; B faster in %d of %d rounds" % (
    statistics.median(b_rps) / statistics.median(a_rps), statistics.median(b_cpu) / statistics.median(a_cpu),
    wins, len(rounds)))
EOF
