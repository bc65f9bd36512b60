#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/, ASan + UBSan) and runs each for a fixed number of runs
# from its seed corpus, with a fixed seed: the corpus (crash regressions included) must pass and
# the mutations that follow find nothing. Exits non-zero on any crash, leak or timeout.
#   fuzz_smoke.sh [build|run]   only build the targets, or only run them (built before); both
#                               when not given
#   IDEM_FUZZ_RUNS   runs per target (default 20000; the corpus counts)
set -euo pipefail
# shellcheck source=scripts/lib/fuzz_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/fuzz_common.sh"

phase=${1:-all}
case "$phase" in build|run|all) ;; *) echo "usage: fuzz_smoke.sh [build|run]" >&2; exit 2 ;; esac
runs=${IDEM_FUZZ_RUNS:-20000}
[ "$phase" = run ] || fuzz_build
[ "$phase" = build ] && exit 0
work=$(mktemp -d -t idem-fuzz.XXXXXX)
trap 'rm -rf "$work"' EXIT

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
failed=0
for t in "${fuzz_targets[@]}"; do
  mkdir -p "$work/$t"
  mapfile -t args < <(fuzz_args "$t")
  start=$(date +%s)
  # New inputs go to the scratch corpus (first directory), never into the repository's.
  if "$fuzz_build_dir/fuzz/${t}_fuzz" "${args[@]}" -runs="$runs" -seed=1 -artifact_prefix="$work/$t-" \
      "$work/$t" "$fuzz_root/fuzz/corpus/$t" >"$work/$t.log" 2>&1; then
    printf '  %-13s %s, %ss\n' "$t" "$(fuzz_summary "$work/$t.log")" "$(( $(date +%s) - start ))"
  else
    tail -40 "$work/$t.log" >&2
    for a in "$work/$t"-*; do [ -e "$a" ] && { echo "input: $a"; od -c "$a" | head -20; } >&2; done
    echo "fuzz: $t failed" >&2
    failed=$((failed + 1))
  fi
done
((failed == 0)) || { echo "fuzz: $failed target(s) failed" >&2; exit 1; }
echo "fuzz: all targets passed"
