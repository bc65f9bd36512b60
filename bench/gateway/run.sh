#!/usr/bin/env bash
# idem-gateway throughput and latency against nginx, side by side, in one run, same upstream.
#
#   (a) upstream alone        a static nginx: `return 200 "ok"` (so the upstream is not the bottleneck)
#   (b) nginx reverse proxy   in front of (a), HTTP/1.1 upstream keepalive
#   (c) idem-gateway          in front of (a), store memory:
#   (d) idem-gateway          in front of (a), store sqlite: (synchronous=FULL, the default)
#   (e) idem-gateway          in front of (a), store redis:// (standalone, AOF appendfsync everysec)
#   (f) idem-gateway          in front of (a), store postgres:// (PostgreSQL defaults)
#   (g) idem-gateway          in front of (a), store redis+cluster:// (3 masters + 3 replicas)
#   and, with (f), the PostgreSQL ceiling: stores/postgres/bench/pgbench.sh's claim+complete rate
#   against the same server at the same concurrency as wrk (store only, no HTTP).
#
# wrk sends POSTs with a fresh Idempotency-Key each (bench/gateway/post.lua), so every request
# through the gateway is a claim + execute + complete, never a replay. The run fails if a case
# answers anything but 2xx, or a gateway case has socket errors.
# The cases run in rounds (a, b, c, ... then again), because the speed of a shared virtual machine
# drifts by tens of percent within a minute: each case reports its median round, and each ratio
# is the median of the ratios measured within one round.
# PostgreSQL and the Redis servers are started fresh (scripts/lib/servers.sh) under the run's
# temporary directory, only when a store needs them, and stopped at exit.
#
# usage: bench/gateway/run.sh [--quick] [--gateway PATH] [--out-dir DIR] [--stores LIST]
#                             [--duration SECONDS] [--rounds N] [--threads N] [--connections N]
#   --quick     1 round, 2 s per case, no warm-up: proves the script works (CI); figures not
#               meaningful
#   --rounds    how many times every case runs (default 3)
#   --out-dir   where results.md, results.dat and the PNG go. Default: update docs/benchmarks.md
#               (section "## Gateway") and docs/img/gateway_bench.png
#   --stores    comma-separated subset of memory,sqlite,redis,postgres,redis-cluster (default:
#               all); (a) and (b) always run
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here="$root/bench/gateway"
me=run.sh
# shellcheck source=bench/gateway/lib.sh
source "$here/lib.sh"

shown_args=()  # the command line as docs/benchmarks.md shows it (no local paths)
gateway=""
out_dir=""
duration=10
threads=2
connections=64
warmup=2
rounds=3
quick=0
all_stores=memory,sqlite,redis,postgres,redis-cluster
stores=$all_stores
while (($#)); do
  case "$1" in
    --quick) duration=2; warmup=0; rounds=1; quick=1; shown_args+=("$1"); shift ;;
    --gateway) gateway=$2; shift 2 ;;
    --out-dir) out_dir=$2; shift 2 ;;
    --stores) stores=$2; shown_args+=("$1" "$2"); shift 2 ;;
    --duration) duration=$2; shown_args+=("$1" "$2"); shift 2 ;;
    --rounds) rounds=$2; shown_args+=("$1" "$2"); shift 2 ;;
    --threads) threads=$2; shown_args+=("$1" "$2"); shift 2 ;;
    --connections) connections=$2; shown_args+=("$1" "$2"); shift 2 ;;
    -h|--help) sed -n '2,31p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
done

[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "run.sh: --rounds: expected a positive integer, got \"$rounds\"" >&2; exit 2; }

# want STORE: whether --stores selected it.
declare -A selected=()
IFS=, read -r -a store_list <<<"$stores"
for store in "${store_list[@]}"; do
  case ",$all_stores," in
    *",$store,"*) selected[$store]=1 ;;
    *) echo "run.sh: --stores: unknown store \"$store\" (expected a subset of $all_stores)" >&2; exit 2 ;;
  esac
