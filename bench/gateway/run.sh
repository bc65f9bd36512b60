#!/usr/bin/env bash
# idem-gateway throughput and latency against nginx, side by side, in one run, same upstream.
#
#   (a) upstream alone        a static nginx: `return 200 "ok"` (so the upstream is not the bottleneck)
#   (b) nginx reverse proxy   in front of (a), HTTP/1.1 upstream keepalive
#   (c) idem-gateway          in front of (a), store memory:
#   (d) idem-gateway          in front of (a), store sqlite: (synchronous=FULL, the default)
#
# wrk sends POSTs with a fresh Idempotency-Key each (bench/gateway/post.lua), so every request
# through the gateway is a claim + execute + complete, never a replay.
#
# usage: bench/gateway/run.sh [--quick] [--gateway PATH] [--out-dir DIR]
#                             [--duration SECONDS] [--threads N] [--connections N]
#   --quick     2 s per case, no warm-up: proves the script works (CI); figures not meaningful
#   --out-dir   where results.md, results.dat and the PNG go. Default: update docs/benchmarks.md
#               (section "## Gateway") and docs/img/gateway_bench.png
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here="$root/bench/gateway"

shown_args=()  # the command line as docs/benchmarks.md shows it (no local paths)
quick=0
gateway=""
out_dir=""
duration=10
threads=2
connections=64
warmup=2
while (($#)); do
  case "$1" in
    --quick) quick=1; duration=2; warmup=0; shown_args+=("$1"); shift ;;
    --gateway) gateway=$2; shift 2 ;;
    --out-dir) out_dir=$2; shift 2 ;;
    --duration) duration=$2; shown_args+=("$1" "$2"); shift 2 ;;
    --threads) threads=$2; shown_args+=("$1" "$2"); shift 2 ;;
    --connections) connections=$2; shown_args+=("$1" "$2"); shift 2 ;;
    -h|--help) sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument: $1" >&2; exit 2 ;;
  esac
done

if [ -z "$gateway" ]; then
  for candidate in "$root"/build/release/gateway/idem-gateway "$root"/build-gw/gateway/idem-gateway \
                   "$root"/build-e2e/gateway/idem-gateway "$root"/build/gateway/idem-gateway; do
    if [ -x "$candidate" ]; then gateway=$candidate; break; fi
  done
fi
[ -x "$gateway" ] || { echo "run.sh: idem-gateway not found; build it or pass --gateway PATH" >&2; exit 2; }
for tool in wrk nginx gnuplot python3 curl; do
  command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] ||
    { echo "run.sh: $tool is missing (scripts/deps installs it)" >&2; exit 2; }
done
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
# The system interpreter: a version-manager shim (pyenv) can take seconds to start.
py=python3
[ -x /usr/bin/python3 ] && py=/usr/bin/python3

