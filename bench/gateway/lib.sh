# Shared by the gateway benchmarks (run.sh, ab.sh); sourced, not run.
#
# The caller sets `me` (its name, for messages), calls require_tools (which sets py and
# nginx_bin), then make_work_dir (or sets work, a temporary directory, and declares `pids=()`,
# what its cleanup stops, and `declare -A pid_of=()`, processes by name), and sets upstream_port
# before start_gateway.

# require_tools TOOL...: exits 2 naming the first one missing; then sets nginx_bin and py.
require_tools() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null || [ -x "/usr/sbin/$tool" ] ||
      { echo "$me: $tool is missing (scripts/deps installs it)" >&2; exit 2; }
  done
  nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
  # The system interpreter: a version-manager shim (pyenv) can take seconds to start.
  py=python3
  [ -x /usr/bin/python3 ] && py=/usr/bin/python3
}

# check_gateway_binary: after option parsing, exits 2 unless $binary names an executable.
check_gateway_binary() {
  [ -n "$binary" ] || { echo "$me: expected an idem-gateway binary; see --help" >&2; exit 2; }
  [ -x "$binary" ] || { echo "$me: not an executable: $binary" >&2; exit 2; }
}

# check_positive_integers N...: exits 2 naming the first that is not a positive integer.
check_positive_integers() {
  local n
  for n in "$@"; do
    [[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "$me: expected a positive integer, got \"$n\"" >&2; exit 2; }
  done
}

# make_work_dir NAME: sets work (a fresh temporary directory), pids and pid_of, and the traps
# that, at exit, stop every process in pids, call the caller's bench_cleanup_hook if it defines
# one (stopping servers), show the logs after a failure (the caller's bench_failure_logs if it
# defines one, else $work/*.log) and remove $work.
make_work_dir() {
  work=$(mktemp -d -t "idem-bench-$1.XXXXXX")
  pids=()
  declare -gA pid_of=()
  trap bench_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

bench_cleanup() {
  local rc=$?
  trap '' INT TERM
  stop_processes
  if declare -F bench_cleanup_hook >/dev/null; then bench_cleanup_hook; fi
  if [ $rc -ne 0 ]; then
    if declare -F bench_failure_logs >/dev/null; then bench_failure_logs; else show_logs "$work"/*.log; fi
  fi
  rm -rf "$work"
  exit $rc
}

# stop_processes: SIGTERM to everything in `pids`, then SIGKILL to what is left after 5 s.
stop_processes() {
  local pid
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  done
}

# show_logs FILE...: the last lines of each non-empty file, on stderr (after a failure).
show_logs() {
  local log
  for log in "$@"; do
    [ -s "$log" ] && { echo "---- $log" >&2; tail -20 "$log" >&2; }
  done
  return 0
}

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
  echo "$me: not ready: $*" >&2
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
  pid_of[$name]=$!
}

# start_gateway BINARY NAME STORE_URL PORT ADMIN_PORT [EXTRA_TOML] [UPSTREAM_URL]: an idem-gateway
# in front of the upstream (UPSTREAM_URL, default http://127.0.0.1:$upstream_port), with no
# [[route]] and warn-level logging, EXTRA_TOML (tables such as [tenant]) appended to its config;
# returns once its /healthz answers.
start_gateway() {
  local binary=$1 name=$2 store=$3 port=$4 admin=$5 extra=${6:-} upstream=${7:-http://127.0.0.1:$upstream_port}
  cat >"$work/$name.toml" <<EOF
# No [[route]]: every POST and PATCH is handled, key optional (wrk always sends one).
upstream_timeout = "30s"
max_body = "1MiB"
# No line per key, as nginx runs with access_log off.
log_level = "warn"
$extra
EOF
  "$binary" --config "$work/$name.toml" --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" \
    --upstream "$upstream" --store "$store" >"$work/$name.log" 2>&1 &
  pids+=($!)
  pid_of[$name]=$!
  wait_http "http://127.0.0.1:$admin/healthz"
}

# ticks PID...: CPU clock ticks (user + system) used so far by these processes, their threads and
# their child processes (nginx workers, PostgreSQL backends).
ticks() {
  local pid child total=0
  for pid in "$@"; do
    for child in "$pid" $(pgrep -P "$pid" || true); do
      total=$((total + $(awk '{ print $14 + $15 }' "/proc/$child/stat" 2>/dev/null || echo 0)))
    done
  done
  echo "$total"
}

# all_executed LABEL ADMIN_PORT: whether every request that gateway answered was executed. A
# replay (a key sent twice) would be a request the upstream never saw, cheaper than the work
# meant to be measured. Says why on stderr when not.
all_executed() {
  local label=$1 admin=$2 metrics not_executed
  metrics=$(curl -fsS "http://127.0.0.1:$admin/metrics") ||
    { echo "$me: $label: /metrics does not answer" >&2; return 1; }
  not_executed=$(awk '/^idem_requests_total\{/ && !/outcome="executed"/ { n += $2 } END { print n + 0 }' <<<"$metrics")
  if [ "$not_executed" != 0 ]; then
    echo "$me: $label: $not_executed requests were not executed (replayed, refused or failed):" >&2
    grep '^idem_requests_total{' <<<"$metrics" >&2
    return 1
  fi
}

# settle [MAX_SECONDS]: waits (at most MAX_SECONDS, default 20) until the machine's CPUs are
# less than 10 % busy over half a second, so that a case does not pay for background work the
# previous one left behind: a Redis AOF rewrite in a forked child, PostgreSQL's checkpointer and
# autovacuum, a gateway still closing connections. Prints how long it waited when it did.
settle() {
  local max=${1:-20}
  "$py" - "$max" <<'PY' >&2
import sys, time
def busy_idle():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    idle = v[3] + v[4]  # idle + iowait
    return sum(v) - idle, idle
start = time.monotonic()
deadline = start + float(sys.argv[1])
while True:
    b0, i0 = busy_idle()
    time.sleep(0.5)
    b1, i1 = busy_idle()
    share = (b1 - b0) / max(1, (b1 - b0) + (i1 - i0))
    waited = time.monotonic() - start
    if share < 0.10:
        if waited > 1.0:
            print("  settled after %.1f s" % waited)
        break
    if time.monotonic() >= deadline:
        print("  not settled after %.0f s (CPUs still %.0f %% busy); measuring anyway" % (waited, share * 100))
        break
PY
}
