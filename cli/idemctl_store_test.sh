#!/usr/bin/env bash
# idemctl's store commands (get, list, purge, release, resolve, stats) and the journal commands'
# argument handling, against an SQLite store file filled by idemctl_seed from another process:
# outputs, exit codes, stderr. Usage: idemctl_store_test.sh IDEMCTL IDEMCTL_SEED
set -u
idemctl=${1:?usage: idemctl_store_test.sh path/to/idemctl path/to/idemctl_seed}
seed=${2:?usage: idemctl_store_test.sh path/to/idemctl path/to/idemctl_seed}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
store="sqlite:$tmp/idem.db"
unset IDEM_STORE IDEM_JOURNAL

. "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"

# expect_ok NAME: exit 0 and nothing on stderr.
expect_ok() {
  [ "$rc" -eq 0 ] || fail "$1: exit $rc (stderr: $(cat "$tmp/err"))"
  [ ! -s "$tmp/err" ] || fail "$1: unexpected stderr: $(cat "$tmp/err")"
}

seed_record() { "$seed" "$store" "$@" || fail "idemctl_seed $*"; }

# --- a store that does not exist --------------------------------------------------------------

# A mistyped path is an error, not a new, empty store that answers "no records".
for cmd in stats list "get acme k" "purge" "release acme k" ; do
  # shellcheck disable=SC2086
  run $cmd --store "$store"
  expect_error "$cmd on a missing file" 1 \
    "idemctl: cannot open store $store: $tmp/idem.db does not exist (idemctl never creates a store: give the path the gateway uses)"
done
[ ! -e "$tmp/idem.db" ] || fail "idemctl created $tmp/idem.db"

# --- an empty store ---------------------------------------------------------------------------

: >"$tmp/idem.db"  # what an SQLite store is before its first write; the gateway creates it so
run stats --store "$store" --json
expect_ok "stats on a new store"
json "stats on a new store" 'j == {"in_progress":0,"completed":0,"failed_retryable":0,"expired":0,"total":0}'

run list --store "$store"
expect_ok "list empty"
[ "$(cat "$tmp/out")" = "no records" ] || fail "list empty: $(cat "$tmp/out")"

run get --store "$store" acme key-absent-0000001
expect_error "get absent" 1 'idemctl: no record for tenant "acme" key "key-absent-0000001"'

# --- records as the gateway leaves them -------------------------------------------------------

seed_record acme key-completed-00001 completed --status 201 --header 'Content-Type: application/json' \
  --header 'X-Execution-Id: ex-1' --body '{"id":"pay_1"}'
seed_record acme key-running-000001 in_progress
seed_record acme key-stale-00000001 in_progress --stale-lease
seed_record '' key-failed-0000001 failed_retryable
seed_record '' key-expired-000001 completed --expired
seed_record zeta key-completed-00002 completed

run stats --store "$store"
expect_ok "stats"
out_has "stats" "completed         2"
out_has "stats" "in_progress       2"
out_has "stats" "failed_retryable  1"
out_has "stats" "expired           1"
out_has "stats" "total             6"

run get --store "$store" acme key-completed-00001
expect_ok "get"
out_has "get" "state          completed"
out_has "get" "status         201"
out_has "get" "header         X-Execution-Id: ex-1"
out_has "get" "body           14 bytes"
grep -qE '^created        [0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z$' "$tmp/out" ||
  fail "get: created is not ISO-8601 UTC: $(cat "$tmp/out")"

run get --store "$store" acme key-completed-00001 --body
expect_ok "get --body"
printf '%s' '{"id":"pay_1"}' >"$tmp/want"
cmp -s "$tmp/out" "$tmp/want" || fail "get --body: $(od -c "$tmp/out" | head -3)"

run get --store "$store" acme key-completed-00001 --json
expect_ok "get --json"
json "get --json" 'j["state"] == "completed" and j["response"]["status"] == 201 and j["response"]["body_size"] == 14'
json "get --json body" '__import__("base64").b64decode(j["response"]["body_base64"]) == b"{\"id\":\"pay_1\"}"'
json "get --json token is a string" 'isinstance(j["fencing_token"], str) and j["fencing_token"].isdigit()'

