#!/usr/bin/env bash
# What encryption at rest (`[encryption] key_file`, docs/security.md) costs: for each store, one
# idem-gateway without encryption (P) and one with it (E), the same binary, side by side on the
# same kind of store, in front of one static nginx, driven by wrk in interleaved rounds (P E, E P,
# ...) so both see the same drift of these shared cores (see ab.sh).
#
# Stores: memory (each gateway its own), sqlite (a file each, synchronous=FULL) and redis (one
# fresh Redis server, scripts/lib/servers.sh, a database each). Every request is a POST with a
# fresh Idempotency-Key (post.lua): a claim, an execution and a completion, whose response (nginx's
# body of --body-bytes, default 1 KiB: a payment API's answer, not a 2-byte "ok") E encrypts
# before storing it. Per run: req/s and the gateway's CPU per request (user + system, all its
# threads; the store servers are the same for both); at the end, per store, the medians and the
# E/P ratios (median of the rounds' ratios). Fails unless every request of every gateway was
# executed and answered 2xx.
#
# usage: bench/gateway/encryption.sh [--quick] [--rounds N] [--duration SECONDS] [--threads N]
#                                    [--connections N] [--stores LIST] [--body-bytes N] GATEWAY
#   --quick    one 1 s round per side: proves the script works (CI); figures not meaningful
#   --stores   comma-separated subset of memory,sqlite,redis (default: all three)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
here="$root/bench/gateway"
me=encryption.sh
# shellcheck source=bench/gateway/lib.sh
source "$here/lib.sh"

rounds=6
duration=8
threads=2
connections=64
body_bytes=1024
stores=memory,sqlite,redis
binary=""
while (($#)); do
  case "$1" in
    --quick) rounds=1; duration=1; shift ;;
    --rounds) rounds=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --connections) connections=$2; shift 2 ;;
    --stores) stores=$2; shift 2 ;;
    --body-bytes) body_bytes=$2; shift 2 ;;
    -h|--help) sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "$me: unknown option: $1" >&2; exit 2 ;;
    *) [ -z "$binary" ] || { echo "$me: one gateway binary, please" >&2; exit 2; }; binary=$1; shift ;;
  esac
done
check_gateway_binary
check_positive_integers "$rounds" "$duration" "$threads" "$connections" "$body_bytes"
IFS=, read -r -a store_list <<<"$stores"
for s in "${store_list[@]}"; do
  case "$s" in memory|sqlite|redis) ;; *) echo "$me: --stores: unknown store \"$s\" (memory, sqlite, redis)" >&2; exit 2 ;; esac
done
tools=(wrk nginx python3 curl openssl)
[[ ",$stores," == *",redis,"* ]] && tools+=(redis-server redis-cli)
require_tools "${tools[@]}"

bench_cleanup_hook() {
  if [ -d "$work/servers" ]; then
    bash "$root/scripts/lib/servers.sh" stop "$work/servers" || echo "$me: stopping the servers failed" >&2
  fi
}
make_work_dir enc

if [[ ",$stores," == *",redis,"* ]]; then
  bash "$root/scripts/lib/servers.sh" start "$work/servers" redis >"$work/servers.log" 2>&1
  redis_url=$(sed -n 's/^export IDEM_TEST_REDIS_URL=//p' "$work/servers/env")
fi

# The key file, made the way docs/security.md shows.
key_file="$work/keys"
( umask 077; printf 'bench-1 %s\n' "$(openssl rand -base64 32)" >"$key_file" )

pad=$(head -c "$body_bytes" /dev/zero | tr '\0' 'x')
read -r upstream_port < <(free_ports 1)
start_nginx upstream "server { listen 127.0.0.1:$upstream_port; default_type application/json;
  location / { return 200 '$pad'; } }"
wait_http -X POST "http://127.0.0.1:$upstream_port/"

declare -A port=() admin=()
extra_P=""
extra_E="[encryption]
key_file = \"$key_file\""
for s in "${store_list[@]}"; do
  for side in P E; do
    case "$s" in
      memory) url="memory:" ;;
      sqlite) url="sqlite:$work/$side.db" ;;
      redis) url="$redis_url/$([ $side = P ] && echo 1 || echo 2)" ;;
    esac
    extra="extra_$side"
    read -r port[$s$side] admin[$s$side] < <(free_ports 2)
    start_gateway "$binary" "gw-$s-$side" "$url" "${port[$s$side]}" "${admin[$s$side]}" "${!extra}"
  done
done

export IDEM_BENCH_RUN="$(date +%s)$$"
export IDEM_BENCH_INVOCATION=0
results="$work/results.tsv"
: >"$results"

