#!/usr/bin/env bash
# idemctl's outbox commands (outbox list, show, retry, drop, stats) against an SQLite outbox whose
# rows a service wrote with plain INSERTs (python3's sqlite3, as a service in another language
# would), while a relay holds the file's relay lock: outputs, exit codes, stderr.
# Usage: idemctl_outbox_test.sh IDEMCTL IDEMCTL_OUTBOX_SEED
set -u
idemctl=${1:?usage: idemctl_outbox_test.sh path/to/idemctl path/to/idemctl_outbox_seed}
seed=${2:?usage: idemctl_outbox_test.sh path/to/idemctl path/to/idemctl_outbox_seed}
tmp=$(mktemp -d)
holder=""
cleanup() {
  if [ -n "$holder" ]; then
    exec 7>&- 2>/dev/null
    wait "$holder" 2>/dev/null
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
db="$tmp/service.db"
outbox="sqlite:$db"
unset IDEM_OUTBOX

. "$(dirname "${BASH_SOURCE[0]}")/test_lib.sh"

expect_ok() {
  [ "$rc" -eq 0 ] || fail "$1: exit $rc (stderr: $(cat "$tmp/err"))"
  [ ! -s "$tmp/err" ] || fail "$1: unexpected stderr: $(cat "$tmp/err")"
}

# sql STATEMENTS: what the service runs on its database.
sql() { python3 -c 'import sqlite3,sys; c=sqlite3.connect(sys.argv[1]); c.executescript(sys.argv[2]); c.commit()' "$db" "$1" ||
  fail "sql: $1"; }

# --- no outbox to operate ---------------------------------------------------------------------

run outbox stats --outbox "$outbox"
expect_error "stats on a missing file" 1 \
  "idemctl: cannot open outbox $outbox: sqlite: the outbox database $db does not exist (the service makes it; idem-relay and idemctl never do)"
[ ! -e "$db" ] || fail "idemctl created $db"

run outbox list --outbox "redis://cache:6379"
expect_error "a Redis URL" 2 \
  'idemctl: --outbox: the outbox needs SQLite or PostgreSQL: expected sqlite:PATH or postgres://..., got "redis://cache:6379"'
run outbox stats --outbox "mysql://app:pw99secret@db/app"
expect_error "a MySQL URL with a password" 2
grep -q pw99secret "$tmp/err" && fail "a password reached stderr: $(cat "$tmp/err")"

sql "CREATE TABLE orders (id INTEGER PRIMARY KEY)"
run outbox stats --outbox "$outbox"
expect_error "a database without the table" 1
grep -qF "has no idem_outbox table" "$tmp/err" || fail "no-table message: $(cat "$tmp/err")"
[ "$(python3 -c 'import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute("select count(*) from sqlite_master where name=\"idem_outbox\"").fetchone()[0])' "$db")" = 0 ] ||
  fail "idemctl created the outbox table"

# --- an outbox in the service's database ------------------------------------------------------

"$seed" create "$outbox" || fail "idemctl_outbox_seed create"
run outbox stats --outbox "$outbox" --json
expect_ok "stats on an empty outbox"
json "stats on an empty outbox" \
  'j == {"pending":0,"sent":0,"dead":0,"oldest_pending":None,"oldest_pending_age_ms":None,"held_keys":0,"oldest_held":None}'
run outbox list --outbox "$outbox"
expect_ok "list empty"
[ "$(cat "$tmp/out")" = "no rows" ] || fail "list empty: $(cat "$tmp/out")"

# 2026-01-01T00:00:00Z and a minute later, so that the output is known.
t0=1767225600000
t1=1767225660000
sql "
INSERT INTO idem_outbox (message_id, destination, headers, body, created_ms)
  VALUES ('pay_1/payment.succeeded', 'payments', '{\"X-Tenant\": \"acme\", \"X-Trace\": \"t-1\"}', '{\"id\":\"pay_1\"}', $t0);
INSERT INTO idem_outbox (message_id, body, created_ms, state, attempts, last_error)
  VALUES ('pay_2/payment.succeeded', 'x', $t0, 'dead', 5, 'the sink refused it: too large');
INSERT INTO idem_outbox (message_id, body, created_ms, state, sent_ms)
  VALUES ('pay_3/payment.succeeded', 'x', $t0, 'sent', $t1);
INSERT INTO idem_outbox (message_id, body, created_ms, next_attempt_ms, attempts, last_error)
  VALUES ('pay_4/payment.succeeded', 'x', $t1, 99999999999999, 1, 'timeout');
"