run get --store "$store" acme key-stale-00000001
expect_ok "get in_progress"
out_has "get in_progress" "(lease expired)"
out_has "get in_progress" "response       none stored"

run get --store "$store" acme key-running-000001 --body
expect_error "get --body without a response" 1 \
  'idemctl: tenant "acme" key "key-running-000001" has no stored response (state in_progress)'

run get --store "$store" '' key-expired-000001
expect_ok "get expired"
out_has "get expired" "(expired: as if absent"

run get --store "$store" acme key-completed-00001 --body --json
expect_error "get --body --json" 2

run get --store "$store" acme
expect_error "get without a key" 2

# --- list -------------------------------------------------------------------------------------

run list --store "$store" --json
expect_ok "list --json"
json "list --json" 'len(j["records"]) == 6 and j["next_after"] is None'
json "list order" '[(r["tenant"], r["key"]) for r in j["records"]][:2] == [("", "key-expired-000001"), ("", "key-failed-0000001")]'

run list --store "$store" --state in_progress --json
expect_ok "list --state"
json "list --state" '[r["key"] for r in j["records"]] == ["key-running-000001", "key-stale-00000001"]'

run list --store "$store" --limit 2
[ "$rc" -eq 0 ] || fail "list --limit: exit $rc"
[ "$(grep -c key- "$tmp/out")" -eq 2 ] || fail "list --limit 2: $(cat "$tmp/out")"
grep -qF -- "--after '' 'key-failed-0000001'" "$tmp/err" || fail "list --limit: no next-page hint: $(cat "$tmp/err")"

run list --store "$store" --tenant acme --json
expect_ok "list --tenant"
json "list --tenant" 'len(j["records"]) == 3 and all(r["tenant"] == "acme" for r in j["records"])'

run list --store "$store" --tenant '' --json
expect_ok "list --tenant ''"
json "list --tenant ''" '[r["key"] for r in j["records"]] == ["key-expired-000001", "key-failed-0000001"]'

run list --store "$store" --limit 2 --after '' key-failed-0000001 --json
expect_ok "list --after"
json "list --after" '[r["key"] for r in j["records"]] == ["key-completed-00001", "key-running-000001"]'
json "list --after next" 'j["next_after"] == {"tenant": "acme", "key": "key-running-000001"}'

run list --store "$store" --limit 1 --all --json
expect_ok "list --all"
json "list --all" 'len(j["records"]) == 6'

run list --store "$store" --state done
expect_error "list bad --state" 2

run list --store "$store" --limit 0
expect_error "list --limit 0" 2

# --- release and resolve ----------------------------------------------------------------------

run release --store "$store" acme key-stale-00000001
expect_ok "release"
out_has "release" "now failed_retryable"
run get --store "$store" acme key-stale-00000001 --json
json "released record" 'j["state"] == "failed_retryable"'

run release --store "$store" acme key-completed-00001
expect_error "release completed" 1
run release --store "$store" acme key-absent-0000001
expect_error "release absent" 1 'idemctl: no record for tenant "acme" key "key-absent-0000001" (absent or expired)'
run release --store "$store" '' key-expired-000001
expect_error "release expired" 1

printf '{"id":"pay_9","by":"operator"}' >"$tmp/body.json"
run resolve --store "$store" acme key-running-000001 --status 201 --body @"$tmp/body.json" \
  -H 'Content-Type: application/json' --retention 2h --json
expect_ok "resolve"
json "resolve" 'j["state"] == "completed" and j["status"] == 201 and j["body_size"] == 30'
run get --store "$store" acme key-running-000001 --body
cmp -s "$tmp/out" "$tmp/body.json" || fail "resolved body: $(cat "$tmp/out")"
run get --store "$store" acme key-running-000001 --json
json "resolved headers" 'j["response"]["headers"] == [["Content-Type", "application/json"]]'

run resolve --store "$store" '' key-failed-0000001 --status 204 --body ''
expect_ok "resolve a failed record with an empty body"

