# What idemctl's shell tests share. Sourced by each test after it has set $idemctl (the binary)
# and $tmp (its scratch directory); each command leaves $tmp/out, $tmp/err and $rc.
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# run ARGS... : runs idemctl with no input.
run() {
  "$idemctl" "$@" </dev/null >"$tmp/out" 2>"$tmp/err"
  rc=$?
}

# expect_error NAME CODE [STDERR_LINE]: exit CODE, nothing on stdout, stderr says why (exactly
# STDERR_LINE when given).
expect_error() {
  local name=$1 code=$2
  [ "$rc" -eq "$code" ] || fail "$name: exit $rc, want $code (stderr: $(cat "$tmp/err"))"
  [ ! -s "$tmp/out" ] || fail "$name: unexpected stdout: $(cat "$tmp/out")"
  [ -s "$tmp/err" ] || fail "$name: nothing on stderr"
  if [ $# -ge 3 ]; then
    printf '%s\n' "$3" >"$tmp/want"
    cmp -s "$tmp/err" "$tmp/want" || fail "$name: stderr '$(cat "$tmp/err")', want '$3'"
  fi
}

# out_has NAME TEXT: stdout contains TEXT.
out_has() { grep -qF -- "$2" "$tmp/out" || fail "$1: stdout lacks '$2': $(cat "$tmp/out")"; }

# json NAME PYTHON_EXPR: the expression, with `j` the JSON on stdout, is true.
json() {
  python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if eval(sys.argv[2]) else 1)' \
    "$tmp/out" "$2" 2>"$tmp/pyerr" || fail "$1: not ($2): $(cat "$tmp/out") $(cat "$tmp/pyerr")"
}

# finish WHAT: the verdict, and the exit code.
finish() {
  if [ "$failures" -ne 0 ]; then
    echo "$failures check(s) failed" >&2
    exit 1
  fi
  echo "$1: all checks passed"
}
