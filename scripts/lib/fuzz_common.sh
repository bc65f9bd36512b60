# Sourced by scripts/lib/fuzz_smoke.sh and scripts/fuzz: the fuzz build and the targets.
# The fuzz build is Clang's (libFuzzer); Debian bookworm's clang-14 cannot compile idem (its
# std::expected needs Clang 19's concepts with GCC 12's libstdc++), so it is clang-19.

fuzz_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
fuzz_build_dir=${IDEM_FUZZ_BUILD:-$fuzz_root/build/fuzz}

# Target: its dictionary (fuzz/*.dict) or "-" for none, and its largest input.
declare -A fuzz_dict=(
  [key]=- [tenant]=- [jcs]=json [form]=- [json_pointer]=json [config]=toml
  [redis_record]=- [journal]=- [request_head]=http [http_path]=http [h2]=-
)
declare -A fuzz_max_len=(
  [key]=700 [tenant]=1500 [jcs]=4096 [form]=2048 [json_pointer]=4096 [config]=4096
  [redis_record]=2048 [journal]=2048 [request_head]=4096 [http_path]=8192 [h2]=4096
)
fuzz_targets=(key tenant jcs form json_pointer config redis_record journal request_head http_path h2)

# shellcheck source=scripts/lib/build.sh
source "$fuzz_root/scripts/lib/build.sh"

# Configures and builds every target (incremental); the compiler's output goes to
# build/logs/fuzz.log (quiet_build: a warning fails it).
fuzz_build() {
  export CCACHE_BASEDIR=$fuzz_root CCACHE_NOHASHDIR=1
  # -O1 and line tables: what libFuzzer recommends, and half the compile time of -O2 -g.
  cmake -S "$fuzz_root" -B "$fuzz_build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Fuzz \
    -DCMAKE_CXX_FLAGS_FUZZ="-O1 -gline-tables-only" \
    -DCMAKE_CXX_COMPILER=clang++-19 -DIDEM_FUZZ=ON \
    -DIDEM_BUILD_TESTS=OFF -DIDEM_BUILD_BENCHMARKS=OFF -DIDEM_BUILD_EXAMPLES=OFF \
    -DIDEM_BUILD_GATEWAY=ON -DIDEM_GATEWAY_JEMALLOC=OFF >/dev/null
  quiet_build "$fuzz_root/build/logs/fuzz.log" "fuzz targets (build/fuzz)" -- \
    cmake --build "$fuzz_build_dir" -j"${IDEM_TEST_JOBS:-2}" --target idem_fuzz
}

# fuzz_args TARGET: libFuzzer flags shared by both scripts.
fuzz_args() {
  local t=$1 args=(-max_len="${fuzz_max_len[$t]}" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1)
  [ "${fuzz_dict[$t]}" != - ] && args+=(-dict="$fuzz_root/fuzz/${fuzz_dict[$t]}.dict")
  printf '%s\n' "${args[@]}"
}

# fuzz_summary LOG: "runs R, edges E, features F" from libFuzzer's output.
fuzz_summary() {
  local runs cov ft
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$1" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$1" | tail -1 | cut -d' ' -f2)
  ft=$(grep -o 'ft: [0-9]*' "$1" | tail -1 | cut -d' ' -f2)
  echo "runs ${runs:-?}, edges ${cov:-?}, features ${ft:-?}"
}