# A relay holds the file meanwhile: every operator command must still work.
mkfifo "$tmp/hold"
"$seed" hold "$outbox" <"$tmp/hold" >"$tmp/held" 2>"$tmp/held.err" &
holder=$!
exec 7>"$tmp/hold"
for _ in $(seq 100); do grep -q holding "$tmp/held" 2>/dev/null && break; sleep 0.05; done
grep -q holding "$tmp/held" || fail "the relay stand-in did not take the lock: $(cat "$tmp/held.err")"
"$seed" hold "$outbox" </dev/null >/dev/null 2>"$tmp/second.err" && fail "a second relay took the lock"
grep -qF "one relay per SQLite file" "$tmp/second.err" || fail "second relay: $(cat "$tmp/second.err")"

run outbox list --outbox "$outbox"
expect_ok "list"
out_has "list" "ID        STATE    ATTEMPTS  CREATED                   MESSAGE_ID"
out_has "list" '1         pending  0         2026-01-01T00:00:00.000Z  pay_1/payment.succeeded  -> "payments"'
out_has "list" '2         dead     5         2026-01-01T00:00:00.000Z  pay_2/payment.succeeded  ("the sink refused it: too large")'
out_has "list" "3         sent     0"
out_has "list" "4         pending  1         2026-01-01T00:01:00.000Z"
[ "$(wc -l <"$tmp/out")" -eq 5 ] || fail "list: $(cat "$tmp/out")"

run outbox list --outbox "$outbox" --state dead --json
expect_ok "list --state dead"
json "list --state dead" '[r["message_id"] for r in j["rows"]] == ["pay_2/payment.succeeded"] and j["next_after"] is None'

run outbox list --outbox "$outbox" --limit 2
[ "$rc" -eq 0 ] || fail "list --limit 2: exit $rc"
[ "$(cat "$tmp/err")" = "idemctl: more rows may follow: add --after 2" ] || fail "list --limit 2 hint: $(cat "$tmp/err")"
[ "$(wc -l <"$tmp/out")" -eq 3 ] || fail "list --limit 2: $(cat "$tmp/out")"

IDEM_OUTBOX="$outbox" run outbox list --after 2 --json
expect_ok "list --after 2 (outbox from \$IDEM_OUTBOX)"
json "list --after 2" '[r["id"] for r in j["rows"]] == [3, 4] and j["rows"][0]["sent"] == "2026-01-01T00:01:00.000Z"'

run outbox list --outbox "$outbox" --state published
expect_error "list --state published" 2

run outbox show --outbox "$outbox" 1
expect_ok "show"
out_has "show" "message_id    pay_1/payment.succeeded"
out_has "show" "state         pending"
out_has "show" "destination   payments"
out_has "show" "content_type  application/json"
out_has "show" "header        X-Tenant: acme"
out_has "show" "header        X-Trace: t-1"
out_has "show" "body          14 bytes (--body prints them)"
out_has "show" "next_attempt  now"

run outbox show --outbox "$outbox" 4
out_has "show 4" "next_attempt  5138-11-16T09:46:39.999Z (in "
out_has "show 4" "last_error    timeout"

run outbox show --outbox "$outbox" 1 --json
expect_ok "show --json"
json "show --json" 'j["headers"] == {"X-Tenant": "acme", "X-Trace": "t-1"} and j["body_base64"] == "eyJpZCI6InBheV8xIn0=" and j["due"] is True and j["attempts"] == 0'

run outbox show --outbox "$outbox" 1 --body
expect_ok "show --body"
printf '%s' '{"id":"pay_1"}' >"$tmp/want"
cmp -s "$tmp/out" "$tmp/want" || fail "show --body: $(od -c "$tmp/out" | head -3)"

run outbox show --outbox "$outbox" 99
expect_error "show absent" 1 "idemctl: no outbox row 99"
run outbox show --outbox "$outbox" 0
expect_error "show 0" 2
run outbox show --outbox "$outbox" one
expect_error "show one" 2
run outbox show --outbox "$outbox" 1 --body --json
expect_error "show --body --json" 2 "idemctl: --body and --json exclude each other (--json has body_base64)"

run outbox stats --outbox "$outbox"
expect_ok "stats"
out_has "stats" "pending         2"
out_has "stats" "sent            1"
out_has "stats" "dead            1  (see: idemctl outbox list --state dead)"
out_has "stats" "oldest_pending  2026-01-01T00:00:00.000Z ("
run outbox stats --outbox "$outbox" --json
json "stats --json" 'j["pending"] == 2 and j["sent"] == 1 and j["dead"] == 1 and j["oldest_pending"] == "2026-01-01T00:00:00.000Z" and j["oldest_pending_age_ms"] > 0'

# --- retry and drop, only of dead rows --------------------------------------------------------

