#!/usr/bin/env bash
# idemctl send, pending, dead-letters and resume against the fixture upstream (no gateway: the
# fixture counts executions per key and scripts answers per key, which is all the client sees):
# outputs, keys, retries, journal, exit codes. Usage: idemctl_send_test.sh IDEMCTL FIXTURE_UPSTREAM
set -u
idemctl=${1:?usage: idemctl_send_test.sh path/to/idemctl path/to/idem-fixture-upstream}
upstream_bin=${2:?usage: idemctl_send_test.sh path/to/idemctl path/to/idem-fixture-upstream}
tmp=$(mktemp -d)
upstream_pid=
hung_pid=
cleanup() {
  [ -n "$hung_pid" ] && kill -9 "$hung_pid" 2>/dev/null
  [ -n "$upstream_pid" ] && kill "$upstream_pid" 2>/dev/null && wait "$upstream_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
unset IDEM_STORE IDEM_JOURNAL
journal=$tmp/journal.db
fast=(--retry-delay 10ms --timeout 10s --deadline 30s)

. "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"

"$upstream_bin" --listen 127.0.0.1:0 --port-file "$tmp/port" >"$tmp/upstream.log" 2>&1 &
upstream_pid=$!
for _ in $(seq 1 500); do
  [ -s "$tmp/port" ] && break
  sleep 0.01
done
[ -s "$tmp/port" ] || { echo "FAIL: the fixture upstream did not start: $(cat "$tmp/upstream.log")" >&2; exit 1; }
base=http://127.0.0.1:$(cat "$tmp/port")

# expect_line NAME CODE REGEX: exit CODE and the first stderr line matches REGEX (anchored).
expect_line() {
  local name=$1 code=$2 regex=$3
  [ "$rc" -eq "$code" ] || fail "$name: exit $rc, want $code (stderr: $(cat "$tmp/err"))"
  head -1 "$tmp/err" | grep -qE "^idemctl: $regex\$" || fail "$name: stderr '$(cat "$tmp/err")' !~ '$regex'"
}

expect_usage() { expect_error "$1" 2; }

key_of_line() { sed -n 's/^idemctl: key=\([^ ]*\) .*/\1/p' "$tmp/err" | head -1; }
executions() { curl -s "$base/executions?key=$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["count"])'; }
hang_executions() {
  curl -s "$base/counts" | python3 -c 'import json,sys; print(sum(r["count"] for r in json.load(sys.stdin)["requests"] if r["path"] == "/hang"))'
}
uuid='[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}'

# --- send -------------------------------------------------------------------------------------

run send -d '{"amount":5}' -H 'Content-Type: application/json' -H 'X-Trace: t1' "$base/echo"
expect_line "send" 0 "key=$uuid attempts=1 replayed=false status=200 stop=success"
[ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "send: more than one stderr line: $(cat "$tmp/err")"
key=$(key_of_line)
json "send body" 'j["key"] == "'"$key"'" and j["body"] == "{\"amount\":5}" and j["method"] == "POST"'
json "send headers" '["Content-Type", "application/json"] in j["headers"] and ["X-Trace", "t1"] in j["headers"]'
json "send key header" '["Idempotency-Key", "'"$key"'"] in j["headers"]'

run send "$base/echo"
key2=$(key_of_line)
[ -n "$key2" ] && [ "$key2" != "$key" ] || fail "every send makes a new key: $key / $key2"

run send -X PATCH --key my-operation-000001 -d @- "$base/echo" <<<'from stdin'
json "send -X and --key" 'j["method"] == "PATCH" and j["key"] == "my-operation-000001"'
"$idemctl" send --key my-operation-000002 -d @- "$base/echo" <<<'from stdin' >"$tmp/out" 2>"$tmp/err"
json "send -d @-" 'j["body"] == "from stdin\n"'
printf 'from a file' >"$tmp/body"
run send -d @"$tmp/body" "$base/echo"
json "send -d @FILE" 'j["body"] == "from a file"'

run send -H 'Idempotency-Key: header-key-0000001' "$base/echo"
expect_line "key from -H" 0 "key=header-key-0000001 attempts=1 replayed=false status=200 stop=success"

run send --key-header X-Idem-Key --key custom-header-0001 "$base/echo"
json "--key-header" '["X-Idem-Key", "custom-header-0001"] in j["headers"]'

# Retried with the same key: two 5xx, then the answer.
run send "${fast[@]}" --key retried-key-000001 "$base/sequence?codes=503,500,201"
expect_line "retries" 0 "key=retried-key-000001 attempts=3 replayed=false status=201 stop=success"
json "retries body" 'j["status"] == 201 and j["execution"] == 3'
[ "$(executions retried-key-000001)" = 3 ] || fail "retries: the upstream saw $(executions retried-key-000001) executions"

# Never retried: 422 and other 4xx. The body is printed, exit 1.
run send "${fast[@]}" --key mismatch-key-00001 "$base/status/422"
expect_line "422" 1 "key=mismatch-key-00001 attempts=1 replayed=false status=422 stop=non_retryable"
json "422 body" 'j["status"] == 422'
run send "${fast[@]}" "$base/status/404"
expect_line "404" 1 "key=$uuid attempts=1 replayed=false status=404 stop=non_retryable"

# Retries exhausted without a journal: says which key to reuse.
run send "${fast[@]}" --attempts 2 --key exhausted-key-0001 "$base/status/503"
expect_line "exhausted" 1 "key=exhausted-key-0001 attempts=2 replayed=false status=503 stop=attempts_exhausted"
grep -qF -- "--key 'exhausted-key-0001'" "$tmp/err" || fail "exhausted: no hint: $(cat "$tmp/err")"

# Nobody listening: a transport failure, exit 1.
closed_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
run send "${fast[@]}" --attempts 2 "http://127.0.0.1:$closed_port/echo"
expect_line "refused" 1 "key=$uuid attempts=2 replayed=false status=none stop=attempts_exhausted error=\"could_not_connect: .*\""

run send --json --key json-output-000001 "$base/echo"
[ "$rc" -eq 0 ] || fail "send --json: exit $rc"
json "send --json" 'j["key"] == "json-output-000001" and j["status"] == 200 and j["attempts"] == 1 and j["replayed"] is False'
json "send --json body" 'json.loads(__import__("base64").b64decode(j["body_base64"]))["key"] == "json-output-000001"'

# --- usage errors -----------------------------------------------------------------------------

run send
expect_usage "send without URL"
run send "ftp://127.0.0.1/x"
expect_usage "send non-http URL"
run send -H 'no colon' "$base/echo"
expect_usage "send bad header"
run send --key short "$base/echo"
expect_usage "send short key"
run send --key 'has space in the key' "$base/echo"
expect_usage "send key with a space"
run send --key header-key-0000001 -H 'Idempotency-Key: other-key-00000001' "$base/echo"
expect_usage "send two different keys"
run send -d @"$tmp/missing" "$base/echo"
expect_usage "send unreadable -d file"
run send --attempts 0 "$base/echo"
expect_usage "send --attempts 0"
run send --deadline 0s "$base/echo"
expect_usage "send --deadline 0s"
run send -X 'BAD METHOD' "$base/echo"
expect_usage "send bad method"
[ "$(executions short)" = 0 ] || fail "a refused key reached the upstream"

# --- the journal: dead letters ----------------------------------------------------------------

run send "${fast[@]}" --attempts 2 --journal "$journal" --key dead-letter-key-001 "$base/sequence?codes=503,503,201"
expect_line "dead letter" 1 "key=dead-letter-key-001 attempts=2 replayed=false status=503 stop=attempts_exhausted"
grep -qF "idemctl dead-letters --journal '$journal' retry 'dead-letter-key-001'" "$tmp/err" ||
  fail "dead letter: no hint: $(cat "$tmp/err")"

run dead-letters --journal "$journal"
[ "$rc" -eq 0 ] || fail "dead-letters: exit $rc"
grep -qE '^dead-letter-key-001 .* attempts_exhausted +2 +503 ' "$tmp/out" || fail "dead-letters: $(cat "$tmp/out")"
run dead-letters --journal "$journal" list --json
json "dead-letters --json" 'len(j["dead_letters"]) == 1 and j["dead_letters"][0]["last_response"]["status"] == 503'
json "dead-letters --json request" 'j["dead_letters"][0]["request"]["url"].endswith("/sequence?codes=503,503,201")'

run dead-letters --journal "$journal" retry dead-letter-key-001 "${fast[@]}"
expect_line "dead-letters retry" 0 "key=dead-letter-key-001 attempts=1 replayed=false status=201 stop=success"
json "dead-letters retry body" 'j["execution"] == 3'
run dead-letters --journal "$journal" --json
json "dead letters empty after retry" 'j["dead_letters"] == []'

run send "${fast[@]}" --attempts 1 --journal "$journal" --key dead-letter-key-002 "$base/status/500"
run dead-letters --journal "$journal" drop dead-letter-key-002
[ "$rc" -eq 0 ] && [ "$(cat "$tmp/out")" = "dropped dead letter dead-letter-key-002" ] || fail "drop: $rc $(cat "$tmp/out")"

run send --journal "$journal" "$base/echo"
expect_line "journaled success" 0 "key=$uuid attempts=1 replayed=false status=200 stop=success"
run pending --journal "$journal" --json
json "a final answer leaves nothing pending" 'j["pending"] == []'

# --- interrupted: the key to reuse is on stderr -----------------------------------------------

"$idemctl" send --timeout 60s -d 'x' "$base/hang" >/dev/null 2>"$tmp/err" &
hung_pid=$!
for _ in $(seq 1 500); do
  [ "$(hang_executions)" = 1 ] && break
  sleep 0.01
done
kill -TERM "$hung_pid"
wait "$hung_pid"
rc=$?
hung_pid=
[ "$rc" -eq 143 ] || fail "interrupted send: exit $rc, want 143"
grep -qE "^idemctl: interrupted; the request may have taken effect\. To try again safely, send the same request with --key '$uuid'\$" "$tmp/err" ||
  fail "interrupted send: stderr '$(cat "$tmp/err")'"

# --- the journal: a crash mid-send, then resume -----------------------------------------------

# /hang-first never answers a key's first execution: idemctl waits, and is killed while waiting.
"$idemctl" send --journal "$journal" --key crashed-key-000001 -d 'x' "$base/hang-first" >/dev/null 2>&1 &
hung_pid=$!
for _ in $(seq 1 500); do
  [ "$(executions crashed-key-000001)" = 1 ] && break
  sleep 0.01
done
kill -9 "$hung_pid"
wait "$hung_pid" 2>/dev/null
hung_pid=

run pending --journal "$journal"
[ "$rc" -eq 0 ] || fail "pending: exit $rc"
grep -qE '^crashed-key-000001 +1 ' "$tmp/out" || fail "pending after a crash: $(cat "$tmp/out")"
out_body=$(grep crashed "$tmp/out")
case $out_body in *"POST $base/hang-first (1 bytes)"*) ;; *) fail "pending request: $out_body" ;; esac

run resume --journal "$journal" "${fast[@]}"
[ "$rc" -eq 0 ] || fail "resume: exit $rc (stderr: $(cat "$tmp/err"))"
[ "$(cat "$tmp/out")" = "resumed 1 pending operation: 1 succeeded" ] || fail "resume: $(cat "$tmp/out")"
grep -qE '^idemctl: key=crashed-key-000001 attempts=1 replayed=false status=200 stop=success$' "$tmp/err" ||
  fail "resume line: $(cat "$tmp/err")"
[ "$(executions crashed-key-000001)" = 2 ] || fail "resume did not reuse the key: $(curl -s "$base/counts")"
run pending --journal "$journal"
[ "$(cat "$tmp/out")" = "no pending operations" ] || fail "pending after resume: $(cat "$tmp/out")"

finish "idemctl send and journal"
