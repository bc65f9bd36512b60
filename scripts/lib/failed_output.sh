#!/usr/bin/env bash
# Prints the end of each failed test's output from a ctest tree's last run, so that the last lines
# of a scripts/test run say why a test failed even where only its tail is kept (CI's summary).
#   bash scripts/lib/failed_output.sh BUILD_DIR [LINES]
set -uo pipefail
dir=$1 lines=${2:-60}
log=$dir/Testing/Temporary/LastTest.log
[ -f "$log" ] || exit 0
# A test's block: "N/M Test: NAME", its output up to "<end of output>", "Test time = ...", then a
# line of dashes and its result ("Test Passed." or why not).
awk -v lines="$lines" -v tree="$(basename "$dir")" '
  function flush(result,   i, from) {
    printf "\n==> the end of %s (%s): %s\n", name, tree, result
    from = n - lines + 1; if (from < 1) from = 1
    for (i = from; i <= n; i++) print buf[i]
  }
  /^[0-9]+\/[0-9]+ Test: / { name = $NF; n = 0; inside = 1; done = 0; next }
  inside && /^<end of output>$/ { inside = 0; done = 1; next }
  inside { buf[++n] = $0; next }
  done && /^Test time = / { next }
  done && /^-+$/ { next }
  done { if ($0 != "Test Passed.") flush($0); done = 0 }
' "$log"
