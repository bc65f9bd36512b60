#!/usr/bin/env bash
# End-to-end checks of the idemctl binary: outputs, exit codes, stderr. Usage: idemctl_test.sh IDEMCTL
set -u
idemctl=${1:?usage: idemctl_test.sh path/to/idemctl}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
. "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"

# run STDIN ARGS... : runs idemctl with STDIN (test_lib.sh's run takes no input).
run() {
  local input=$1
  shift
  printf '%s' "$input" | "$idemctl" "$@" >"$tmp/out" 2>"$tmp/err"
  rc=$?
}

# expect_out NAME EXPECTED_STDOUT: stdout is exactly EXPECTED plus one newline, exit 0, no stderr.
expect_out() {
  local name=$1 expected=$2
  printf '%s\n' "$expected" >"$tmp/want"
  [ "$rc" -eq 0 ] || fail "$name: exit $rc (stderr: $(cat "$tmp/err"))"
  cmp -s "$tmp/out" "$tmp/want" || fail "$name: stdout $(od -c "$tmp/out" | head -5), want $expected"
  [ ! -s "$tmp/err" ] || fail "$name: unexpected stderr: $(cat "$tmp/err")"
}

sha256() { printf '%s' "$1" | sha256sum | cut -d' ' -f1; }

# --- canonicalize -----------------------------------------------------------------------------

run '{ "b" : 1, "a" : [1.50, 2e3, "\u00e9\/"] }' canonicalize
expect_out "canonicalize sorts and normalises" '{"a":[1.5,2000,"é/"],"b":1}'

run '{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001]}' canonicalize
expect_out "canonicalize RFC 8785 numbers" '{"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27]}'

run $'{"a":1,\n "a":2}' canonicalize
expect_error "canonicalize duplicate key" 2 'idemctl: invalid JSON at byte 9: duplicate object key "a"'

run $'{"a\\n":1,"a\\u000a":2}' canonicalize
expect_error "canonicalize duplicate key with newline stays one line" 2 \
  'idemctl: invalid JSON at byte 9: duplicate object key "a\n"'

run '[1, 2' canonicalize
expect_error "canonicalize truncated" 2 'idemctl: invalid JSON at byte 5: unexpected end of input'

run '' canonicalize
expect_error "canonicalize empty input" 2 'idemctl: invalid JSON at byte 0: unexpected end of input'

run '{"ts":1,"a":{"b":2,"c":3}}' canonicalize --json-ignore /ts --json-ignore /a/c
expect_out "canonicalize --json-ignore" '{"a":{"b":2}}'

# --- fingerprint ------------------------------------------------------------------------------

# The documented format, hashed by sha256sum: an independent check of the library's framing.
run '{ "b": 1, "a": 2 }' fingerprint --method POST --path /payments --content-type application/json
expect_out "fingerprint format" "$(sha256 $'4:POST\n9:/payments\n0:\n0:\n4:json\n13:{"a":2,"b":1}\n')"
json_fp=$(cat "$tmp/out")

run '{"a":2,"b":1}' fingerprint --method POST --path /payments --header 'Content-Type: application/json; charset=utf-8'
expect_out "fingerprint ignores key order and content-type parameters" "$json_fp"

run '{"a":2,"b":1}' fingerprint --method POST --path /payments
expect_out "fingerprint without content type hashes raw bytes" \
  "$(sha256 $'4:POST\n9:/payments\n0:\n0:\n3:raw\n13:{"a":2,"b":1}\n')"

run '' fingerprint --method POST --path /payments --query '?b=2&a=1' --header 'X-Tenant: acme' \
  --header 'X-Request-Id: 42' --include-header x-tenant
expect_out "fingerprint query and included header" \
  "$(sha256 $'4:POST\n9:/payments\n7:a=1&b=2\n18:8:x-tenant\n4:acme\n\n3:raw\n0:\n')"
with_header=$(cat "$tmp/out")

run '' fingerprint --method POST --path /payments --query 'a=1&b=2' --header 'X-Tenant: other' \
  --include-header X-Tenant
[ "$(cat "$tmp/out")" != "$with_header" ] || fail "fingerprint: an included header's value must count"

run '' fingerprint --method POST --path /payments --query 'a=1&b=2' --header 'X-Tenant: other'
expect_out "fingerprint: headers not included do not count" \
  "$(sha256 $'4:POST\n9:/payments\n7:a=1&b=2\n0:\n3:raw\n0:\n')"

run '{"amount":5,"client_ts":"2024-01-01"}' fingerprint --method POST --path /p \
  --content-type application/json --json-ignore /client_ts
expect_out "fingerprint --json-ignore" "$(sha256 $'4:POST\n2:/p\n0:\n0:\n4:json\n12:{"amount":5}\n')"

run 'b=2&a=x+y' fingerprint --method POST --path /f --content-type application/x-www-form-urlencoded
expect_out "fingerprint form body" "$(sha256 $'4:POST\n2:/f\n0:\n0:\n4:form\n11:a=x%20y&b=2\n')"

run '' fingerprint --path /payments
expect_error "fingerprint without --method" 2

run '' fingerprint --method POST --path /payments --header 'no colon'
expect_error "fingerprint bad --header" 2

run '' fingerprint --method POST --path '/payments?a=1'
expect_error "fingerprint query in --path" 2 \
  "idemctl: --path must not contain '?'; pass the query with --query"

run '' fingerprint --method POST --path /p --content-type application/json --header 'content-type: text/plain'
expect_error "fingerprint content type given twice" 2

run '' fingerprint --method POST --path /p --bogus
expect_error "fingerprint unknown option" 2

# --- the app ----------------------------------------------------------------------------------

run '' 
expect_error "no subcommand" 2

run '' --help
[ "$rc" -eq 0 ] && grep -q fingerprint "$tmp/out" || fail "--help: exit $rc"

run '' fingerprint --help
[ "$rc" -eq 0 ] && grep -q -- '--include-header' "$tmp/out" || fail "fingerprint --help: exit $rc"

finish "idemctl"
