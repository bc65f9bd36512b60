#!/usr/bin/env bash
# Model-checks proof/idem.pml with spin (docs/design.md, "The model"). Exits non-zero when:
#  - a correct configuration has any error (assertion, invalid end state) or an incomplete search;
#  - a seeded-bug variant passes: spin must find its counterexample;
#  - a witness passes: the event it names must be reachable, or the properties could hold vacuously.
# Every search is exhaustive (no bitstate hashing) within the bounds below.
#   proof.sh [--quick]    --quick: the correct configurations at 2+1 requests only (local iteration)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
model="$root/proof/idem.pml"
quick=0
[ "${1:-}" = --quick ] && quick=1

work=$(mktemp -d -t idem-proof.XXXXXX)
trap 'rm -rf "$work"' EXIT
cp "$model" "$work/idem.pml"
cd "$work"

failures=0
# check NAME EXPECT FLAGS...: EXPECT is "pass" (no error, search complete) or "fail" (a
# counterexample). Prints one line per run: states, depth, time, and the violated assertion.
check() {
  local name=$1 expect=$2
  shift 2
  rm -f pan pan.* idem.pml.trail
  if ! spin "$@" -a idem.pml >spin.out 2>&1; then
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
    spin -t -p "$@" idem.pml 2>&1 | tail -60 >&2 || true
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

if ((failures)); then
  echo "proof: $failures check(s) failed" >&2
  exit 1
fi
echo "proof: all checks passed"