work=$(mktemp -d -t idem-bench-gw.XXXXXX)
pids=()
cleanup() {
  local rc=$?
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
  if [ $rc -ne 0 ]; then
    for log in "$work"/*.log; do [ -s "$log" ] && { echo "---- $log" >&2; tail -20 "$log" >&2; }; done
  fi
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT INT TERM

# free_ports N: N distinct ports that were free a moment ago.
free_ports() {
  "$py" -c 'import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))' "$1"
}

# Waits until `curl ARGS` succeeds (max 10 s).
wait_http() {
  for _ in $(seq 200); do
    if curl -fsS -o /dev/null --max-time 1 "$@" 2>/dev/null; then return 0; fi
    sleep 0.05
  done
  echo "run.sh: not ready: $*" >&2
  return 1
}

# start_nginx NAME SERVER_BLOCK: a non-daemon nginx with its own prefix, pid file and logs.
start_nginx() {
  local name=$1 server=$2 prefix="$work/$1"
  mkdir -p "$prefix/logs" "$prefix/tmp"
  cat >"$prefix/nginx.conf" <<EOF
daemon off;
worker_processes auto;
pid $prefix/nginx.pid;
error_log $prefix/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $prefix/tmp/body;
  proxy_temp_path $prefix/tmp/proxy;
  fastcgi_temp_path $prefix/tmp/fastcgi;
  uwsgi_temp_path $prefix/tmp/uwsgi;
  scgi_temp_path $prefix/tmp/scgi;
  keepalive_requests 1000000;
  $server
}
EOF
  "$nginx_bin" -p "$prefix" -c "$prefix/nginx.conf" -e "$prefix/logs/error.log" >"$work/$name.log" 2>&1 &
  pids+=($!)
}

start_gateway() {
  local name=$1 store=$2 port=$3 admin=$4
  cat >"$work/$name.toml" <<EOF
# No [[route]]: every POST and PATCH is handled, key optional (wrk always sends one).
upstream_timeout = "30s"
max_body = "1MiB"
# No line per key, as nginx runs with access_log off.
log_level = "warn"
EOF
  "$gateway" --config "$work/$name.toml" --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" \
    --upstream "http://127.0.0.1:$upstream_port" --store "$store" >"$work/$name.log" 2>&1 &
  pids+=($!)
  wait_http "http://127.0.0.1:$admin/healthz"
}

read -r upstream_port proxy_port mem_port mem_admin sql_port sql_admin < <(free_ports 6)

start_nginx upstream "server { listen 127.0.0.1:$upstream_port; location / { return 200 \"ok\"; } }"
start_nginx proxy "upstream up { server 127.0.0.1:$upstream_port; keepalive 64; }
  server { listen 127.0.0.1:$proxy_port; location / { proxy_pass http://up; proxy_http_version 1.1;
    proxy_set_header Connection \"\"; proxy_set_header Host \$host; } }"
wait_http -X POST "http://127.0.0.1:$upstream_port/"
wait_http -X POST "http://127.0.0.1:$proxy_port/"
start_gateway gw-memory "memory:" "$mem_port" "$mem_admin"
start_gateway gw-sqlite "sqlite:$work/bench.db" "$sql_port" "$sql_admin"
curl -fsS -o /dev/null -X POST -H "Idempotency-Key: bench-smoke-0000000001" "http://127.0.0.1:$mem_port/" ||
  { echo "run.sh: the memory gateway does not answer a POST" >&2; exit 1; }

export IDEM_BENCH_RUN="$(date +%s)$$"
results="$work/results.tsv"
: >"$results"

# bench LABEL URL: one wrk run; appends "label req/s p50_ms p99_ms non2xx" to $results.
bench() {
  local label=$1 url=$2 out="$work/wrk.$RANDOM.txt"
  if ((warmup > 0)); then
    wrk -t"$threads" -c"$connections" -d"${warmup}s" -s "$here/post.lua" "$url" >/dev/null
  fi
  wrk -t"$threads" -c"$connections" -d"${duration}s" --latency -s "$here/post.lua" "$url" >"$out"
  "$py" - "$label" "$out" >>"$results" <<'EOF'
import re, sys
label, path = sys.argv[1], sys.argv[2]
text = open(path).read()
def ms(v):
    n, unit = re.match(r"([\d.]+)(us|ms|s|m)", v).groups()
    return float(n) * {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}[unit]
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
lat = dict(re.findall(r"^\s+(50|99)%\s+(\S+)", text, re.M))
bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
errs = re.search(r"Socket errors:.*", text)
print("%s\t%.0f\t%.3f\t%.3f\t%d\t%s" % (label, rps, ms(lat["50"]), ms(lat["99"]),
      int(bad.group(1)) if bad else 0, errs.group(0) if errs else ""))
EOF
  echo "  $(tail -1 "$results")" >&2
}

load_before=$(cut -d' ' -f1 /proc/loadavg)
echo "run.sh: wrk -t$threads -c$connections -d${duration}s per case (warm-up ${warmup}s); load average $load_before" >&2
if awk -v l="$load_before" -v c="$(nproc)" 'BEGIN { exit !(l > c) }'; then
  echo "run.sh: warning: load average $load_before above $(nproc) cores: other work will skew the figures" >&2
fi
bench "(a) upstream alone" "http://127.0.0.1:$upstream_port/"
bench "(b) nginx proxy" "http://127.0.0.1:$proxy_port/"
bench "(c) idem-gateway memory" "http://127.0.0.1:$mem_port/"
bench "(d) idem-gateway sqlite" "http://127.0.0.1:$sql_port/"

# Every gateway request must have executed (fresh keys): check a non-2xx count of zero.
journal="?"
if [ -s "$work/bench.db" ]; then
  journal=$("$py" -c "import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute('pragma journal_mode').fetchone()[0])" "$work/bench.db" 2>/dev/null || echo "?")
fi

mkdir -p "${out_dir:-$root/docs/img}"
dat="$work/results.dat"
awk -F'\t' '{ printf "\"%s\" %s %s %s\n", $1, $2, $3, $4 }' "$results" >"$dat"
png_dir=${out_dir:-$root/docs/img}
png="$png_dir/gateway_bench.png"
cores=$(nproc)
cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
subtitle="wrk -t$threads -c$connections -d${duration}s, POST with a fresh Idempotency-Key; $cores cores ($cpu) shared by wrk, nginx and the gateway"
gnuplot -e "datafile='$dat'; outfile='$png'; subtitle='$subtitle'" "$here/plot.gp"

command_line="bench/gateway/run.sh${shown_args[*]:+ ${shown_args[*]}}"
section="$work/section.md"
"$py" - "$results" "$section" "$command_line" "$threads" "$connections" "$duration" "$cores" "$cpu" \
  "$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)$(
     [ -n "$(git -C "$root" status --porcelain -- core http gateway stores 2>/dev/null)" ] &&
     echo ' (with uncommitted changes)')" "$(date -u +%Y-%m-%d)" \
  "$(wrk --version 2>&1 | head -1 | awk '{print $2}')" "$("$nginx_bin" -v 2>&1 | sed 's/.*nginx\///')" "$journal" "$warmup" \
  "$load_before" <<'EOF'
import sys
(results, out, cmd, threads, conns, dur, cores, cpu, commit, day, wrk_v, nginx_v, journal, warm, load) = sys.argv[1:]
rows = [l.rstrip("\n").split("\t") for l in open(results) if l.strip()]
by = {r[0][:3]: r for r in rows}
b = float(by["(b)"][1])
lines = []
lines.append("## Gateway\n")
lines.append("idem-gateway against nginx in one run, same upstream: a static nginx answering `return 200 \"ok\"`.")
lines.append("wrk sends POSTs, each with a fresh `Idempotency-Key` and a 51-byte JSON body "
             "(`bench/gateway/post.lua`), so every gateway request claims, executes and completes a record.\n")
lines.append("| case | req/s | p50 (ms) | p99 (ms) | vs (b) | non-2xx |")
lines.append("|---|---:|---:|---:|---:|---:|")
for r in rows:
    label, rps, p50, p99, bad = r[0], float(r[1]), float(r[2]), float(r[3]), r[4]
    lines.append("| %s | %.0f | %.2f | %.2f | %.2f | %s |" % (label, rps, p50, p99, rps / b, bad))
c = float(by["(c)"][1]) / b
d = float(by["(d)"][1]) / b
lines.append("")
lines.append("Ratios: **(c)/(b) = %.2f** (goal ≥ 0.9), **(d)/(b) = %.2f** (goal ≥ 0.5)." % (c, d))
lines.append("")
lines.append("![gateway benchmark](img/gateway_bench.png)\n")
lines.append("- Command: `%s` (wrk `-t%s -c%s -d%ss --latency`, %s s warm-up per case; "
             "`--quick` for a 2 s smoke run)." % (cmd, threads, conns, dur, warm))
lines.append("- Machine: %s cores (%s), load average %s when the run started. wrk, both nginx processes "
             "and the gateway share the cores, so every case pays for its load generator; read the ratios, "
             "not the absolute numbers." % (cores, cpu, load))
lines.append("- (b) nginx `worker_processes auto`, `proxy_http_version 1.1`, upstream `keepalive 64`. "
             "(c), (d) idem-gateway with no `[[route]]` (every POST handled), `log_level = \"warn\"` (nginx has "
             "`access_log off`), defaults otherwise (one event loop per core); "
             "(d) `sqlite:` store, WAL (journal_mode=%s), `synchronous=FULL`." % journal)
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