run resolve --store "$store" acme key-running-000001 --status 200 --body x
expect_error "resolve completed" 1
run resolve --store "$store" acme key-absent-0000001 --status 200 --body x
expect_error "resolve absent" 1
run resolve --store "$store" acme key-stale-00000001 --body x
expect_error "resolve without --status" 2
run resolve --store "$store" acme key-stale-00000001 --status 700 --body x
expect_error "resolve status out of range" 2
run resolve --store "$store" acme key-stale-00000001 --status 200 --body @"$tmp/missing"
expect_error "resolve unreadable body" 2
run resolve --store "$store" acme key-stale-00000001 --status 200 --body x --retention 10
expect_error "resolve bad --retention" 2
run resolve --store "$store" acme key-stale-00000001 --status 200 --body x -H 'bad header'
expect_error "resolve bad header" 2

# --- purge ------------------------------------------------------------------------------------

run purge --store "$store"
expect_ok "purge"
[ "$(cat "$tmp/out")" = "purged 1 expired record" ] || fail "purge: $(cat "$tmp/out")"
run purge --store "$store" --json --batch 1
expect_ok "purge again"
json "purge again" 'j == {"purged": 0}'
run purge --store "$store" --batch 0
expect_error "purge --batch 0" 2

run stats --store "$store" --json
json "stats after" 'j == {"in_progress":0,"completed":4,"failed_retryable":1,"expired":0,"total":5}'

# --- the store URL ----------------------------------------------------------------------------

IDEM_STORE=$store run stats --json
expect_ok "IDEM_STORE"
json "IDEM_STORE" 'j["total"] == 5'

run stats
expect_error "no --store" 2
run stats --store memory:
expect_error "memory: is useless across processes" 2
run stats --store 'bogus://x'
expect_error "unknown URL" 2
run stats --store 'sqlite:/proc/idemctl-test/idem.db'
expect_error "unopenable store" 1

# --- the journal commands' arguments ----------------------------------------------------------

run pending
expect_error "pending without --journal" 2
# Reading a journal that does not exist is an error (a mistyped path would say "nothing pending"
# while the real journal holds unanswered operations); only send starts one.
for cmd in pending dead-letters resume "dead-letters retry some-key-000000001"; do
  # shellcheck disable=SC2086
  run $cmd --journal "$tmp/journal.db"
  expect_error "$cmd on a missing journal" 1 "idemctl: cannot open journal $tmp/journal.db: it does not exist \
(nothing was ever sent with it; give the path \`idemctl send --journal\` or the client used)"
done
[ ! -e "$tmp/journal.db" ] || fail "a journal command created $tmp/journal.db"
: >"$tmp/journal.db"  # an empty journal, as before its first operation
run pending --journal "$tmp/journal.db"
expect_ok "pending on an empty journal"
[ "$(cat "$tmp/out")" = "no pending operations" ] || fail "pending: $(cat "$tmp/out")"
IDEM_JOURNAL=$tmp/journal.db run dead-letters --json
expect_ok "dead-letters --json"
json "dead-letters --json" 'j == {"dead_letters": []}'
run dead-letters --journal "$tmp/journal.db" retry
expect_error "dead-letters retry without KEY" 2 "idemctl: retry needs a KEY"
run dead-letters --journal "$tmp/journal.db" list some-key-000000001
expect_error "dead-letters list with a KEY" 2
run dead-letters --journal "$tmp/journal.db" bury some-key-000000001
expect_error "dead-letters unknown action" 2
run dead-letters --journal "$tmp/journal.db" drop some-key-000000001
expect_error "dead-letters drop absent" 1 'idemctl: no dead letter with key "some-key-000000001"'
run dead-letters --journal "$tmp/journal.db" retry some-key-000000001
expect_error "dead-letters retry absent" 1
run pending --journal "$tmp/journal.db" drop some-key-000000001
expect_error "pending drop absent" 1
run resume --journal "$tmp/journal.db"
expect_ok "resume with nothing pending"
[ "$(cat "$tmp/out")" = "resumed 0 pending operations: 0 succeeded" ] || fail "resume: $(cat "$tmp/out")"
run pending --journal /proc/idemctl-test/journal.db
expect_error "unopenable journal" 1

finish "idemctl store commands"