done
((${#selected[@]})) || { echo "run.sh: --stores: no store selected" >&2; exit 2; }
want() { [ -n "${selected[$1]:-}" ]; }

# The servers the shared stores need (scripts/lib/servers.sh names).
servers=()
want postgres && servers+=(postgres)
want redis && servers+=(redis)
want redis-cluster && servers+=(cluster)

if [ -z "$gateway" ]; then
  for candidate in "$root"/build/release/gateway/idem-gateway "$root"/build-gw/gateway/idem-gateway \
                   "$root"/build-e2e/gateway/idem-gateway "$root"/build/gateway/idem-gateway; do
    if [ -x "$candidate" ]; then gateway=$candidate; break; fi
  done
fi
[ -x "$gateway" ] || { echo "run.sh: idem-gateway not found; build it or pass --gateway PATH" >&2; exit 2; }
tools=(wrk nginx gnuplot python3 curl)
want postgres && tools+=(psql)
if want redis || want redis-cluster; then tools+=(redis-server redis-cli); fi
require_tools "${tools[@]}"

work=$(mktemp -d -t idem-bench-gw.XXXXXX)
pids=()
cleanup() {
  local rc=$?
  trap '' INT TERM  # let the cleanup finish
  # The gateways and nginx first (they hold store connections), then the servers.
  stop_processes
  if [ $rc -ne 0 ]; then
    show_logs "$work"/*.log "$work"/servers/*.log "$work"/servers/pg/server.log "$work"/servers/redis/redis.log
  fi
  if [ -d "$work/servers" ]; then
    bash "$root/scripts/lib/servers.sh" stop "$work/servers" || echo "run.sh: stopping the servers failed" >&2
  fi
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT
# A signal exits non-zero (through cleanup), once the foreground command (say wrk) returns.
trap 'exit 130' INT
trap 'exit 143' TERM

declare -A pid_of=()  # nginx and gateway processes by name

# The store servers first. Their URLs come from our own servers only, never from the environment
# (scripts/test exports its shared servers' URLs to the tests). PostgreSQL runs as the postgres
# user when we are root, and must reach its data directory under $work.
unset IDEM_TEST_POSTGRES_URL IDEM_TEST_REDIS_URL IDEM_TEST_REDIS_CLUSTER_URL IDEM_TEST_REDIS_CLUSTER_NODES
if ((${#servers[@]})); then
  chmod 755 "$work"
  echo "run.sh: starting ${servers[*]} (scripts/lib/servers.sh)" >&2
  bash "$root/scripts/lib/servers.sh" start "$work/servers" "${servers[@]}" >"$work/servers.log" 2>&1
  # shellcheck disable=SC1091
  source "$work/servers/env"
fi

read -r upstream_port proxy_port < <(free_ports 2)

start_nginx upstream "server { listen 127.0.0.1:$upstream_port; location / { return 200 \"ok\"; } }"
start_nginx proxy "upstream up { server 127.0.0.1:$upstream_port; keepalive 64; }
  server { listen 127.0.0.1:$proxy_port; location / { proxy_pass http://up; proxy_http_version 1.1;
    proxy_set_header Connection \"\"; proxy_set_header Host \$host; } }"
wait_http -X POST "http://127.0.0.1:$upstream_port/"
wait_http -X POST "http://127.0.0.1:$proxy_port/"
IDEM_BENCH_RUN="$(date +%s)$$"
export IDEM_BENCH_RUN
# Every wrk run (warm-ups included) gets its own number, so no run sends another's keys.
IDEM_BENCH_INVOCATION=0
export IDEM_BENCH_INVOCATION

# The gateway cases, in run order: store name (--stores), label, store URL.
cases=()
want memory && cases+=("memory|(c) idem-gateway memory|memory:")
want sqlite && cases+=("sqlite|(d) idem-gateway sqlite|sqlite:$work/bench.db")
want redis && cases+=("redis|(e) idem-gateway redis|$IDEM_TEST_REDIS_URL")
want postgres && cases+=("postgres|(f) idem-gateway postgres|$IDEM_TEST_POSTGRES_URL")
want redis-cluster && cases+=("redis-cluster|(g) idem-gateway redis cluster|$IDEM_TEST_REDIS_CLUSTER_URL")

# Every gateway starts now (an unusable store fails the run before any measurement) and must
# answer one POST. Each has its own store: the Redis servers and PostgreSQL are fresh, and the
# PostgreSQL store creates its table (schema public) itself.
declare -A gw_port=() gw_admin=()
for c in "${cases[@]}"; do
  IFS='|' read -r name label url <<<"$c"
  read -r port admin < <(free_ports 2)
  start_gateway "$gateway" "gw-$name" "$url" "$port" "$admin"
  gw_port[$name]=$port
  gw_admin[$name]=$admin
  curl -fsS -o /dev/null -X POST -H "Idempotency-Key: bench-smoke-$IDEM_BENCH_RUN-$name" "http://127.0.0.1:$port/" ||
    { echo "run.sh: the $name gateway does not answer a POST with 2xx" >&2; exit 1; }
done

results="$work/results.tsv"
: >"$results"

# children_seconds: user + system CPU seconds of this shell's reaped children (bash `times`, run
# in this shell: in a command substitution it would see the subshell's children only).
children_seconds() {
  times >"$work/times"
  tail -1 "$work/times" | awk '{ n = 0; for (i = 1; i <= 2; i++) { split($i, p, /m|s/); n += p[1] * 60 + p[2] } printf "%.3f", n }'
}

# The store servers' processes (for the CPU columns): "" when the case has none.
server_pids() {
  case $1 in
    redis) cat "$work/servers/redis/redis.pid" ;;
    redis-cluster) cat "$work"/servers/cluster-*/redis.pid | tr '\n' ' ' ;;
    postgres) head -1 "$work/servers/pg/postmaster.pid" ;;
  esac
}

# bench LABEL URL PROXY_PID [STORE_PIDS]: one wrk run; appends "round label req/s p50_ms p99_ms
# non2xx socket_errors cpu_us_per_request(wrk proxy upstream store)" to $results. PROXY_PID is what sits
# between wrk and the upstream (none for (a)).
bench() {
  local label=$1 url=$2 proxy_pid=$3 store_pids=${4:-} out="$work/wrk.$RANDOM.txt"
  # Not when --quick: CI proves the script, not the figures, and other tests keep the CPUs busy.
  ((quick)) || settle
  if ((warmup > 0)); then
    IDEM_BENCH_INVOCATION=$((IDEM_BENCH_INVOCATION + 1))
    wrk -t"$threads" -c"$connections" -d"${warmup}s" -s "$here/post.lua" "$url" >/dev/null
  fi
  local tick up0 px0=0 st0=0 up1 px1=0 st1=0 wrk0 wrk1
  tick=$(getconf CLK_TCK)
  up0=$(ticks "${pid_of[upstream]}")
  [ -n "$proxy_pid" ] && px0=$(ticks "$proxy_pid")
  # shellcheck disable=SC2086
  [ -n "$store_pids" ] && st0=$(ticks $store_pids)
  children_seconds >"$work/wrk0"
  IDEM_BENCH_INVOCATION=$((IDEM_BENCH_INVOCATION + 1))
  wrk -t"$threads" -c"$connections" -d"${duration}s" --latency -s "$here/post.lua" "$url" >"$out"
  children_seconds >"$work/wrk1"
  wrk0=$(cat "$work/wrk0") wrk1=$(cat "$work/wrk1")
  up1=$(ticks "${pid_of[upstream]}")
  [ -n "$proxy_pid" ] && px1=$(ticks "$proxy_pid")
  # shellcheck disable=SC2086
  [ -n "$store_pids" ] && st1=$(ticks $store_pids)
  "$py" - "$label" "$out" "$tick" "$wrk0" "$wrk1" "$px0" "$px1" "$up0" "$up1" "$st0" "$st1" "$store_pids" "$round" \
    >>"$results" <<'EOF'
import re, sys
label, path = sys.argv[1], sys.argv[2]
tick, wrk0, wrk1, px0, px1, up0, up1, st0, st1 = map(float, sys.argv[3:12])
has_store = bool(sys.argv[12].strip())
round_no = sys.argv[13]
text = open(path).read()
def ms(v):
    n, unit = re.match(r"([\d.]+)(us|ms|s|m)", v).groups()
    return float(n) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", text, re.M))
bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
# "Socket errors: connect 0, read 0, write 0, timeout 0": the sum.
errs = re.search(r"Socket errors:(.*)", text)
done = int(re.search(r"(\d+) requests in", text).group(1))
us = lambda seconds: "%.1f" % (seconds * 1e6 / done)
cpu = [us(wrk1 - wrk0), us((px1 - px0) / tick) if label[:3] != "(a)" else "-", us((up1 - up0) / tick),
       us((st1 - st0) / tick) if has_store else "-"]
print("%s\t%s\t%.0f\t%.3f\t%.3f\t%d\t%d\t%s" % (round_no, label, rps, ms(lat["50"]), ms(lat["99"]),
      int(bad.group(1)) if bad else 0, sum(map(int, re.findall(r"\d+", errs.group(1)))) if errs else 0,
      "\t".join(cpu)))
EOF
  echo "  $(tail -1 "$results")" >&2
}

# The PostgreSQL ceiling at wrk's concurrency: appends "1tx/s 2tx/s" to $work/pgbench.tsv.
# (One line per round; the report takes the medians.)
pgbench_ceiling() {
  bash "$root/stores/postgres/bench/pgbench.sh" --clients "$connections" --seconds "$duration" \
    "$IDEM_TEST_POSTGRES_URL" >"$work/pgbench.txt" 2>"$work/pgbench.log"
  awk -v c="$connections" '$1 == c && $2 + 0 > 0 && $3 + 0 > 0 { print $2 "\t" $3; n++ }
    END { exit n != 1 }' "$work/pgbench.txt" >"$work/pgbench.round" ||
    { echo "run.sh: no pgbench figures for $connections clients:" >&2; cat "$work/pgbench.txt" >&2; return 1; }
  cat "$work/pgbench.round" >>"$work/pgbench.tsv"
  echo "  pgbench claim+complete, $connections clients: $(tr '\t' ' ' <"$work/pgbench.round") (1tx/s 2tx/s)" >&2
}

load_before=$(cut -d' ' -f1 /proc/loadavg)
echo "run.sh: $rounds round(s) of wrk -t$threads -c$connections -d${duration}s per case (warm-up ${warmup}s); load average $load_before" >&2
if awk -v l="$load_before" -v c="$(nproc)" 'BEGIN { exit !(l > c) }'; then
  echo "run.sh: warning: load average $load_before above $(nproc) cores: other work will skew the figures" >&2
fi
for round in $(seq "$rounds"); do
  ((rounds == 1)) || echo "run.sh: round $round of $rounds" >&2
  bench "(a) upstream alone" "http://127.0.0.1:$upstream_port/" ""
  bench "(b) nginx proxy" "http://127.0.0.1:$proxy_port/" "${pid_of[proxy]}"
  for c in "${cases[@]}"; do
    IFS='|' read -r name label url <<<"$c"
    bench "$label" "http://127.0.0.1:${gw_port[$name]}/" "${pid_of[gw-$name]}" "$(server_pids "$name")"
    # Right after (f), against the same server and with (f)'s rows in it. Then a checkpoint,
    # so that writing out (f)'s and pgbench's pages does not land in the next case.
    if [ "$name" = postgres ]; then
      pgbench_ceiling
      psql -Atq "$IDEM_TEST_POSTGRES_URL" -c checkpoint >/dev/null
    fi
  done
done

# Every request must have succeeded (fresh keys: every gateway request executed): no non-2xx
# answer in any case, no socket error in a gateway case (nginx's are only reported).
if ! awk -F'\t' '
    $6 > 0 { printf "run.sh: %s, round %d: %d non-2xx responses\n", $2, $1, $6; bad = 1 }
    $7 > 0 && $2 ~ /idem-gateway/ { printf "run.sh: %s, round %d: %d socket errors\n", $2, $1, $7; bad = 1 }
    $7 > 0 && $2 !~ /idem-gateway/ { printf "run.sh: warning: %s, round %d: %d socket errors\n", $2, $1, $7 }
    END { exit bad }' "$results" >&2; then
  echo "run.sh: failed: a case did not answer every request with 2xx; nothing written" >&2
  exit 1
fi

# Every gateway request must have executed: a replay (a key sent twice) would be a request the
# upstream never saw, and cheaper than the work measured.
for c in "${cases[@]}"; do
  IFS='|' read -r name label url <<<"$c"
  all_executed "$label" "${gw_admin[$name]}" || exit 1
done

# One row per case, in run order: its median round by req/s (with that round's latencies and CPU),
# non-2xx and socket errors summed over the rounds. And per gateway case, the ratio to (b) within
# each round and their median.
summary="$work/summary.tsv"
ratios="$work/ratios.tsv"
"$py" - "$results" "$summary" "$ratios" <<'EOF'
import statistics, sys
results, summary, ratios = sys.argv[1:]
rows = [l.rstrip("\n").split("\t") for l in open(results) if l.strip()]
labels = list(dict.fromkeys(r[1] for r in rows))
def median_row(runs):
    ordered = sorted(runs, key=lambda r: float(r[2]))
    return ordered[(len(ordered) - 1) // 2]  # the lower median: a real round, never an average
with open(summary, "w") as out:
    for label in labels:
        runs = [r for r in rows if r[1] == label]
        m = median_row(runs)
        bad = sum(int(r[5]) for r in runs)
        errs = sum(int(r[6]) for r in runs)
        out.write("\t".join([label, m[2], m[3], m[4], str(bad), str(errs)] + m[7:]) + "\n")
with open(ratios, "w") as out:
    proxy = {r[0]: float(r[2]) for r in rows if r[1].startswith("(b)")}
    for label in labels:
        if "idem-gateway" not in label:
            continue
        per_round = [float(r[2]) / proxy[r[0]] for r in rows if r[1] == label]
        out.write("%s\t%.4f\t%s\n" % (label[:3], statistics.median(per_round),
                                      " ".join("%.2f" % v for v in per_round)))
EOF

# Facts about the servers, for the notes.
journal="?"
if [ -s "$work/bench.db" ]; then
  journal=$("$py" -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('pragma journal_mode').fetchone()[0])" "$work/bench.db" 2>/dev/null || echo "?")
fi
pg_facts="?"
if want postgres; then
  pg_facts=$(psql -Atq -F' ' "$IDEM_TEST_POSTGRES_URL" -c "select split_part(current_setting('server_version'), ' ', 1),
    current_setting('synchronous_commit'), current_setting('fsync'), current_setting('wal_sync_method')" 2>/dev/null || echo "?")
fi
# redis_facts HOST:PORT: "VERSION APPENDFSYNC" of that server.
redis_facts() {
  local host=${1%:*} port=${1##*:} version fsync
  version=$(redis-cli -h "$host" -p "$port" info server 2>/dev/null | tr -d '\r' | sed -n 's/^redis_version://p')
  fsync=$(redis-cli -h "$host" -p "$port" config get appendfsync 2>/dev/null | tail -1)
  echo "${version:-?} ${fsync:-?}"
}
redis_facts_e="? ?"
want redis && redis_facts_e=$(redis_facts "${IDEM_TEST_REDIS_URL#redis://}")
redis_facts_g="? ?"
want redis-cluster && redis_facts_g=$(redis_facts "${IDEM_TEST_REDIS_CLUSTER_NODES%%,*}")

mkdir -p "${out_dir:-$root/docs/img}"
dat="$work/results.dat"
# Short labels for the plot's axis: "(c) gateway memory".
awk -F'\t' '{ sub(/idem-gateway /, "gateway ", $1); printf "\"%s\" %s %s %s\n", $1, $2, $3, $4 }' "$summary" >"$dat"
png_dir=${out_dir:-$root/docs/img}
png="$png_dir/gateway_bench.png"
cores=$(nproc)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
subtitle="wrk -t$threads -c$connections -d${duration}s (median of $rounds), POST with a fresh Idempotency-Key; $cores cores ($cpu) shared by wrk, nginx, the gateway${servers[0]:+ and the store servers}"
gnuplot -e "datafile='$dat'; outfile='$png'; subtitle='$subtitle'" "$here/plot.gp"

command_line="bench/gateway/run.sh${shown_args[*]:+ ${shown_args[*]}}"
section="$work/section.md"
"$py" - "$summary" "$section" "$command_line" "$threads" "$connections" "$duration" "$cores" "$cpu" \
  "$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(
     [ -n "$(git -C "$root" status --porcelain -- core http gateway stores 2>/dev/null)" ] &&
     echo ' (with uncommitted changes)')" "$(date -u +%Y-%m-%d)" \
  "$(wrk --version 2>&1 | head -1 | awk '{print $2}')" "$("$nginx_bin" -v 2>&1 | sed 's/.*nginx\///')" "$journal" "$warmup" \
  "$load_before" "$work/pgbench.tsv" "$pg_facts" "$redis_facts_e" "$redis_facts_g" "$ratios" "$rounds" <<'EOF'
import os, statistics, sys
(results, out, cmd, threads, conns, dur, cores, cpu, commit, day, wrk_v, nginx_v, journal, warm, load,
 pgbench, pg_facts, redis_e, redis_g, ratio_file, rounds) = sys.argv[1:]
rows = [l.rstrip("\n").split("\t") for l in open(results) if l.strip()]
by = {r[0][:3]: r for r in rows}
b = float(by["(b)"][1])
def rate(case): return float(by[case][1])
# Per gateway case: the median of its per-round ratios to (b), and those ratios.
ratio_of = {}
for line in open(ratio_file):
    case, median, per_round = line.rstrip("\n").split("\t")
    ratio_of[case] = (float(median), per_round)
def ratio(case, goal):
    median, per_round = ratio_of[case]
    rounds_note = " (rounds: %s)" % per_round.replace(" ", ", ") if int(rounds) > 1 else ""
    return "**%s/(b) = %.2f** (goal ≥ %s)%s" % (case, median, goal, rounds_note)
ceiling = None
if os.path.exists(pgbench):
    per_round = [[float(v) for v in l.split()] for l in open(pgbench) if l.strip()]
    ceiling = [statistics.median(r[i] for r in per_round) for i in (0, 1)]
lines = []
lines.append("## Gateway\n")
lines.append("idem-gateway against nginx in one run, same upstream: a static nginx answering `return 200 \"ok\"`.")
lines.append("wrk sends POSTs, each with a fresh `Idempotency-Key` and a 51-byte JSON body "
             "(`bench/gateway/post.lua`), so every gateway request claims, executes and completes a record.\n")
if int(rounds) > 1:
    lines.append("Every case ran %s times, in rounds; each row is the case's median round, and each ratio is "
                 "the median of the ratios within a round (the speed of these shared cores drifts between "
                 "rounds, and (b) and a gateway case of one round ran a minute apart at most).\n" % rounds)
lines.append("| case | req/s | p50 (ms) | p99 (ms) | vs (b) | non-2xx | socket errors |")
lines.append("|---|---:|---:|---:|---:|---:|---:|")
for r in rows:
    label, rps, p50, p99, bad, errs = r[0], float(r[1]), float(r[2]), float(r[3]), r[4], r[5]
    versus = ratio_of[label[:3]][0] if label[:3] in ratio_of else rps / b
    lines.append("| %s | %.0f | %.2f | %.2f | %.2f | %s | %s |" % (label, rps, p50, p99, versus, bad, errs))
if ceiling:
    lines.append("| *ceiling, not an HTTP case:* pgbench claim+complete, 1 tx (PostgreSQL only) "
                 "| %.0f | – | – | – | – | – |" % ceiling[0])
    lines.append("| *ceiling, not an HTTP case:* pgbench claim+complete, 2 tx (PostgreSQL only) "
                 "| %.0f | – | – | – | – | – |" % ceiling[1])
ratios = []
if "(c)" in by: ratios.append(ratio("(c)", "0.9"))
if "(d)" in by: ratios.append(ratio("(d)", "0.5"))
if "(e)" in by: ratios.append(ratio("(e)", "0.65"))
if "(f)" in by and ceiling:
    ratios.append("**(f)/pgbench 1tx = %.2f** (goal ≥ 1.0; medians)" % (rate("(f)") / ceiling[0]))
    ratios.append("**(f)/pgbench 2tx = %.2f**" % (rate("(f)") / ceiling[1]))
lines.append("")
lines.append("Where the CPU goes: microseconds of CPU (user + system) per request, for each process of "
             "the case, measured over the same wrk run (`/proc/PID/stat`, nginx workers and PostgreSQL "
             "backends included; wrk's from bash `times`). Throughput on these shared cores is roughly "
             "2 cores ÷ the total.\n")
lines.append("| case | wrk | proxy / gateway | upstream | store server | total |")
lines.append("|---|---:|---:|---:|---:|---:|")
for r in rows:
    cells = r[6:10]
    total = sum(float(v) for v in cells if v != "-")
    lines.append("| %s | %s | %s | %s | %s | %.0f |" % (r[0], *cells, total))
lines.append("")
if ratios:
    lines.append("Ratios: " + ", ".join(ratios) + ".")
    lines.append("")
lines.append("![gateway benchmark](img/gateway_bench.png)\n")
lines.append("- Command: `%s` (%s round(s) of wrk `-t%s -c%s -d%ss --latency`, %s s warm-up per case; "
             "`--quick` for one 2 s smoke round)." % (cmd, rounds, threads, conns, dur, warm))
lines.append("- Machine: %s cores (%s), load average %s when the run started. wrk, both nginx processes, "
             "the gateway and the store servers share the cores, so every case pays for its load generator; "
             "read the ratios, not the absolute numbers. Each case starts once the CPUs are idle (less than "
             "10 %% busy, waiting at most 20 s), so that none pays for the background work of the one "
             "before." % (cores, cpu, load))
gateways = [k for k in ("(c)", "(d)", "(e)", "(f)", "(g)") if k in by]
note = ("- (b) nginx `worker_processes auto`, `proxy_http_version 1.1`, upstream `keepalive 64`. "
        "%s idem-gateway with no `[[route]]` (every POST handled), `log_level = \"warn\"` (nginx has "
        "`access_log off`), defaults otherwise (one event loop per core; store defaults)"
        % ", ".join(gateways))
if "(d)" in by:
    note += "; (d) `sqlite:` store, WAL (journal_mode=%s), `synchronous=FULL`" % journal
lines.append(note + ".")
shared = []
if "(e)" in by:
    shared.append("(e) `redis://` one Redis %s, AOF on with `appendfsync %s` (a crash can lose the last "
                  "second of acknowledged records), no RDB snapshots" % tuple(redis_e.split(" ", 1)))
if "(f)" in by:
    pg = (pg_facts.split() + ["?"] * 4)[:4]
    flush = (", so every commit waits for its WAL flush" if pg[1] == "on" and pg[2] == "on" else "")
    shared.append("(f) `postgres://` PostgreSQL %s, server defaults: `synchronous_commit=%s`, `fsync=%s` "
                  "(`wal_sync_method=%s`)%s; the store's defaults (4 connections, group commit of up to 128 "
                  "operations per transaction), table in schema `public`, created by the gateway"
                  % (pg[0], pg[1], pg[2], pg[3], flush))
if "(g)" in by:
    shared.append("(g) `redis+cluster://` a Redis %s Cluster of 3 masters with one replica each, AOF "
                  "`appendfsync %s` on every node, asynchronous replication (no `WAIT`)"
                  % tuple(redis_g.split(" ", 1)))
if shared:
    lines.append("- Shared stores, all fresh for the run on loopback (`scripts/lib/servers.sh`), sharing the "
                 "same cores: " + "; ".join(shared) + ".")
if ceiling:
    lines.append("- Ceiling: `stores/postgres/bench/pgbench.sh --clients %s --seconds %s` against (f)'s server "
                 "right after (f), a fresh random key per transaction on a table with idem's columns and "
                 "indexes: *1 tx* is the claim (INSERT) and the completion (UPDATE) in one transaction, "
                 "*2 tx* in two, i.e. two durable commits per operation as a request needs (the claim is "
                 "durable before the upstream runs). Store only: no HTTP, no upstream, no gateway." % (conns, dur))
lines.append("- Measured %s at commit %s; wrk %s, nginx %s." % (day, commit, wrk_v, nginx_v))
open(out, "w").write("\n".join(lines) + "\n")
EOF

if [ -n "$out_dir" ]; then
  cp "$section" "$out_dir/results.md"
  cp "$dat" "$out_dir/results.dat"
  cat "$section"
else
  doc="$root/docs/benchmarks.md"
  "$py" - "$doc" "$section" <<'EOF'
import os, re, sys
doc, section = sys.argv[1], open(sys.argv[2]).read()
text = open(doc).read() if os.path.exists(doc) else "# Benchmarks\n"
# Replace the "## Gateway" section (up to the next "## " heading), or append it.
pattern = re.compile(r"^## Gateway\n.*?(?=^## |\Z)", re.S | re.M)
if pattern.search(text):
    text = pattern.sub(lambda m: section + "\n", text, count=1)
else:
    text = text.rstrip("\n") + "\n\n" + section
open(doc, "w").write(text.rstrip("\n") + "\n")
EOF
  cat "$section"
  echo "run.sh: wrote $doc and $png" >&2
fi
echo "run.sh: done in ${SECONDS}s" >&2
