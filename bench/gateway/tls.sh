#!/usr/bin/env bash
# What TLS costs the gateway (issue 39), two comparisons in one run, each in interleaved rounds
# (A B, B A, A B, ...) so both sides see the same drift of these shared cores (see ab.sh). One
# static nginx (`return 200 "ok"`, plain on one port, TLS on another) is every side's upstream;
# wrk drives one side at a time with bench/gateway/post.lua (a POST with a fresh Idempotency-Key).
#
# listener  G: idem-gateway (memory store, no [[route]]) with a [tls] listener, against
#           N: nginx terminating TLS (`listen ... ssl`, the same certificate, TLS 1.2/1.3,
#              worker_processes auto: one per core, as the gateway has one event loop per core)
#              and proxying over an `upstream {}` block with `keepalive`;
#           wrk over https:// on keep-alive connections. Goal (issue 39): G ≥ 0.9 × N in req/s.
# upstream  H: idem-gateway (plain listener) → http:// upstream, against
#           S: the same binary → https:// upstream (the test CA in [upstream_tls] ca_file).
#           The gateway pools upstream connections, so this is mostly the cost of TLS records.
#
# Per run: req/s, the proxy's CPU per request (user + system of all its threads or processes:
# the gateway, or nginx's master and workers) and the upstream nginx's. At the end, per
# comparison, the medians and the G/N and S/H ratios (of the medians, and the median of the
# rounds' ratios). Certificates: tests/common/tls_certs.py (a test CA, P-256 keys). Fails unless
# every request was answered 2xx without socket errors, and every gateway request was executed.
#
# usage: bench/gateway/tls.sh [--quick] [--rounds N] [--duration SECONDS] [--threads N]
#                             [--connections N] GATEWAY_BINARY
#   --quick   one 1 s round per side: proves the script works (CI); figures not meaningful
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here="$root/bench/gateway"
me=tls.sh
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
    -h|--help) sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "$me: unknown option: $1" >&2; exit 2 ;;
    *) [ -z "$binary" ] || { echo "$me: one gateway binary, please" >&2; exit 2; }; binary=$1; shift ;;
  esac
done
check_gateway_binary
check_positive_integers "$rounds" "$duration" "$threads" "$connections"
require_tools wrk nginx python3 curl openssl

bench_failure_logs() { show_logs "$work"/*.log "$work"/*/logs/error.log; }
make_work_dir tls

# The test CA and its certificates (server.pem for localhost and 127.0.0.1: the listeners';
# upstream.pem: the static nginx's TLS port). Keys are mode 0600, as the gateway requires.
pki="$work/pki"
"$py" "$root/tests/common/tls_certs.py" "$pki" >/dev/null
ca="$pki/ca.pem"

