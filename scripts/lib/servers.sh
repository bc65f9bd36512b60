#!/usr/bin/env bash
# Starts and stops the servers the store and broker tests need, on loopback, on free ports, under
# one directory: PostgreSQL 15, Redis standalone (AOF everysec), a Redis Cluster of 3 masters with
# one replica each (so a master can fail over) and a RabbitMQ node.
#
#   servers.sh start DIR [postgres] [redis] [cluster] [rabbitmq]
#                          start them (all four when none is named); writes DIR/env with the
#                          URLs to `source`
#   servers.sh stop DIR    stop everything started under DIR (by PID), RabbitMQ's epmd included
#   servers.sh stop-rabbitmq DIR / start-rabbitmq DIR
#                          stop the RabbitMQ node (gracefully, as a broker restart does) and start
#                          it again on the same ports with the same data: for restart tests
#   servers.sh rabbitmqctl DIR ARGS...
#                          run rabbitmqctl against that node (close_all_connections, list_queues...)
#
# DIR/env exports IDEM_TEST_SERVERS_DIR and, for what was started, IDEM_TEST_POSTGRES_URL,
# IDEM_TEST_REDIS_URL, IDEM_TEST_REDIS_CLUSTER_URL, IDEM_TEST_REDIS_CLUSTER_NODES (host:port
# of every node), IDEM_TEST_AMQP_URL (user idem, whose password needs percent-encoding),
# IDEM_TEST_AMQP_PASSWORD (that password, raw: tests check it appears in no output),
# IDEM_TEST_AMQP_MAX_MESSAGE_SIZE (the node's max_message_size), IDEM_TEST_RABBITMQ_DIR and
# IDEM_TEST_SERVERS_SH (this script, for the restart subcommands); with RabbitMQ also
# IDEM_TEST_AMQPS_URL (the same node's TLS listener, amqps://, same user; its certificate names
# 127.0.0.1 and localhost, issued by the test CA), IDEM_TEST_TLS_CA (that CA, PEM) and
# IDEM_TEST_TLS_DIR (DIR/pki: tests/common/tls_certs.py's certificates and keys, made at start).
# PostgreSQL accepts TLS with the same CA's server certificate: IDEM_TEST_POSTGRES_URL pins
# sslmode=disable (plain, as before TLS); IDEM_TEST_POSTGRES_TLS_URL is the same server and user
# at host localhost with sslmode=verify-full against the test CA; IDEM_TEST_POSTGRES_CLIENT_CERT_URL
# logs in as payments-a by client certificate alone (client-a.pem), to database idem_client_cert.
# With PostgreSQL also IDEM_TEST_TLS_CA and IDEM_TEST_TLS_DIR.
set -euo pipefail

usage="usage: servers.sh start DIR [postgres] [redis] [cluster] [rabbitmq] | servers.sh stop DIR
       servers.sh stop-rabbitmq DIR | servers.sh start-rabbitmq DIR | servers.sh rabbitmqctl DIR ARGS..."
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

