#!/usr/bin/env bash
# What HTTP/2 costs the gateway, against nginx's HTTP/2 proxy, in interleaved rounds (A B, B A,
# ...) so both sides see the same drift of these shared cores (see ab.sh). Both sides speak h2 by
# ALPN over TLS (as deployments do) to h2load, and HTTP/1.1 over pooled keep-alive connections to
# the same upstream: a static nginx (`return 200 "ok"`, as tls.sh's), so that neither side waits
# for the upstream.
#
#   G: idem-gateway, memory store, no [[route]], [tls] listener with [http2] tls = true;
#   N: nginx (`listen ... ssl http2`, worker_processes auto: one per core, as the gateway has one
#      event loop per core) proxying over an `upstream {}` block with `keepalive`.
#
# h2load sends the same headers on every request: it cannot send a fresh Idempotency-Key per
# request, so the keyed path that claims, executes and completes a new record is not measured
# here (run.sh and tls.sh measure it with wrk). Two cases instead, each a POST with a JSON body:
#   pass    no key: the gateway passes it through (no store); nginx proxies it. The cost of the
#           h2 listener and the proxying, like for like.
#   replay  one key, executed once before the rounds: the gateway answers every request from its
#           store (the upstream is not called); nginx has no such thing and proxies it. Not like
#           for like: what a retry storm with one key costs each.
#
# Per run: req/s and CPU per request (user + system from /proc/PID/stat: the gateway's threads,
# or nginx's master and workers; and the upstream's). At the end, per case, the medians and the
# G/N ratios. Fails unless every request was answered 2xx, over h2, with no failed stream, and the
# gateway passed through or replayed every one (one execution: the warm-up).
#
# usage: bench/gateway/h2.sh [--quick] [--rounds N] [--duration SECONDS] [--clients N]
#                            [--streams N] [--threads N] GATEWAY_BINARY
#   --quick          one round of 400 requests per side and case: proves the script works (CI)
#   --clients        h2load -c (connections), default 16
#   --streams        h2load -m (concurrent streams per connection), default 10
#   --nginx-only     only N (the gateway binary still names the build tree): checks nginx's side
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here="$root/bench/gateway"
me=h2.sh
# shellcheck source=bench/gateway/lib.sh
source "$here/lib.sh"

rounds=6
duration=8
clients=16
streams=10
threads=1
quick=0
nginx_only=0
binary=""
while (($#)); do
  case "$1" in
    --quick) quick=1; rounds=1; shift ;;
    --rounds) rounds=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --streams) streams=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --nginx-only) nginx_only=1; shift ;;
    -h|--help) sed -n '2,32p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "$me: unknown option: $1" >&2; exit 2 ;;
    *) [ -z "$binary" ] || { echo "$me: one gateway binary, please" >&2; exit 2; }; binary=$1; shift ;;
  esac
done
check_gateway_binary
check_positive_integers "$rounds" "$duration" "$clients" "$streams" "$threads"
require_tools h2load nginx python3 curl openssl

bench_failure_logs() { show_logs "$work"/*.log "$work"/*/logs/error.log "$work"/h2load.txt; }
make_work_dir h2

# The test CA and its certificates (server.pem: localhost and 127.0.0.1); keys mode 0600.
pki="$work/pki"
"$py" "$root/tests/common/tls_certs.py" "$pki" >/dev/null
ca="$pki/ca.pem"

read -r upstream_port proxy_port < <(free_ports 2)
start_nginx upstream "server { listen 127.0.0.1:$upstream_port; location / { return 200 \"ok\"; } }"
wait_http -X POST -d '{}' "http://127.0.0.1:$upstream_port/echo"

