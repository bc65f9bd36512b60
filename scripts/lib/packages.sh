#!/usr/bin/env bash
# The Debian packages end to end (issue 21 §6, docs/operations.md "Installing from packages"):
# builds them with CPack from a build directory, installs them with dpkg, starts the installed
# gateway the way its systemd unit does (ExecStart, as the unit's user: there is no systemd in CI)
# from the installed configuration, sends one keyed request and its retry (one execution, one
# replay), builds a project with find_package(idem COMPONENTS ...) for each component from the
# installed files (core + sqlite with every other library's package hidden), then purges the
# packages. Needs root (dpkg).
#   scripts/lib/packages.sh [BUILD_DIR]   (default build/release)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(cd "${1:-$root/build/release}" && pwd)
work=$(mktemp -d -t idem-packages.XXXXXX)
chmod 755 "$work"
packages=(idem-gateway idemctl idem-consume idem-relay libidem-dev)
pids=()

cleanup() {
  local rc=$?
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  dpkg --purge "${packages[@]}" >/dev/null 2>&1 || true
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT INT TERM

fail() { echo "packages: $*" >&2; exit 1; }
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

if [ "$(id -u)" -ne 0 ]; then fail "needs root (dpkg -i)"; fi
for p in "${packages[@]}"; do
  if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    fail "$p is already installed on this machine: remove it first (this test installs and purges it)"
  fi
done

echo "packages: cpack -G DEB"
(cd "$build" && cpack -G DEB -B "$work/debs" >"$work/cpack.log" 2>&1) || { cat "$work/cpack.log" >&2; fail "cpack failed"; }
debs=("$work"/debs/*.deb)
[ "${#debs[@]}" -eq 5 ] || fail "expected 5 packages, got: ${debs[*]}"
for d in "${debs[@]}"; do
  echo "packages: $(dpkg-deb -f "$d" Package) $(dpkg-deb -f "$d" Version): $(dpkg-deb -f "$d" Depends | cut -c1-150)"
done

echo "packages: dpkg -i"
dpkg -i "${debs[@]}" >"$work/dpkg.log" 2>&1 || { cat "$work/dpkg.log" >&2; fail "dpkg -i failed"; }
for bin in idem-gateway idemctl idem-consume idem-relay; do
  [ -x "/usr/bin/$bin" ] || fail "/usr/bin/$bin is missing"
done
[ -f /etc/idem/gateway.toml ] || fail "/etc/idem/gateway.toml was not installed"
getent passwd idem >/dev/null || fail "the idem system user was not created"
[ "$(stat -c %U /var/lib/idem)" = idem ] || fail "/var/lib/idem does not belong to idem"
unit=/lib/systemd/system/idem-gateway.service
[ -f "$unit" ] || fail "$unit is missing"
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
user=$(sed -n 's/^User=//p' "$unit")
[ -n "$exec_start" ] && [ "$user" = idem ] || fail "the unit has no ExecStart or User=idem"

# An upstream that counts executions per key and answers 201.
upstream_port=$(free_port)
python3 - "$upstream_port" >"$work/upstream.log" 2>&1 <<'EOF' &
import http.server, json, sys
counts = {}
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        key = self.headers.get("Idempotency-Key", "")
        counts[key] = counts.get(key, 0) + 1
        body = json.dumps({"key": key, "execution": counts[key]}).encode()
        self.send_response(201); self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def do_GET(self):
        body = json.dumps(counts).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
EOF
pids+=($!)

# The unit's command, as the unit's user, from the installed config; the ports are this test's.
# start_installed_gateway LOG: started, and ready, or the test fails with its log.
port=$(free_port)
admin=$(free_port)
start_installed_gateway() {
  echo "packages: runuser -u $user -- $exec_start (listen 127.0.0.1:$port)"
  # shellcheck disable=SC2086  # ExecStart is a command line
  runuser -u "$user" -- $exec_start --listen "127.0.0.1:$port" --admin-listen "127.0.0.1:$admin" \
    --upstream "http://127.0.0.1:$upstream_port" >"$1" 2>&1 &
  pids+=($!)
  for _ in $(seq 100); do
    curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null || { cat "$1" >&2; fail "the installed gateway is not ready"; }
}
start_installed_gateway "$work/gateway.log"
key="package-test-$(date +%s%N)"
first=$(curl -s -D "$work/h1" -X POST -H "Idempotency-Key: $key" -H 'Content-Type: application/json' \
  -d '{"amount": 100}' "http://127.0.0.1:$port/v1/payments")
second=$(curl -s -D "$work/h2" -X POST -H "Idempotency-Key: $key" -H 'Content-Type: application/json' \
  -d '{"amount": 100}' "http://127.0.0.1:$port/v1/payments")
grep -q '^HTTP/1.1 201' "$work/h1" || fail "first answer: $(head -1 "$work/h1")"
grep -qi '^Idempotent-Replayed: true' "$work/h2" || fail "the retry was not a replay: $(cat "$work/h2")"
[ "$first" = "$second" ] || fail "the replay differs: $first / $second"
executions=$(curl -s "http://127.0.0.1:$upstream_port/" | python3 -c "import json,sys; print(json.load(sys.stdin).get('$key', 0))")
[ "$executions" = 1 ] || fail "the upstream executed the key $executions times"
[ -f /var/lib/idem/idem.db ] || fail "the store is not in /var/lib/idem"
echo "packages: the installed gateway executed once and replayed: $second"

# TLS with the certificate layout of docs/operations.md: /etc/idem/tls is root:idem 0750, the key
# root:idem 0640, read by the unit's user; the [tls] listener added to the installed config.
kill "${pids[-1]}" 2>/dev/null || true
wait "${pids[-1]}" 2>/dev/null || true
unset 'pids[-1]'
[ "$(stat -c '%U:%G %a' /etc/idem/tls)" = "root:idem 750" ] || fail "/etc/idem/tls is $(stat -c '%U:%G %a' /etc/idem/tls), not root:idem 750"
python3 "$root/tests/common/tls_certs.py" "$work/pki" >/dev/null
install -o root -g idem -m 0644 "$work/pki/server.pem" /etc/idem/tls/gateway.pem
install -o root -g idem -m 0640 "$work/pki/server.key" /etc/idem/tls/gateway.key
tls_port=$(free_port)
printf '\n[tls]\nlisten = "127.0.0.1:%s"\ncert_file = "/etc/idem/tls/gateway.pem"\nkey_file = "/etc/idem/tls/gateway.key"\n' \
  "$tls_port" >>/etc/idem/gateway.toml
start_installed_gateway "$work/gateway-tls.log"
tls_replay=$(curl -s -D "$work/h3" --cacert "$work/pki/ca.pem" -X POST -H "Idempotency-Key: $key" \
  -H 'Content-Type: application/json' -d '{"amount": 100}' "https://localhost:$tls_port/v1/payments") \
  || { cat "$work/gateway-tls.log" >&2; fail "the installed gateway did not answer over TLS"; }
grep -qi '^Idempotent-Replayed: true' "$work/h3" || fail "the TLS retry was not a replay: $(cat "$work/h3")"
[ "$tls_replay" = "$first" ] || fail "the TLS replay differs: $tls_replay / $first"
rm -f /etc/idem/tls/gateway.pem /etc/idem/tls/gateway.key
echo "packages: the installed gateway read its certificate from /etc/idem/tls as $user and replayed over TLS"

# find_package(idem COMPONENTS c) for each component, from /usr.
mkdir -p "$work/consumer"
cat >"$work/consumer/main.cpp" <<'EOF'
#include "idem/key.hpp"
int main() { return 0; }
EOF
for component in core sqlite postgres redis stores client http amqp redis_streams kafka sqs brokers; do
  d="$work/consumer-$component"
  mkdir -p "$d"
  cat >"$d/CMakeLists.txt" <<EOF
cmake_minimum_required(VERSION 3.25)
project(consumer_$component LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 23)
find_package(idem REQUIRED COMPONENTS $component)
add_executable(consumer $work/consumer/main.cpp)
target_link_libraries(consumer PRIVATE idem::$component)
EOF
  extra=()
  if [ "$component" = core ] || [ "$component" = sqlite ]; then
    # Only OpenSSL and SQLite: the other libraries' CMake packages are hidden from find_package,
    # and no pkg-config module (hiredis, librabbitmq) may be looked for.
    extra=(-DCMAKE_DISABLE_FIND_PACKAGE_CURL=ON -DCMAKE_DISABLE_FIND_PACKAGE_PostgreSQL=ON
           -DCMAKE_DISABLE_FIND_PACKAGE_Boost=ON)
  fi
  cmake -S "$d" -B "$d/build" -G Ninja "${extra[@]}" >"$d/cmake.log" 2>&1 || { cat "$d/cmake.log" >&2; fail "find_package(idem COMPONENTS $component) failed"; }
  if [ "${#extra[@]}" -gt 0 ] && grep -Eq "hiredis|librabbitmq" "$d/cmake.log"; then
    cat "$d/cmake.log" >&2
    fail "find_package(idem COMPONENTS $component) looked for a library it does not need"
  fi
  cmake --build "$d/build" >"$d/build.log" 2>&1 || { cat "$d/build.log" >&2; fail "linking idem::$component failed"; }
done
echo "packages: find_package(idem COMPONENTS ...) works for every component; core and sqlite need only OpenSSL and SQLite"

kill "${pids[@]}" 2>/dev/null || true
wait 2>/dev/null || true
pids=()
dpkg --purge "${packages[@]}" >"$work/purge.log" 2>&1 || { cat "$work/purge.log" >&2; fail "dpkg --purge failed"; }
[ ! -e /usr/bin/idem-gateway ] && [ ! -e /etc/idem/gateway.toml ] || fail "files left after purge"
echo "packages: installed, run, used and purged"
