#!/usr/bin/env bash
# The raw ceiling of the Redis store: redis-benchmark sending what the store sends for a fresh key,
# with 1, 8 and 64 connections (the concurrency of idem_redis_bench's 1, 8 and 64 callers), on a
# standalone server and a cluster: the claim `SET key <record> NX GET PX ttl`, and the completion,
# the store's own Lua script (stores/redis/lua/record.lua followed by complete.lua) by EVALSHA.
#
#   stores/redis/bench/redis_benchmark.sh [REQUESTS]      (default 100000 per run)
#
# Servers from IDEM_TEST_REDIS_URL and IDEM_TEST_REDIS_CLUSTER_URL (source the env file that
# scripts/lib/servers.sh writes). For each target and concurrency it prints claim/s, complete/s
# and the pair rate they allow, 1 / (1/claim + 1/complete), to set beside idem_redis_bench's
# claim_complete items/s.
#
# The claims hit random keys out of 10^12 (fresh records: the full write path, like the store
# bench). The completes hit the same key space as a claim run of their own with the same token,
# so about 63% of them complete a record and the rest find nothing to fence (cheaper): the
# complete rate, and so the pair rate, is an upper bound.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
lua=$here/../lua
requests=${1:-100000}
now=1767225600000  # the caller's clock is an argument, as in the store

url_host_port() {  # redis://H:P[/db] or redis+cluster://H:P,... -> "H P" of the first node
  local rest=${1#*://}
  rest=${rest##*@}
  rest=${rest%%/*}
  rest=${rest%%,*}
  echo "${rest%:*} ${rest##*:}"
}

masters() {  # host port cluster? -> "host:port" of every master
  local host=$1 port=$2 cluster=$3
  if [ "$cluster" = yes ]; then
    redis-cli -h "$host" -p "$port" cluster nodes | awk '$3 ~ /master/ && $3 !~ /fail/ {split($2, a, "@"); print a[1]}'
  else
    echo "$host:$port"
  fi
}

rate() {  # redis-benchmark -q output (progress lines end in \r) -> requests per second
  tr '\r' '\n' | sed -n 's/.*: \([0-9.]*\) requests per second.*/\1/p' | tail -n 1
}

run() {  # name url cluster?
  local name=$1 url=$2 cluster=$3 host port complete_sha node extra=()
  read -r host port < <(url_host_port "$url")
  [ "$cluster" = yes ] && extra=(--cluster)
  for node in $(masters "$host" "$port" "$cluster"); do
    complete_sha=$(redis-cli -h "${node%:*}" -p "${node##*:}" script load "$(cat "$lua/record.lua" "$lua/complete.lua")")
  done
  # An in-progress record as the store writes it (record_codec.hpp): attempt 1, token 42, a 64-byte
  # hash, no lookup.
  local record hash
  hash=$(printf 'h%.0s' {1..64})
  record="I1|42|$((now + 60000))|$now|$((now + 60000))|||64|0|0|$hash"
  for clients in 1 8 64; do
    local claim_rate complete_rate pair keyspace=$requests
    claim_rate=$(redis-benchmark -h "$host" -p "$port" "${extra[@]}" -c "$clients" -n "$requests" -r 1000000000000 -q \
      set "idem-raw:{tag}:c:__rand_int__" "$record" nx get px 60000 | rate)
    # Records to complete: in progress with token 42, in the key space the completes will hit.
    redis-benchmark -h "$host" -p "$port" "${extra[@]}" -c 64 -n "$requests" -r "$keyspace" -q \
      set "idem-raw:{tag}:d:__rand_int__" "$record" px 60000 >/dev/null
    # complete.lua ARGV: token, now, expires, ttl_ms, status, headers, body
    complete_rate=$(redis-benchmark -h "$host" -p "$port" "${extra[@]}" -c "$clients" -n "$requests" -r "$keyspace" -q \
      evalsha "$complete_sha" 1 "idem-raw:{tag}:d:__rand_int__" 42 "$now" $((now + 60000)) 60000 201 \
      "$(printf '\x01\x01\x0cContent-Type\x10application/json')" '{"id":"pay_1","amount":100}' | rate)
    pair=$(awk -v a="$claim_rate" -v b="$complete_rate" 'BEGIN { if (a > 0 && b > 0) printf "%.0f", 1 / (1 / a + 1 / b); else print 0 }')
    printf '%-10s clients=%-3s claim/s=%-10s complete/s=%-10s claim+complete/s=%s\n' \
      "$name" "$clients" "$claim_rate" "$complete_rate" "$pair"
  done
}

: "${IDEM_TEST_REDIS_URL:?source the env file of scripts/lib/servers.sh}"
: "${IDEM_TEST_REDIS_CLUSTER_URL:?source the env file of scripts/lib/servers.sh}"
run standalone "$IDEM_TEST_REDIS_URL" no
run cluster "$IDEM_TEST_REDIS_CLUSTER_URL" yes
