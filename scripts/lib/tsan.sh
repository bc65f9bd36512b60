#!/usr/bin/env bash
# ThreadSanitizer (GCC 12, -fsanitize=thread) in build/tsan: the unit tests of core (engine,
# memory store, Consumer, ConsumeLoop), the stores (SQLite, PostgreSQL, Redis and Redis Cluster,
# against the servers whose env file scripts/test sourced), each store's conformance suites, the
# HTTP layer and the gateway, then the gateway's concurrency end-to-end test against a TSan
# idem-gateway. Any report fails the step: TSan writes them to files, read at the end.
# Suppressions: scripts/lib/tsan.supp, each with its reason.
#   tsan.sh [build|test]   only build, or only run the tests (built before); both when not given
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${IDEM_TSAN_BUILD:-$root/build/tsan}
jobs=${IDEM_TEST_JOBS:-2}
phase=${1:-all}
case "$phase" in build|test|all) ;; *) echo "usage: tsan.sh [build|test]" >&2; exit 2 ;; esac
export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
# shellcheck source=scripts/lib/build.sh
source "$root/scripts/lib/build.sh"

if [ "$phase" != test ]; then
  # jemalloc off: TSan must see every allocation through its own allocator. -O2 with line tables
  # (-g1): reports name file and line, at two thirds of the compile time of full debug info.
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DIDEM_TSAN=ON \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" \
    -DIDEM_BUILD_GATEWAY=ON -DIDEM_BUILD_BENCHMARKS=OFF -DIDEM_BUILD_EXAMPLES=OFF \
    -DIDEM_GATEWAY_JEMALLOC=OFF >/dev/null
  quiet_build "$root/build/logs/tsan.log" "ThreadSanitizer tree (build/tsan)" -- \
    cmake --build "$build" -j"$jobs" --target idem_core_test idem_stores_test idem_sqlite_test \
    idem_postgres_test idem_redis_test idem_redis_unit_test idem_http_test idem_gateway_test \
    idem_gateway_stream_test idem-gateway idem_fixture_upstream idemctl
fi
[ "$phase" = build ] && exit 0

reports=$(mktemp -d -t idem-tsan.XXXXXX)
trap 'rm -rf "$reports"' EXIT
# halt_on_error: the test that raced fails; log_path: the report is also kept (a gateway's
# stderr is the e2e harness's, which may not show it).
export TSAN_OPTIONS="halt_on_error=1 exitcode=66 second_deadlock_stack=1 history_size=4 \
suppressions=$root/scripts/lib/tsan.supp log_path=$reports/tsan"

status=0
echo "tsan: unit tests and conformance suites (core, sqlite, postgres, redis, http, gateway)"
# Left out: the crash test (SIGKILLs children at random: no thread to check), Redis faults
# (RUN_SERIAL restarts of the shared servers; the ASan and release runs cover them).
ctest --test-dir "$build" --output-on-failure --no-tests=error -j"$jobs" --timeout 900 \
  -L 'core|sqlite|postgres|redis|http|gateway' -LE 'e2e|bench|crash|redis_fault|cli' || status=1

echo "tsan: the gateway's concurrency end to end (memory and SQLite, one and two processes), TLS (reloads swapping certificates under load), and HTTP/2"
ctest --test-dir "$build" --output-on-failure --no-tests=error --timeout 900 \
  -R '^gateway_e2e_concurrency_(memory|sqlite)$|^gateway_e2e_(tls|h2)_memory$' || status=1

if compgen -G "$reports/tsan*" >/dev/null; then
  echo "tsan: ThreadSanitizer reports:" >&2
  cat "$reports"/tsan* >&2
  status=1
fi
exit $status
