#!/usr/bin/env bash
# Starts and stops the servers the store tests need, on loopback, on free ports, under one
# directory: PostgreSQL 15, Redis standalone (AOF everysec) and a Redis Cluster of 3 masters with
# one replica each (so a master can fail over).
#
#   servers.sh start DIR [postgres] [redis] [cluster]
#                          start them (all three when none is named); writes DIR/env with the
#                          URLs to `source`
#   servers.sh stop DIR    stop everything started under DIR (by PID)
#
# DIR/env exports IDEM_TEST_SERVERS_DIR and, for what was started, IDEM_TEST_POSTGRES_URL,
# IDEM_TEST_REDIS_URL, IDEM_TEST_REDIS_CLUSTER_URL and IDEM_TEST_REDIS_CLUSTER_NODES (host:port
# of every node).
set -euo pipefail

usage="usage: servers.sh start DIR [postgres] [redis] [cluster] | servers.sh stop DIR"
cmd=${1:?$usage}
dir=${2:?$usage}
shift 2
pg_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)

# A free loopback port below 55536: a cluster node also listens on its port + 10000 (bus port).
free_port() {
  python3 -c '
import socket
while True:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
    if port <= 55535:
        b = socket.socket()
        try:
            b.bind(("127.0.0.1", port + 10000)); print(port); break
        except OSError:
            pass
        finally:
            b.close()'
}

# initdb and postgres refuse to run as root; run them as the postgres system user then.
as_pg() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

wait_for() {  # wait_for SECONDS DESCRIPTION COMMAND...
  local deadline=$((SECONDS + $1)) what=$2
  shift 2
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then
      echo "servers.sh: $what did not come up" >&2
      return 1
    fi
    sleep 0.2
  done
}

start_postgres() {
  local port data=$dir/pg
  port=$(free_port)
  mkdir -p "$data"
  [ "$(id -u)" -eq 0 ] && chown postgres: "$data" && chmod 755 "$dir"
  as_pg "$pg_bin/initdb" -D "$data" -A trust -U idem --no-sync -E UTF8 >"$dir/pg-initdb.log" 2>&1
  as_pg "$pg_bin/pg_ctl" -D "$data" -l "$data/server.log" -w -t 60 \
    -o "-p $port -k $data -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null
  as_pg "$pg_bin/createdb" -h 127.0.0.1 -p "$port" -U idem idem_test
  echo "export IDEM_TEST_POSTGRES_URL=postgres://idem@127.0.0.1:$port/idem_test" >>"$dir/env"
  echo "export IDEM_TEST_POSTGRES_DATA=$data IDEM_TEST_POSTGRES_BIN=$pg_bin" >>"$dir/env"
}

start_redis() {  # start_redis NAME PORT EXTRA_ARGS...
  local name=$1 port=$2
  shift 2
  mkdir -p "$dir/$name"
  redis-server --port "$port" --bind 127.0.0.1 --daemonize yes --dir "$dir/$name" \
    --pidfile "$dir/$name/redis.pid" --logfile "$dir/$name/redis.log" \
    --appendonly yes --appendfsync everysec --save "" "$@"
  wait_for 20 "redis $name" redis-cli -p "$port" ping
}

start_redis_standalone() {
  local port
  port=$(free_port)
  start_redis redis "$port"
  echo "export IDEM_TEST_REDIS_URL=redis://127.0.0.1:$port" >>"$dir/env"
}

start_redis_cluster() {
  local nodes=() port i
  for i in 1 2 3 4 5 6; do
    port=$(free_port)
    start_redis "cluster-$i" "$port" --cluster-enabled yes --cluster-config-file nodes.conf \
      --cluster-node-timeout 2000
    nodes+=("127.0.0.1:$port")
  done
  redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$dir/cluster-create.log" 2>&1
  for node in "${nodes[@]}"; do
    wait_for 30 "cluster node $node" bash -c "redis-cli -h ${node%:*} -p ${node#*:} cluster info | grep -q cluster_state:ok"
  done
  local list
  list=$(IFS=,; echo "${nodes[*]}")
  echo "export IDEM_TEST_REDIS_CLUSTER_URL=redis+cluster://$list" >>"$dir/env"
  echo "export IDEM_TEST_REDIS_CLUSTER_NODES=$list" >>"$dir/env"
}

stop_all() {
  if [ -f "$dir/pg/postmaster.pid" ]; then
    as_pg "$pg_bin/pg_ctl" -D "$dir/pg" -m immediate -w -t 30 stop >/dev/null 2>&1 || true
  fi
  local pidfile pid
  # Redis deletes its pid file as it exits, so read each one once, tolerating its absence.
  local pids=()
  for pidfile in "$dir"/*/redis.pid; do
    pid=$(cat "$pidfile" 2>/dev/null) || continue
    pids+=("$pid")
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  return 0
}

case $cmd in
  start)
    want_postgres=0 want_redis=0 want_cluster=0
    (($#)) || set -- postgres redis cluster
    for what in "$@"; do
      case $what in
        postgres) want_postgres=1 ;;
        redis) want_redis=1 ;;
        cluster) want_cluster=1 ;;
        *) echo "servers.sh: unknown server \"$what\"; $usage" >&2; exit 2 ;;
      esac
    done
    mkdir -p "$dir"
    : >"$dir/env"
    echo "export IDEM_TEST_SERVERS_DIR=$dir" >>"$dir/env"
    set -E  # the ERR trap also fires inside the start functions
    trap 'stop_all' ERR
    if ((want_postgres)); then start_postgres; fi
    if ((want_redis)); then start_redis_standalone; fi
    if ((want_cluster)); then start_redis_cluster; fi
    ;;
  stop)
    (($# == 0)) || { echo "$usage" >&2; exit 2; }
    stop_all
    ;;
  *)
    echo "$usage" >&2
    exit 2
    ;;
esac