# As tls.sh's N, with http2 on the listener. keepalive_requests (lib.sh, in http {}) is also
# nginx's per-connection request limit for h2 (1000 by default, then GOAWAY).
start_nginx proxy "upstream up { server 127.0.0.1:$upstream_port; keepalive 64; keepalive_requests 1000000; }
  server { listen 127.0.0.1:$proxy_port ssl http2; ssl_protocols TLSv1.2 TLSv1.3;
    ssl_certificate $pki/server.pem; ssl_certificate_key $pki/server.key;
    http2_max_concurrent_streams 128;
    location / { proxy_pass http://up; proxy_http_version 1.1;
      proxy_set_header Connection \"\"; proxy_set_header Host \$host; } }"
wait_http --http2 --cacert "$ca" -X POST -d '{}' "https://127.0.0.1:$proxy_port/echo/warm-up"

read -r gw_port gw_admin tls_port < <(free_ports 3)
((nginx_only)) || start_gateway "$binary" gw "memory:" "$gw_port" "$gw_admin" "[tls]
listen = \"127.0.0.1:$tls_port\"
cert_file = \"$pki/server.pem\"
key_file = \"$pki/server.key\"

[http2]
tls = true"
pid_of[G]=${pid_of[gw]:-}
pid_of[N]=${pid_of[proxy]}
declare -A url=([G]="https://127.0.0.1:$tls_port" [N]="https://127.0.0.1:$proxy_port")
path=/echo/h2-bench
body="$work/body.json"
printf '{"amount":100,"currency":"EUR","reference":"bench"}' >"$body"
key="h2-bench-replay-$(date +%s)-$$"

# Each side over h2 before any measurement; the replay key executed once through the gateway.
sides=(G N)
((nginx_only)) && sides=(N)
for side in "${sides[@]}"; do
  v=$(curl -fsS --http2 --cacert "$ca" -o /dev/null -w '%{http_version}' -X POST --data-binary "@$body" \
    "${url[$side]}$path")
  [ "$v" = 2 ] || { echo "$me: $side answered over HTTP/$v, not h2" >&2; exit 1; }
done
((nginx_only)) || curl -fsS --http2 --cacert "$ca" -o /dev/null -X POST --data-binary "@$body" \
  -H "Idempotency-Key: $key" -H 'Content-Type: application/json' "${url[G]}$path"

results="$work/results.tsv"
: >"$results"
if ((quick)); then load=(-n 400); else load=(-D "$duration" --warm-up-time 1); fi

# run SIDE CASE ROUND: one h2load run; appends "round side case req/s cpu_us upstream_cpu_us bad".
run() {
  local side=$1 case=$2 round=$3 out="$work/h2load.txt" t0 t1 u0 u1 hdr=()
  [ "$case" = replay ] && hdr=(-H "idempotency-key: $key")
  ((quick)) || settle 10
  t0=$(ticks "${pid_of[$side]}")
  u0=$(ticks "${pid_of[upstream]}")
  h2load -t "$threads" -c "$clients" -m "$streams" "${load[@]}" -d "$body" -H 'content-type: application/json' \
    "${hdr[@]}" "${url[$side]}$path" >"$out" 2>&1 || { echo "$me: h2load failed against $side:" >&2; cat "$out" >&2; exit 1; }
  t1=$(ticks "${pid_of[$side]}")
  u1=$(ticks "${pid_of[upstream]}")
  "$py" - "$out" "$side" "$case" "$round" "$t0" "$t1" "$u0" "$u1" "$(getconf CLK_TCK)" >>"$results" <<'EOF'
import re, sys
path, side, case, round_no = sys.argv[1:5]
t0, t1, u0, u1, tick = map(float, sys.argv[5:10])
text = open(path).read()
rps = float(re.search(r"finished in [\d.]+\w+, ([\d.]+) req/s", text).group(1))
total, started, done, ok, failed, errored, timeout = map(int, re.search(
    r"requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, (\d+) failed, (\d+) errored, (\d+) timeout",
    text).groups())
s2, s3, s4, s5 = map(int, re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", text).groups())
h2 = "Application protocol: h2" in text
bad = failed + errored + timeout + s3 + s4 + s5 + (done - ok) + (0 if h2 else done or 1)
print("%s\t%s\t%s\t%.0f\t%.1f\t%.1f\t%d\t%d" % (round_no, side, case, rps, (t1 - t0) / tick * 1e6 / max(done, 1),
      (u1 - u0) / tick * 1e6 / max(done, 1), bad, done))
EOF
  IFS=$'\t' read -r _ _ _ rps cpu ucpu bad n_done < <(tail -1 "$results")
  printf '%s: round %d  %s %-6s %8s req/s  %6s us CPU/request (upstream %s)  %s requests%s\n' "$me" "$round" \
    "$side" "$case" "$rps" "$cpu" "$ucpu" "$n_done" "$( ((bad == 0)) || echo ", $bad BAD")" >&2
}

echo "$me: G = idem-gateway [tls] listener + [http2] tls = true; N = nginx $("$nginx_bin" -v 2>&1 | sed 's/.*nginx\///')" \
  "ssl http2 proxy (worker_processes auto, $(nproc) cores; the gateway: one event loop per core)" >&2
echo "$me: upstream: a static nginx (return 200 \"ok\") over HTTP/1.1 keep-alive; store memory" >&2
echo "$me: h2load cannot send a fresh Idempotency-Key per request: cases 'pass' (no key: passed through)" \
  "and 'replay' (one key, executed once, then replayed by the gateway; nginx proxies it)" >&2
if ((quick)); then what="-n ${load[1]}"; else what="-D ${duration}s"; fi
echo "$me: $rounds rounds of h2load -t$threads -c$clients -m$streams $what per side and case; load average $(cut -d' ' -f1 /proc/loadavg)" >&2
for round in $(seq "$rounds"); do
  # Alternate who goes first, so neither always runs right after the other.
  if ((round % 2)); then order=(G N); else order=(N G); fi
  for case in pass replay; do
    for side in "${order[@]}"; do
      ((nginx_only)) && [ "$side" = G ] && continue
      run "$side" "$case" "$round"
    done
  done
done

failed=0
awk -F'\t' '$7 > 0 { printf "h2.sh: round %s, %s %s: %d requests failed, not 2xx or not over h2\n", $1, $2, $3, $7; bad = 1 }
  END { exit bad }' "$results" >&2 || failed=1
# The gateway: every request passed through or replayed; the one execution is the warm-up.
if ((nginx_only == 0)); then
metrics=$(curl -fsS "http://127.0.0.1:$gw_admin/metrics")
counts=$(awk '/^idem_requests_total\{/ { split($1, a, "\""); n[a[2]] += $2 } END { for (k in n) printf "%s=%d ", k, n[k] }' <<<"$metrics")
expected_pass=$(awk -F'\t' '$2 == "G" && $3 == "pass" { n += $8 } END { print n + 0 }' "$results")
expected_replay=$(awk -F'\t' '$2 == "G" && $3 == "replay" { n += $8 } END { print n + 0 }' "$results")
"$py" - "$counts" "$expected_pass" "$expected_replay" <<'EOF' || failed=1
import sys
counts = dict(kv.split("=") for kv in sys.argv[1].split())
counts = {k: int(v) for k, v in counts.items()}
want_pass, want_replay = int(sys.argv[2]), int(sys.argv[3])
others = {k: v for k, v in counts.items() if k not in ("passed_through", "replayed", "executed") and v}
problems = []
if counts.get("executed", 0) != 1:
    problems.append("executed %d times, not once (the warm-up)" % counts.get("executed", 0))
# h2load's warm-up (--warm-up-time) sends requests it does not count: at least as many, not exactly.
if counts.get("passed_through", 0) < want_pass:
    problems.append("passed through %d < %d requests h2load completed" % (counts.get("passed_through", 0), want_pass))
if counts.get("replayed", 0) < want_replay:
    problems.append("replayed %d < %d requests h2load completed" % (counts.get("replayed", 0), want_replay))
if others:
    problems.append("other outcomes: %r" % others)
for p in problems:
    print("h2.sh: gateway: " + p, file=sys.stderr)
sys.exit(1 if problems else 0)
EOF
fi
((failed == 0)) || { echo "$me: failed: not every request was answered 2xx over h2 as expected" >&2; exit 1; }

"$py" - "$results" "${sides[*]}" <<'EOF'
import statistics, sys
sides = sys.argv[2].split()
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
rounds = sorted({r[0] for r in rows}, key=int)
val = {(r[0], r[1], r[2], col): float(r[col]) for r in rows for col in (3, 4, 5)}
med = statistics.median
for case, title in (("pass", "pass: POST without a key (the gateway passes it through; nginx proxies it)"),
                    ("replay", "replay: POST with one key (the gateway replays it from the store; nginx proxies it)")):
    col = lambda side, c: [val[(n, side, case, c)] for n in rounds]
    print(title)
    print("  side  median req/s  range            median us CPU/request  range          upstream us CPU/request")
    for s in [x for x in ("N", "G") if x in sides]:
        rps, cpu, up = col(s, 3), col(s, 4), col(s, 5)
        print("  %-4s  %12.0f  %6.0f-%-8.0f  %21.1f  %5.1f-%-7.1f  %23.1f" % (
            s, med(rps), min(rps), max(rps), med(cpu), min(cpu), max(cpu), med(up)))
    for name, c in (("req/s", 3), ("CPU per request", 4)) if "G" in sides else ():
        ratios = [val[(n, "G", case, c)] / val[(n, "N", case, c)] for n in rounds]
        print("  G/N: %s %.3f of the medians, %.3f median of the rounds' ratios (rounds %s)" % (
            name, med(col("G", c)) / med(col("N", c)), med(ratios), ", ".join("%.2f" % r for r in ratios)))
EOF
