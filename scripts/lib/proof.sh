#!/usr/bin/env bash
# Model-checks proof/idem.pml and proof/outbox_order.pml with spin (docs/design.md, "The model",
# "The outbox order model"). Exits non-zero when:
#  - a correct configuration has any error (assertion, invalid end state) or an incomplete search;
#  - a seeded-bug variant (or an outbox limit) passes: spin must find its counterexample;
#  - a witness passes: the event it names must be reachable, or the properties could hold vacuously.
# Every search is exhaustive (no bitstate hashing) within the bounds below.
#   proof.sh [--quick]    --quick: the correct configurations at smaller bounds only (2+1 requests;
#                         outbox: 2 transactions), for local iteration
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
quick=0
[ "${1:-}" = --quick ] && quick=1

work=$(mktemp -d -t idem-proof.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp "$root/proof/idem.pml" "$root/proof/outbox_order.pml" "$work/"
cd "$work"

failures=0
pml=idem.pml  # the model check() runs
# check NAME EXPECT FLAGS...: EXPECT is "pass" (no error, search complete) or "fail" (a
# counterexample). Prints one line per run: states, depth, time, and the violated assertion.
check() {
  local name=$1 expect=$2
  shift 2
  rm -f pan pan.* ./*.trail
  if ! spin "$@" -a "$pml" >spin.out 2>&1; then
    cat spin.out
    echo "proof: $name: spin could not generate the verifier" >&2
    failures=$((failures + 1))
    return
  fi
  # -DSAFETY: safety properties only (assertions, end states); COLLAPSE halves the memory. A run
  # that must fail stops at its first counterexample: -O0 compiles four times faster.
  local opt=-O2
  [ "$expect" = fail ] && opt=-O0
  gcc -w "$opt" -DSAFETY -DCOLLAPSE -DMEMLIM=6144 -o pan pan.c
  local start end out errors stored depth assertion
  start=$(date +%s.%N)
  out=$(./pan -m20000 2>&1 || true)
  end=$(date +%s.%N)
  errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' <<<"$out" | head -1)
  stored=$(sed -n 's/^ *\([0-9e.+]*\) states, stored.*/\1/p' <<<"$out" | head -1)
  depth=$(sed -n 's/.*depth reached \([0-9]*\).*/\1/p' <<<"$out" | head -1)
  assertion=$(sed -n 's/^pan:1: \(.*\) (at depth.*/\1/p' <<<"$out" | head -1)
  printf '  %-44s states %10s  depth %4s  %5.1fs  %s\n' "$name" "${stored:-?}" "${depth:-?}" \
    "$(awk -v a="$start" -v b="$end" 'BEGIN { print b - a }')" "${assertion:+counterexample: $assertion}"
  local bad=""
  if [ -z "$errors" ]; then
    bad="no verdict from pan"
  elif grep -q "max search depth too small\|out of memory\|Search not completed" <<<"$out" && [ "$expect" = pass ]; then
    bad="the search did not complete"
  elif [ "$expect" = pass ] && [ "$errors" != 0 ]; then
    bad="spin found a violation"
    spin -t -p "$@" "$pml" 2>&1 | tail -60 >&2 || true
  elif [ "$expect" = fail ] && [ "$errors" = 0 ]; then
    bad="spin found no counterexample, but one must exist"
  fi
  if [ -n "$bad" ]; then
    echo "$out" >&2
    echo "proof: $name: $bad" >&2
    failures=$((failures + 1))
  fi
}

stores=("one-step:" "redis:-DSTORE_REDIS" "postgres:-DSTORE_POSTGRES")
policies=("reexecute:" "unknown:-DUNKNOWN_POLICY")
if ((quick)); then
  bound=(-DNREQ_A=2 -DNREQ_B=1)
else
  bound=(-DNREQ_A=3 -DNREQ_B=1)
fi

echo "proof: the protocol (${bound[*]}; 2 gateways, clock, reaper), exhaustive"
for s in "${stores[@]}"; do
  for p in "${policies[@]}"; do
    # shellcheck disable=SC2086  # empty flags vanish
    check "${s%%:*} store, on_lease_expiry=${p%%:*}" pass "${bound[@]}" ${s#*:} ${p#*:}
  done
done

echo "proof: seeded bugs (each must be refuted)"
for p in "${policies[@]}"; do
  # shellcheck disable=SC2086
  check "complete without the fence, ${p%%:*}" fail -DBUG_NO_FENCE ${p#*:}
  # shellcheck disable=SC2086
  check "claim read, then written, ${p%%:*}" fail -DBUG_SPLIT_CLAIM ${p#*:}
  # The same bug with the first request alone: the second execution itself is the violation.
  # shellcheck disable=SC2086
  check "claim read, then written, ${p%%:*}, A only" fail -DBUG_SPLIT_CLAIM -DNREQ_B=0 ${p#*:}
done

echo "proof: witnesses (each event must be reachable)"
witnesses=("1:a stale holder's late completion refused:" "2:a second execution after a takeover:"
           "3:a replay:" "4:a mismatch:" "5:outcome_unknown:-DUNKNOWN_POLICY" "6:a purge:"
           "7:a takeover after failed_retryable:")
for s in "${stores[@]}"; do
  for w in "${witnesses[@]}"; do
    IFS=: read -r n what flags <<<"$w"
    # shellcheck disable=SC2086
    check "${s%%:*}: $what" fail -DWITNESS="$n" ${s#*:} $flags
  done
done

# The outbox's order per ordering key: 2 relays that crash once each, the purge, an operator's
# retry or drop of a dead row (proof/outbox_order.pml has the bounds' meaning).
pml=outbox_order.pml
outbox_start=$SECONDS
if ((quick)); then
  one_key=("1 key, 2 transactions of 2+1 rows" -DNTX=2)
  two_keys=("2 keys, 2 transactions of 1+1 rows" -DNKEYS=2 -DNTX=2 -DROWS_A=1)
  stall=("a relay stalled past its lease, 1+1 rows" -DSTALL -DNTX=2 -DROWS_A=1)
else
  one_key=("1 key, 3 transactions of 2+1+1 rows")
  two_keys=("2 keys, 2 transactions of 2+1 rows" -DNKEYS=2 -DNTX=2)
  stall=("a relay stalled past its lease, 2+1 rows" -DSTALL -DNTX=2)
fi
echo "proof: outbox order (2 relays, 1 crash each, purge, operator), exhaustive"
check "${one_key[@]:0:1}" pass "${one_key[@]:1}"
check "${two_keys[@]:0:1}" pass "${two_keys[@]:1}"
check "${stall[@]:0:1}" pass "${stall[@]:1}"
check "repeatable read, no row ever deleted" pass -DREPEATABLE_READ -DNO_PURGE -DNO_DEAD

echo "proof: outbox order, seeded bugs (each must be refuted)"
check "claim tests ids, not key_seq" fail -DBUG_ORDER_BY_ID
check "claim tests ids, not key_seq, order alone" fail -DBUG_ORDER_BY_ID -DORDER_ONLY
check "trigger without the key lock" fail -DBUG_NO_KEY_LOCK
check "trigger without the key lock, order alone" fail -DBUG_NO_KEY_LOCK -DORDER_ONLY

# Outside what the design keeps (docs/design.md): each must be refuted, so that a change that
# closes one is noticed here.
echo "proof: outbox order, limits (each must be refuted)"
check "repeatable read, then a purge" fail -DREPEATABLE_READ -DNO_DEAD
check "repeatable read, then a drop" fail -DREPEATABLE_READ -DNO_PURGE

echo "proof: outbox order, witnesses (each event must be reachable)"
witnesses=("1:a lower id commits after a higher id:" "2:a crash after a publish, then a republish:"
           "3:a claim skips a row behind one in flight:" "4:a row waits behind a dead one:"
           "5:a held row published after a retry:" "7:key_seq starts again after a purge:"
           "6:a stalled relay's late duplicate:${stall[*]:1}" "8:a dropped row delivered late:${stall[*]:1}")
for w in "${witnesses[@]}"; do
  IFS=: read -r n what flags <<<"$w"
  # shellcheck disable=SC2086
  check "$what" fail -DWITNESS="$n" $flags
done
echo "proof: outbox order: $((SECONDS - outbox_start)) s in all"

if ((failures)); then
  echo "proof: $failures check(s) failed" >&2
  exit 1
fi
echo "proof: all checks passed"