# run STORE SIDE ROUND: one wrk run; appends "round store side req/s cpu_us non2xx errors".
run() {
  local s=$1 side=$2 round=$3 out="$work/wrk.txt" t0 t1
  IDEM_BENCH_INVOCATION=$((IDEM_BENCH_INVOCATION + 1))
  ((duration > 1)) && settle 10  # not when --quick: CI proves the script, not the figures
  t0=$(ticks "${pid_of[gw-$s-$side]}")
  wrk -t"$threads" -c"$connections" -d"${duration}s" -s "$here/post.lua" "http://127.0.0.1:${port[$s$side]}/" >"$out"
  t1=$(ticks "${pid_of[gw-$s-$side]}")
  "$py" - "$out" "$s" "$side" "$round" "$t0" "$t1" "$(getconf CLK_TCK)" >>"$results" <<'EOF'
import re, sys
path, store, side, round_no, t0, t1, tick = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], *map(float, sys.argv[5:8])
text = open(path).read()
rps = float(re.search(r"Requests/sec:\s+([\d.]+)", text).group(1))
done = int(re.search(r"(\d+) requests in", text).group(1))
bad = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", text)
errs = re.search(r"Socket errors:(.*)", text)
print("%s\t%s\t%s\t%.0f\t%.1f\t%d\t%d" % (round_no, store, side, rps, (t1 - t0) / tick * 1e6 / done,
      int(bad.group(1)) if bad else 0, sum(map(int, re.findall(r"\d+", errs.group(1)))) if errs else 0))
EOF
  IFS=$'\t' read -r _ _ _ rps cpu _ _ < <(tail -1 "$results")
  printf '%s: round %d  %-6s %s  %8s req/s  %6s us CPU/request\n' "$me" "$round" "$s" "$side" "$rps" "$cpu" >&2
}

echo "$me: P = no encryption; E = [encryption] (AES-256-GCM); upstream body $body_bytes bytes" >&2
echo "$me: stores ${store_list[*]}; $rounds rounds of wrk -t$threads -c$connections -d${duration}s each; load average $(cut -d' ' -f1 /proc/loadavg)" >&2
for round in $(seq "$rounds"); do
  for s in "${store_list[@]}"; do
    if ((round % 2)); then run "$s" P "$round"; run "$s" E "$round"; else run "$s" E "$round"; run "$s" P "$round"; fi
  done
done

failed=0
awk -F'\t' '$6 > 0 || $7 > 0 { printf "encryption.sh: round %s, %s %s: %d non-2xx, %d socket errors\n", $1, $2, $3, $6, $7; bad = 1 }
  END { exit bad }' "$results" >&2 || failed=1
for s in "${store_list[@]}"; do
  for side in P E; do all_executed "gateway $s $side" "${admin[$s$side]}" || failed=1; done
done
((failed == 0)) || { echo "$me: failed: not every request was answered 2xx and executed" >&2; exit 1; }

# Proof that E encrypted and P did not: the upstream's body in each one's storage, read raw.
needle=${pad:0:64}
stored() {  # stored STORE SIDE: how many stored responses hold the upstream's body in plaintext
  case "$1" in
    sqlite) "$py" -c 'import sys; print(b"".join(open(sys.argv[1] + s, "rb").read() for s in ("", "-wal")
              if __import__("os").path.exists(sys.argv[1] + s)).count(sys.argv[2].encode()))' "$work/$2.db" "$needle" ;;
    redis) local db keys k n=0
           db=$([ "$2" = P ] && echo 1 || echo 2)
           keys=$(redis-cli -u "$redis_url/$db" --scan | head -50 || true)  # 50 records are enough
           for k in $keys; do
             redis-cli -u "$redis_url/$db" GET "$k" | grep -q "$needle" && n=$((n + 1))
           done
           echo "$n" ;;
  esac
}
for s in "${store_list[@]}"; do
  [ "$s" = memory ] && continue
  p_hits=$(stored "$s" P)
  e_hits=$(stored "$s" E)
  if [ "$p_hits" -eq 0 ] || [ "$e_hits" -ne 0 ]; then
    echo "$me: $s: the upstream's body is stored in plaintext $p_hits times by P and $e_hits times by E (expected >0 and 0)" >&2
    exit 1
  fi
done

"$py" - "$results" <<'EOF'
import statistics, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
stores = []
for r in rows:
    if r[1] not in stores:
        stores.append(r[1])
print("store    P req/s   E req/s  E/P req/s (rounds)              P us/req  E us/req  E/P CPU")
for s in stores:
    mine = [r for r in rows if r[1] == s]
    val = {(r[0], r[2]): (float(r[3]), float(r[4])) for r in mine}
    rounds = sorted({r[0] for r in mine}, key=int)
    rps = [val[(n, "E")][0] / val[(n, "P")][0] for n in rounds]
    cpu = [val[(n, "E")][1] / val[(n, "P")][1] for n in rounds]
    med = lambda side, i: statistics.median(val[(n, side)][i] for n in rounds)
    print("%-7s %9.0f %9.0f  %.3f (%s)  %9.1f %9.1f  %.3f" % (
        s, med("P", 0), med("E", 0), statistics.median(rps), " ".join("%.2f" % x for x in rps),
        med("P", 1), med("E", 1), statistics.median(cpu)))
EOF