read -r upstream_port upstream_tls_port proxy_port < <(free_ports 3)
start_nginx upstream "server { listen 127.0.0.1:$upstream_port; location / { return 200 \"ok\"; } }
  server { listen 127.0.0.1:$upstream_tls_port ssl; ssl_protocols TLSv1.2 TLSv1.3;
    ssl_certificate $pki/upstream.pem; ssl_certificate_key $pki/upstream.key;
    location / { return 200 \"ok\"; } }"
# As run.sh's (b), with TLS on the listener; keepalive_requests in the upstream block too (nginx
# closes a pooled connection after 1000 requests by default; the gateway's pool does not).
start_nginx proxy "upstream up { server 127.0.0.1:$upstream_port; keepalive 64; keepalive_requests 1000000; }
  server { listen 127.0.0.1:$proxy_port ssl; ssl_protocols TLSv1.2 TLSv1.3;
    ssl_certificate $pki/server.pem; ssl_certificate_key $pki/server.key;
    location / { proxy_pass http://up; proxy_http_version 1.1;
      proxy_set_header Connection \"\"; proxy_set_header Host \$host; } }"
wait_http -X POST "http://127.0.0.1:$upstream_port/"
wait_http --cacert "$ca" -X POST "https://127.0.0.1:$upstream_tls_port/"
wait_http --cacert "$ca" -X POST "https://127.0.0.1:$proxy_port/"

# G: the TLS listener (its plain one unused); H and S: plain listeners, http:// and https:// upstreams.
declare -A port=() admin=() url=()
read -r "port[G]" "admin[G]" tls_port < <(free_ports 3)
start_gateway "$binary" gw-G "memory:" "${port[G]}" "${admin[G]}" "[tls]
listen = \"127.0.0.1:$tls_port\"
cert_file = \"$pki/server.pem\"
key_file = \"$pki/server.key\""
read -r "port[H]" "admin[H]" < <(free_ports 2)
start_gateway "$binary" gw-H "memory:" "${port[H]}" "${admin[H]}"
read -r "port[S]" "admin[S]" < <(free_ports 2)
start_gateway "$binary" gw-S "memory:" "${port[S]}" "${admin[S]}" "[upstream_tls]
ca_file = \"$ca\"" "https://127.0.0.1:$upstream_tls_port"
url[G]="https://127.0.0.1:$tls_port/"
url[N]="https://127.0.0.1:$proxy_port/"
url[H]="http://127.0.0.1:${port[H]}/"
url[S]="http://127.0.0.1:${port[S]}/"
pid_of[N]=${pid_of[proxy]}
for side in G H S; do pid_of[$side]=${pid_of[gw-$side]}; done
# Each side answers through its path before any measurement (a TLS failure would be a 502 here).
for side in G N H S; do wait_http --cacert "$ca" -X POST -H "Idempotency-Key: tls-bench-warm-up-$side-$$" "${url[$side]}"; done

# What each TLS side negotiates with wrk's OpenSSL defaults (the first matters: same suite both sides?).
negotiated() {
  openssl s_client -connect "$1" -servername localhost </dev/null 2>/dev/null |
    awk '/^New, / { sub(/^New, /, ""); sub(/, Cipher is /, " "); print; exit }'
}
echo "$me: TLS negotiated: G $(negotiated "127.0.0.1:$tls_port"); N $(negotiated "127.0.0.1:$proxy_port");" \
  "upstream $(negotiated "127.0.0.1:$upstream_tls_port")" >&2

IDEM_BENCH_RUN="$(date +%s)$$"
export IDEM_BENCH_RUN
export IDEM_BENCH_INVOCATION=0
results="$work/results.tsv"
: >"$results"

# run SIDE ROUND: one wrk run against that side; appends
# "round side req/s proxy_cpu_us upstream_cpu_us non2xx errors".
run() {
  local side=$1 round=$2 out="$work/wrk.txt" t0 t1 u0 u1
  IDEM_BENCH_INVOCATION=$((IDEM_BENCH_INVOCATION + 1))
  ((duration > 1)) && settle 10  # not when --quick: CI proves the script, not the figures
  t0=$(ticks "${pid_of[$side]}")
  u0=$(ticks "${pid_of[upstream]}")
  wrk -t"$threads" -c"$connections" -d"${duration}s" -s "$here/post.lua" "${url[$side]}" >"$out"
  t1=$(ticks "${pid_of[$side]}")
  u1=$(ticks "${pid_of[upstream]}")
  "$py" - "$out" "$side" "$round" "$t0" "$t1" "$u0" "$u1" "$(getconf CLK_TCK)" >>"$results" <<'EOF'
import re, sys
path, side, round_no, (t0, t1, u0, u1, tick) = sys.argv[1], sys.argv[2], sys.argv[3], map(float, sys.argv[4:9])
text = open(path).read()
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
done = int(re.search(r"(\d+) requests in", text).group(1))
bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
errs = re.search(r"Socket errors:(.*)", text)
print("%s\t%s\t%.0f\t%.1f\t%.1f\t%d\t%d" % (round_no, side, rps, (t1 - t0) / tick * 1e6 / done,
      (u1 - u0) / tick * 1e6 / done,
      int(bad.group(1)) if bad else 0, sum(map(int, re.findall(r"\d+", errs.group(1)))) if errs else 0))
EOF
  IFS=$'\t' read -r _ _ rps cpu ucpu _ _ < <(tail -1 "$results")
  printf '%s: round %d  %s  %8s req/s  %6s us CPU/request (upstream %s)\n' "$me" "$round" "$side" "$rps" "$cpu" "$ucpu" >&2
}

echo "$me: listener: G = idem-gateway [tls] listener; N = nginx $("$nginx_bin" -v 2>&1 | sed 's/.*nginx\///') TLS proxy" \
  "(worker_processes auto, $(nproc) cores; the gateway: one event loop per core)" >&2
echo "$me: upstream: H = idem-gateway → http:// upstream; S = idem-gateway → https:// upstream" >&2
echo "$me: store memory; $rounds rounds of wrk -t$threads -c$connections -d${duration}s per side; load average $(cut -d' ' -f1 /proc/loadavg)" >&2
for round in $(seq "$rounds"); do
  # Alternate who goes first, so neither always runs right after the other.
  if ((round % 2)); then run G "$round"; run N "$round"; run H "$round"; run S "$round"
  else run N "$round"; run G "$round"; run S "$round"; run H "$round"; fi
done

failed=0
awk -F'\t' '$6 > 0 || $7 > 0 { printf "tls.sh: round %s, %s: %d non-2xx, %d socket errors\n", $1, $2, $6, $7; bad = 1 }
  END { exit bad }' "$results" >&2 || failed=1
for side in G H S; do all_executed "gateway $side" "${admin[$side]}" || failed=1; done
((failed == 0)) || { echo "$me: failed: not every request was answered 2xx and executed" >&2; exit 1; }

# TLS handshakes over the whole run: one per wrk connection on G; on S, what its pool needed.
handshakes() {
  curl -fsS "http://127.0.0.1:$1/metrics" | awk -v m="$2" 'index($0, m "{") == 1 { sub(/^[^{]*/, ""); printf "%s%s", sep, $0; sep = ", " }'
}
echo "handshakes: G listener $(handshakes "${admin[G]}" idem_tls_handshakes_total); S upstream $(handshakes "${admin[S]}" idem_upstream_tls_handshakes_total)"

"$py" - "$results" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
rounds = sorted({r[0] for r in rows}, key=int)
val = {(r[0], r[1], col): float(r[col]) for r in rows for col in (2, 3, 4)}
col = lambda side, c: [val[(n, side, c)] for n in rounds]
med = statistics.median

def compare(title, a, b, label):
    # b/a: the side under test over the reference
    print(title)
    print("  side  median req/s  range            median us CPU/request  range          upstream us CPU/request")
    for s in (a, b):
        rps, cpu, up = col(s, 2), col(s, 3), col(s, 4)
        print("  %-4s  %12.0f  %6.0f-%-8.0f  %21.1f  %5.1f-%-7.1f  %23.1f" % (
            s, med(rps), min(rps), max(rps), med(cpu), min(cpu), max(cpu), med(up)))
    for name, c in (("req/s", 2), ("CPU per request", 3), ("upstream CPU per request", 4)):
        ratios = [val[(n, b, c)] / val[(n, a, c)] for n in rounds]
        print("  %s: %s %.3f of the medians, %.3f median of the rounds' ratios (rounds %s)" % (
            label, name, med(col(b, c)) / med(col(a, c)), med(ratios), ", ".join("%.2f" % r for r in ratios)))

compare("listener: G = idem-gateway with a TLS listener, N = nginx terminating TLS", "N", "G", "G/N")
compare("upstream: H = gateway -> http:// upstream, S = gateway -> https:// upstream", "H", "S", "S/H")
EOF
