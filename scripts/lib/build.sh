# shellcheck shell=bash
# Sourced by scripts/run, scripts/test and the scripts/lib steps that build a tree: a build that
# says how far it is in a few lines and keeps the compiler's output in a log file.
#
#   quiet_build LOG LABEL -- COMMAND...
#
# Runs COMMAND (a `cmake --build ...`), writing everything it prints to LOG. On a terminal one
# line is redrawn ("building LABEL: n/N, Ts"); otherwise a line is printed at every tenth of the
# way. Returns 1 when COMMAND fails (after the errors and the log's name) and 2 when it built but
# the compiler or the linker warned: the build is warning-free, so a new warning is a defect
# (docs/verification.md, "Builds"). IDEM_ALLOW_WARNINGS=1 (scripts/run) only counts them.

quiet_build() {
  local log=$1 label=$2
  shift 3  # LOG LABEL --
  mkdir -p "$(dirname "$log")"
  : >"$log"
  local start=$SECONDS status=0 tty=0 line step total last_tenth=-1 tenth
  [ -t 1 ] && tty=1
  # NINJA_STATUS: the "[n/N] " prefix ninja puts before each step (its default, made explicit).
  while IFS= read -r line; do
    printf '%s\n' "$line" >>"$log"
    [[ $line =~ ^\[([0-9]+)/([0-9]+)\]\  ]] || continue
    step=${BASH_REMATCH[1]} total=${BASH_REMATCH[2]}
    if ((tty)); then
      printf '\r  building %s: %d/%d, %ds ' "$label" "$step" "$total" $((SECONDS - start))
    else
      tenth=$((step * 10 / total))
      if ((tenth != last_tenth)); then
        printf '  building %s: %d/%d, %ds\n' "$label" "$step" "$total" $((SECONDS - start))
        last_tenth=$tenth
      fi
    fi
  done < <(NINJA_STATUS='[%f/%t] ' "$@" 2>&1; echo "quiet_build-exit $?")
  ((tty)) && printf '\n'
  status=$(sed -n 's/^quiet_build-exit //p' "$log" | tail -1)
  sed -i '/^quiet_build-exit /d' "$log"
  if [ "${status:-1}" != 0 ]; then
    echo "build of $label failed after $((SECONDS - start))s; the errors:" >&2
    grep -E -A3 'error:|Error [0-9]+|FAILED:' "$log" | head -60 >&2 || tail -40 "$log" >&2
    echo "the full build log: $log" >&2
    return 1
  fi
  local warnings
  warnings=$(grep -c -E '(^|[: ])warning:' "$log" || true)
  if [ "$warnings" != 0 ]; then
    if [ "${IDEM_ALLOW_WARNINGS:-0}" = 1 ]; then
      echo "  build of $label: $warnings compiler warning line(s), in $log" >&2
    else
      grep -E -B2 -A6 '(^|[: ])warning:' "$log" | head -80 >&2
      echo "build of $label: $warnings warning line(s); the full build log: $log" >&2
      echo "the build must be warning-free: fix the cause (docs/verification.md, \"Builds\")" >&2
      return 2
    fi
  fi
  echo "  built $label in $((SECONDS - start))s (log: $log)"
}
