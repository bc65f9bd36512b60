#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer (GCC 12, Debug) in build/asan: the unit tests of
# core, the stores, the brokers (Kafka against its mock cluster), the HTTP layer, the gateway and the sidecars against the servers
# of ENV_FILE (scripts/lib/servers.sh), then the gateway's and idem-consume's end-to-end tests
# that parse hostile or broken input against the sanitized binaries.
#   asan.sh build            configure and build (quiet_build: a warning fails it)
#   asan.sh test ENV_FILE    run the tests against the servers ENV_FILE names
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${IDEM_ASAN_BUILD:-$root/build/asan}
jobs=${IDEM_TEST_JOBS:-2}
export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
# shellcheck source=scripts/lib/build.sh
source "$root/scripts/lib/build.sh"

case "${1:-}" in
  build)
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DIDEM_SANITIZE=ON \
      -DIDEM_BUILD_GATEWAY=ON -DIDEM_BUILD_BENCHMARKS=OFF -DIDEM_BUILD_EXAMPLES=OFF >/dev/null
    quiet_build "$root/build/logs/asan.log" "ASan + UBSan tree (build/asan)" -- \
      cmake --build "$build" -j"$jobs"
    ;;
  test)
    env_file=${2:?usage: asan.sh test ENV_FILE}
    # shellcheck disable=SC1090
    source "$env_file"
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
    status=0
    echo "asan: core, stores, brokers, HTTP layer, gateway and sidecar units"
    ctest --test-dir "$build" --output-on-failure --no-tests=error -j"$jobs" --timeout 900 \
      -L 'core|cli|sqlite|postgres|redis|amqp|kafka|sqs|client|http|gateway|admin|sidecar|consume|relay' -LE 'e2e|bench' \
      || status=1
    # The gateway parses whatever clients and upstreams send: its end-to-end rules, hostile input,
    # shutdown, concurrency, expiry, JWT-tenant, write-failure, lookup (ask), reload and envelope
    # tests run against the sanitized binary too (the ask test found a use-after-free there).
    # So do idem-consume's, which parses whatever the brokers deliver: bad messages, SIGTERM, admin.
    # (The multi-gateway outage and crash runs stay with the release build: they take minutes.)
    # HTTP/2 and gRPC too: nghttp2's callbacks write into streams whose lifetimes the tests stress.
    echo "asan: the gateway and idem-consume end to end"
    ctest --test-dir "$build" --output-on-failure --no-tests=error -j"$jobs" --timeout 900 \
      -R '^gateway_e2e_(rules|expiry|concurrency|lifecycle|hostile|jwt|sqlite_write_failures|ask|reload|envelopes|advertise|tls)_|^gateway_e2e_h2_memory$|^grpc_e2e_memory$|^consume_e2e_.*_(bad|lifecycle)$' \
      || status=1
    exit $status
    ;;
  *) echo "usage: asan.sh build | asan.sh test ENV_FILE" >&2; exit 2 ;;
esac