# RabbitMQ's scripts drop root to the rabbitmq user (and fail on a root-owned state dir); run
# them as that user ourselves, so every file under DIR/rabbitmq is its own.
as_rabbitmq() {
  if [ "$(id -u)" -eq 0 ]; then runuser -u rabbitmq -- "$@"; else "$@"; fi
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

# The test CA and certificates (tests/common/tls_certs.py), made once under DIR/pki and shared by
# every server started under DIR that speaks TLS.
make_pki() {
  local pki=$dir/pki
  [ -f "$pki/ca.pem" ] || python3 "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/tests/common/tls_certs.py" "$pki" >/dev/null
}

# PostgreSQL accepts TLS too (ssl = on, the test CA's server certificate, which names localhost and
# 127.0.0.1): libpq's sslmode=verify-full works against it. IDEM_TEST_POSTGRES_URL pins
# sslmode=disable, since libpq's default (prefer) would move every existing test to TLS.
# Client certificates: the role payments-a (client-a.pem's CN) logs in by its certificate alone,
# over TLS only (pg_hba: hostssl ... cert, then reject), to its own database idem_client_cert.
start_postgres() {
  local port data=$dir/pg pki=$dir/pki
  port=$(free_port)
  mkdir -p "$data"
  [ "$(id -u)" -eq 0 ] && chown postgres: "$data" && chmod 755 "$dir"
  as_pg "$pg_bin/initdb" -D "$data" -A trust -U idem --no-sync -E UTF8 >"$dir/pg-initdb.log" 2>&1
  make_pki
  # The server's own copies in its data directory: PostgreSQL refuses a key file that is not its
  # user's or is readable by others.
  cp "$pki/server.pem" "$data/tls-server.pem"
  cp "$pki/server.key" "$data/tls-server.key"
  cp "$pki/ca.pem" "$data/tls-ca.pem"
  [ "$(id -u)" -eq 0 ] && chown postgres: "$data/tls-server.pem" "$data/tls-server.key" "$data/tls-ca.pem"
  chmod 600 "$data/tls-server.key"
  cat >>"$data/postgresql.conf" <<EOC

# scripts/lib/servers.sh: TLS with the test CA's certificates (DIR/pki)
ssl = on
ssl_cert_file = '$data/tls-server.pem'
ssl_key_file = '$data/tls-server.key'
ssl_ca_file = '$data/tls-ca.pem'
EOC
  local hba
  hba=$(cat "$data/pg_hba.conf")
  {
    echo "# scripts/lib/servers.sh: payments-a by its client certificate, over TLS only"
    echo "hostssl all payments-a 127.0.0.1/32 cert"
    echo "host    all payments-a 127.0.0.1/32 reject"
    echo "local   all payments-a              reject"
    echo "$hba"
  } >"$data/pg_hba.conf"
  as_pg "$pg_bin/pg_ctl" -D "$data" -l "$data/server.log" -w -t 60 \
    -o "-p $port -k $data -c listen_addresses=127.0.0.1 -c max_connections=200" start >/dev/null
  as_pg "$pg_bin/createdb" -h 127.0.0.1 -p "$port" -U idem idem_test
  as_pg "$pg_bin/psql" -h 127.0.0.1 -p "$port" -U idem -d idem_test -q -v ON_ERROR_STOP=1 \
    -c 'CREATE ROLE "payments-a" LOGIN' -c 'CREATE DATABASE idem_client_cert OWNER "payments-a"'
  local tls="sslmode=verify-full&sslrootcert=$pki/ca.pem"
  {
    echo "export IDEM_TEST_POSTGRES_URL='postgres://idem@127.0.0.1:$port/idem_test?sslmode=disable'"
    echo "export IDEM_TEST_POSTGRES_TLS_URL='postgres://idem@localhost:$port/idem_test?$tls'"
    echo "export IDEM_TEST_POSTGRES_CLIENT_CERT_URL='postgres://payments-a@localhost:$port/idem_client_cert?$tls&sslcert=$pki/client-a.pem&sslkey=$pki/client-a.key'"
    echo "export IDEM_TEST_POSTGRES_DATA=$data IDEM_TEST_POSTGRES_BIN=$pg_bin"
    echo "export IDEM_TEST_TLS_CA=$pki/ca.pem IDEM_TEST_TLS_DIR=$pki"
  } >>"$dir/env"
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

# RabbitMQ: one node under DIR/rabbitmq, everything it writes in there: its HOME (the Erlang
# cookie), mnesia, logs, config, pid file. Its own epmd on a free port, so it neither meets nor
# disturbs another node on the machine. max_message_size is small (1 MiB) so tests can publish
# past it cheaply.
rabbitmq_dir() { echo "$dir/rabbitmq"; }
amqp_password='S3cr3t-p@ss:w/rd'
amqp_password_encoded='S3cr3t-p%40ss%3Aw%2Frd'
rabbitmq_max_message_size=1048576

rabbitmqctl_in() {  # rabbitmqctl_in ARGS...: rabbitmqctl with the node's environment
  local rdir
  rdir=$(rabbitmq_dir)
  as_rabbitmq bash -c 'source "$0/env.sh" && exec /usr/lib/rabbitmq/bin/rabbitmqctl "$@"' "$rdir" "$@"
}

start_rabbitmq_node() {  # the node described by DIR/rabbitmq/env.sh; waits until it serves
  local rdir
  rdir=$(rabbitmq_dir)
  [ -f "$rdir/env.sh" ] || { echo "servers.sh: no RabbitMQ node under $dir" >&2; return 1; }
  rm -f "$rdir/pid"
  # Detached from our stdin, stdout and stderr: a test (or ctest) reading them until EOF must
  # not wait for the node to exit.
  as_rabbitmq bash -c 'source "$0/env.sh" || exit 1; nohup /usr/lib/rabbitmq/bin/rabbitmq-server >>"$0/server.log" 2>&1 </dev/null &' \
    "$rdir" </dev/null >/dev/null 2>&1
  # `wait PIDFILE` returns once the node is up and its applications are running.
  if ! rabbitmqctl_in wait --timeout 90 "$rdir/pid" >"$dir/rabbitmq-wait.log" 2>&1; then
    echo "servers.sh: RabbitMQ did not come up; see $rdir/server.log and $rdir/log" >&2
    return 1
  fi
}

start_rabbitmq() {
  local rdir port tls_port dist epmd pki
  rdir=$(rabbitmq_dir)
  port=$(free_port)
  tls_port=$(free_port)
  dist=$(free_port)
  epmd=$(free_port)
  mkdir -p "$rdir/mnesia" "$rdir/log" "$rdir/tls"
  # A TLS listener too (amqps://), with a test CA made now: clients verify the node against
  # ca.pem; a client certificate is checked when one is presented (verify_peer), not required.
  pki=$dir/pki
  [ -f "$pki/ca.pem" ] || python3 "$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/tests/common/tls_certs.py" "$pki" >/dev/null
  cp "$pki/ca.pem" "$pki/server.pem" "$pki/server.key" "$rdir/tls/"  # the node's own copies, its user's
  cat >"$rdir/rabbitmq.conf" <<EOC
listeners.tcp.default = 127.0.0.1:$port
listeners.ssl.default = 127.0.0.1:$tls_port
ssl_options.cacertfile = $rdir/tls/ca.pem
ssl_options.certfile = $rdir/tls/server.pem
ssl_options.keyfile = $rdir/tls/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = false
ssl_options.versions.1 = tlsv1.3
ssl_options.versions.2 = tlsv1.2
loopback_users = none
max_message_size = $rabbitmq_max_message_size
EOC
  echo '[].' >"$rdir/enabled_plugins"
  cat >"$rdir/env.sh" <<EOC
export HOME=$rdir
export RABBITMQ_NODENAME=idem$port@localhost RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
export RABBITMQ_NODE_PORT=$port RABBITMQ_DIST_PORT=$dist ERL_EPMD_PORT=$epmd
export RABBITMQ_MNESIA_BASE=$rdir/mnesia RABBITMQ_LOG_BASE=$rdir/log
export RABBITMQ_CONFIG_FILE=$rdir/rabbitmq.conf RABBITMQ_ENABLED_PLUGINS_FILE=$rdir/enabled_plugins
export RABBITMQ_FEATURE_FLAGS_FILE=$rdir/feature_flags RABBITMQ_PID_FILE=$rdir/pid
EOC
  echo "$epmd" >"$rdir/epmd.port"
  if [ "$(id -u)" -eq 0 ]; then
    chown -R rabbitmq: "$rdir"
    chmod 755 "$dir"
  fi
  start_rabbitmq_node
  rabbitmqctl_in add_user idem "$amqp_password" >/dev/null
  rabbitmqctl_in set_user_tags idem administrator >/dev/null
  rabbitmqctl_in set_permissions -p / idem '.*' '.*' '.*' >/dev/null
  {
    echo "export IDEM_TEST_AMQP_URL='amqp://idem:$amqp_password_encoded@127.0.0.1:$port/%2f'"
    echo "export IDEM_TEST_AMQPS_URL='amqps://idem:$amqp_password_encoded@127.0.0.1:$tls_port/%2f'"
    echo "export IDEM_TEST_TLS_CA=$pki/ca.pem IDEM_TEST_TLS_DIR=$pki"
    echo "export IDEM_TEST_AMQP_PASSWORD='$amqp_password'"
    echo "export IDEM_TEST_AMQP_MAX_MESSAGE_SIZE=$rabbitmq_max_message_size"
    echo "export IDEM_TEST_RABBITMQ_DIR=$rdir"
    echo "export IDEM_TEST_SERVERS_SH=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
  } >>"$dir/env"
}

# Stops the node by its PID: SIGTERM is a graceful shutdown (connections are closed with
# CONNECTION_FORCED, as in a broker restart); SIGKILL after 60 s. The epmd stays unless asked.
stop_rabbitmq() {  # stop_rabbitmq [epmd]
  local rdir pid port
  rdir=$(rabbitmq_dir)
  pid=$(cat "$rdir/pid" 2>/dev/null) || pid=
  if [ -n "$pid" ]; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$rdir/pid"
  fi
  if [ "${1:-}" = epmd ] && [ -f "$rdir/epmd.port" ]; then
    port=$(cat "$rdir/epmd.port")
    # `epmd -kill` asks the daemon on that port to exit. Should it refuse, the node started it
    # with ERL_EPMD_PORT=PORT in its environment: that names our epmd and no other.
    as_rabbitmq env ERL_EPMD_PORT="$port" epmd -kill >/dev/null 2>&1 || true
    local proc
    for proc in /proc/[0-9]*; do
      [ "$(cat "$proc/comm" 2>/dev/null)" = epmd ] || continue
      if tr '\0' '\n' 2>/dev/null <"$proc/environ" | grep -qx "ERL_EPMD_PORT=$port"; then
        kill "${proc#/proc/}" 2>/dev/null || true
      fi
    done
  fi
  return 0
}

stop_all() {
  if [ -d "$(rabbitmq_dir)" ]; then stop_rabbitmq epmd; fi
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
    want_postgres=0 want_redis=0 want_cluster=0 want_rabbitmq=0
    (($#)) || set -- postgres redis cluster rabbitmq
    for what in "$@"; do
      case $what in
        postgres) want_postgres=1 ;;
        redis) want_redis=1 ;;
        cluster) want_cluster=1 ;;
        rabbitmq) want_rabbitmq=1 ;;
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
    if ((want_rabbitmq)); then start_rabbitmq; fi
    ;;
  stop)
    (($# == 0)) || { echo "$usage" >&2; exit 2; }
    stop_all
    ;;
  stop-rabbitmq)
    (($# == 0)) || { echo "$usage" >&2; exit 2; }
    stop_rabbitmq
    ;;
  start-rabbitmq)
    (($# == 0)) || { echo "$usage" >&2; exit 2; }
    start_rabbitmq_node
    ;;
  rabbitmqctl)
    rabbitmqctl_in "$@"
    ;;
  *)
    echo "$usage" >&2
    exit 2
    ;;
esac