run outbox retry --outbox "$outbox" 1
expect_error "retry a pending row" 1 "idemctl: outbox row 1 is pending, not dead: only dead rows are retried"
run outbox retry --outbox "$outbox" 99
expect_error "retry absent" 1 "idemctl: no outbox row 99"
run outbox retry --outbox "$outbox" 2
expect_ok "retry"
[ "$(cat "$tmp/out")" = "outbox row 2 is pending again, due now, its attempts reset: the relay publishes it next" ] ||
  fail "retry: $(cat "$tmp/out")"
run outbox show --outbox "$outbox" 2 --json
json "retried row" 'j["state"] == "pending" and j["attempts"] == 0 and j["due"] is True'

# The relay goes; the next one publishes what is due, the retried row among them.
exec 7>&-
wait "$holder"
holder=""
[ "$("$seed" relay "$outbox" | tr '\n' ' ')" = "1 2 " ] || fail "the relay did not publish rows 1 and 2"

run outbox drop --outbox "$outbox" 2
expect_error "drop a sent row" 1 "idemctl: outbox row 2 is sent, not dead: only dead rows are dropped"
sql "INSERT INTO idem_outbox (message_id, state, last_error) VALUES ('pay_5/payment.failed', 'dead', 'no route');"
run outbox drop --outbox "$outbox" 5 --json
expect_ok "drop"
json "drop" 'j == {"id": 5, "dropped": True}'
run outbox show --outbox "$outbox" 5
expect_error "show dropped" 1 "idemctl: no outbox row 5"
run outbox drop --outbox "$outbox" 5
expect_error "drop again" 1 "idemctl: no outbox row 5"

# --- rows no relay can publish: dead at the claim, and an operator still reads them -----------
# The SQLite table leaves ids and header values to the relay (docs/outbox.md). Row 5 was dropped
# while it was the newest, so its id is given again (the table has no AUTOINCREMENT).
sql "INSERT INTO idem_outbox (message_id, headers) VALUES ('has space', '{\"n\": 1}');
     INSERT INTO idem_outbox (message_id, headers) VALUES ('pay_7/payment.succeeded', '{\"n\": [1]}');
     INSERT INTO idem_outbox (message_id) VALUES ('pay_8/payment.succeeded');"
[ "$("$seed" relay "$outbox" | tr '\n' ' ')" = "7 " ] || fail "the relay should publish row 7 alone"
run outbox list --outbox "$outbox" --state dead
expect_ok "list unreadable rows"
out_has "list unreadable rows" '5         dead     0         '
out_has "list unreadable rows" '"has space"  ("the row cannot be read: the message id has a character that is not visible ASCII'
out_has "list unreadable rows" '"pay_7/payment.succeeded"  ("the row cannot be read: the headers are not a JSON object of strings'
run outbox show --outbox "$outbox" 5
expect_ok "show an unreadable row"
out_has "show an unreadable row" 'message_id    "has space"'
out_has "show an unreadable row" 'unreadable    the message id has a character that is not visible ASCII'
run outbox show --outbox "$outbox" 6 --json
expect_ok "show --json an unreadable row"
json "show --json an unreadable row" 'j["state"] == "dead" and j["headers"] == {} and "is not a string" in j["unreadable"]'
run outbox show --outbox "$outbox" 7 --json
json "show --json a published row" 'j["state"] == "sent" and j["unreadable"] is None'
run outbox drop --outbox "$outbox" 5
expect_ok "drop an unreadable row"

# --- an ordering key held behind its dead row --------------------------------------------------
sql "INSERT INTO idem_outbox (message_id, ordering_key, state, last_error, created_ms) VALUES ('pay_9/a', 'pay_9', 'dead', 'refused', $t0);
     INSERT INTO idem_outbox (message_id, ordering_key, created_ms) VALUES ('pay_9/b', 'pay_9', $t1);"
run outbox stats --outbox "$outbox"
expect_ok "stats with a held key"
out_has "stats with a held key" "held_keys       1  (ordering keys waiting behind a dead row since 2026-01-01T00:01:00.000Z, "
run outbox stats --outbox "$outbox" --json
json "stats --json with a held key" 'j["held_keys"] == 1 and j["oldest_held"] == "2026-01-01T00:01:00.000Z"'
run outbox list --outbox "$outbox" --state pending
out_has "list a keyed row" 'pay_9/b  key pay_9 #'
run outbox show --outbox "$outbox" --json "$(python3 -c 'import sqlite3,sys; print(sqlite3.connect(sys.argv[1]).execute("select id from idem_outbox where message_id = \"pay_9/b\"").fetchone()[0])' "$db")"
json "show --json a keyed row" 'j["ordering_key"] == "pay_9" and j["key_seq"] > 0'

run outbox
expect_error "outbox without a command" 2

finish "idemctl outbox"
