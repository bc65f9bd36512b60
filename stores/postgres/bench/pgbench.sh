#!/usr/bin/env bash
# The raw server ceiling for a claim+complete, measured with pgbench against the same server and
# at the same client concurrency as the store benchmark (idem_postgres_bench), and both side by
# side with their ratio.
#
#   stores/postgres/bench/pgbench.sh [--bench PATH] [--seconds N] [--clients "1 8 64"] [URL]
#
# URL defaults to $IDEM_BENCH_POSTGRES_URL or $IDEM_TEST_POSTGRES_URL. With --bench PATH (the
# idem_postgres_bench binary) the store is measured too, in the same run.
#
# Two pgbench scripts, each with a fresh random key per transaction, on a table with idem's
# columns and indexes (schema idem_pgbench):
#   1tx  BEGIN; INSERT ... ON CONFLICT DO NOTHING; UPDATE ... completed; END;   (the issue's baseline)
#   2tx  the INSERT and the UPDATE as two transactions: two durable commits per operation, as a
#        request needs (the claim must be durable before the operation runs)
set -euo pipefail

bench=""
seconds=10
clients="1 8 64"
while [ $# -gt 0 ]; do
  case $1 in
    --bench) bench=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    -h|--help) sed -n 2,16p "$0"; exit 0 ;;
    *) break ;;
  esac
done
url=${1:-${IDEM_BENCH_POSTGRES_URL:-${IDEM_TEST_POSTGRES_URL:-}}}
[ -n "$url" ] || { echo "pgbench.sh: no URL (argument, IDEM_BENCH_POSTGRES_URL or IDEM_TEST_POSTGRES_URL)" >&2; exit 2; }
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
pgbench=$(command -v pgbench || echo "$pg_bin/pgbench")
psql=$(command -v psql || echo "$pg_bin/psql")

work=$(mktemp -d -t idem-pgbench.XXXXXX)
trap 'rm -rf "$work"' EXIT

"$psql" -q -v ON_ERROR_STOP=1 "$url" <<'SQL'
CREATE SCHEMA IF NOT EXISTS idem_pgbench;
DROP TABLE IF EXISTS idem_pgbench.idempotency_keys;
CREATE TABLE idem_pgbench.idempotency_keys (
  tenant_id        text COLLATE "C" NOT NULL,
  key              text COLLATE "C" NOT NULL,
  state            text NOT NULL CHECK (state IN ('in_progress', 'completed', 'failed_retryable')),
  request_hash     text NOT NULL,
  fencing_token    bigint NOT NULL,
  lease_expires_ms bigint NOT NULL,
  response_status  integer CHECK (response_status BETWEEN 100 AND 999),
  response_headers bytea,
  response_body    bytea,
  created_ms       bigint NOT NULL,
  completed_ms     bigint,
  expires_ms       bigint NOT NULL,
  PRIMARY KEY (tenant_id, key)
);
CREATE INDEX ON idem_pgbench.idempotency_keys (expires_ms);
SQL

# The same payload as the store benchmark: a 64-character hash, two headers, a small JSON body.
insert="INSERT INTO idem_pgbench.idempotency_keys (tenant_id, key, state, request_hash, fencing_token, lease_expires_ms, created_ms, expires_ms) VALUES ('bench', 'bench-' || :client_id || '-' || :r, 'in_progress', repeat('a', 64), :r, 1767225660000, 1767225600000, 1767312000000) ON CONFLICT (tenant_id, key) DO NOTHING;"
update="UPDATE idem_pgbench.idempotency_keys SET state = 'completed', response_status = 201, response_headers = decode(repeat('ab', 48), 'hex'), response_body = convert_to('{\"id\":\"pay_123\",\"amount\":1000,\"currency\":\"eur\",\"status\":\"succeeded\"}', 'UTF8'), completed_ms = 1767225600000, expires_ms = 1767312000000 WHERE tenant_id = 'bench' AND key = 'bench-' || :client_id || '-' || :r AND fencing_token = :r AND state = 'in_progress';"
printf '\\set r random(1, 9000000000000000000)\nBEGIN;\n%s\n%s\nEND;\n' "$insert" "$update" >"$work/1tx.sql"
printf '\\set r random(1, 9000000000000000000)\n%s\n%s\n' "$insert" "$update" >"$work/2tx.sql"

pgbench_tps() {  # pgbench_tps SCRIPT CLIENTS
  local threads=$(( $2 < 2 ? $2 : 2 ))
  "$pgbench" -n -M prepared -c "$2" -j "$threads" -T "$seconds" -f "$1" "$url" 2>/dev/null |
    sed -n 's/^tps = \([0-9.]*\) (without initial connection time)/\1/p'
}

declare -A store_ops=()
if [ -n "$bench" ]; then
  filter="BM_ClaimComplete/pool:4/batch:128/"
  "$bench" --benchmark_filter="$filter" --benchmark_min_time="$seconds" --benchmark_format=json \
    --benchmark_out="$work/store.json" --benchmark_out_format=json >/dev/null 2>&1 || true
  while read -r threads ops; do store_ops[$threads]=$ops; done < <(python3 - "$work/store.json" <<'PY'
import json, sys
for b in json.load(open(sys.argv[1])).get("benchmarks", []):
    if "error_occurred" in b: continue
    print(b["threads"], round(b.get("items_per_second", 0)))
PY
)
fi

printf '%-8s %14s %14s %16s %10s %10s\n' clients "pgbench 1tx/s" "pgbench 2tx/s" "store claim+complete/s" "vs 1tx" "vs 2tx"
for c in $clients; do
  one=$(pgbench_tps "$work/1tx.sql" "$c")
  two=$(pgbench_tps "$work/2tx.sql" "$c")
  s=${store_ops[$c]:-}
  if [ -n "$s" ]; then
    r1=$(python3 -c "print(f'{$s/$one:.2f}x')"); r2=$(python3 -c "print(f'{$s/$two:.2f}x')")
  else
    s="-"; r1="-"; r2="-"
  fi
  printf '%-8s %14.0f %14.0f %16s %10s %10s\n' "$c" "$one" "$two" "$s" "$r1" "$r2"
done
"$psql" -q "$url" -c 'DROP SCHEMA idem_pgbench CASCADE' >/dev/null 2>&1 || true
