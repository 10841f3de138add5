#!/usr/bin/env bash
# Bounded libFuzzer run of the C API harness (tests/fuzz/fuzz_c_api.cpp) under ASan + UBSan, CPU
# build (no CUDA). Installs clang and its libFuzzer runtime when missing, configures build/fuzz,
# builds mxmoe_fuzz, replays the seed corpus and the regression inputs (tests/fuzz/corpus,
# tests/fuzz/regressions), fuzzes for FUZZ_SECONDS (default 60) and fails on any crash, sanitizer
# report, leak, timeout or out-of-memory.
#   FUZZ_SECONDS=600 bash scripts/fuzz.sh     # longer run
#   FUZZ_JOBS=2 bash scripts/fuzz.sh          # N fuzzing processes (libFuzzer -fork=N)
#   MXMOE_FUZZ_SKIP=huge,bigint ...           # leave input classes out (see the harness header)
# Crash inputs land in build/fuzz/run/artifacts/; reproduce one with
#   MXMOE_FUZZ_VERBOSE=1 build/fuzz/tests/fuzz/mxmoe_fuzz build/fuzz/run/artifacts/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-60}
fuzz_jobs=${FUZZ_JOBS:-1}
jobs=$(nproc)

# clang + libFuzzer (Debian: libclang_rt.fuzzer and <fuzzer/FuzzedDataProvider.h> come with
# libclang-rt-<major>-dev, only a recommendation of clang).
fuzzer_rt() {
  local dir
  dir=$(clang++ -print-runtime-dir 2>/dev/null) || return 1
  [[ -f $dir/libclang_rt.fuzzer-$(uname -m).a ]]
}
if ! command -v clang++ >/dev/null || ! fuzzer_rt; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  command -v clang++ >/dev/null || { echo "fuzz: installing clang"; apt-get install -y -qq clang >/dev/null; }
  if ! fuzzer_rt; then
    major=$(clang++ -dumpversion | cut -d. -f1)
    echo "fuzz: installing libclang-rt-$major-dev (libFuzzer runtime)"
    apt-get install -y -qq "libclang-rt-$major-dev" >/dev/null
  fi
fi
command -v cmake >/dev/null && command -v ninja >/dev/null || bash scripts/setup.sh

cmake -S . -B build/fuzz -G Ninja -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DMXMOE_CUDA=OFF \
  -DMXMOE_BUILD_TESTS=OFF -DMXMOE_FUZZ=ON -DMXMOE_TORCH_OPS=OFF >/dev/null
ninja -C build/fuzz -j"$jobs" mxmoe_fuzz

run=build/fuzz/run
mkdir -p "$run/corpus" "$run/artifacts"
log=$run/fuzz.log
# New corpus entries go to the first directory (build/fuzz/run/corpus, kept between runs); the
# seeds and the regression inputs are only read.
dirs=("$run/corpus" tests/fuzz/corpus)
if compgen -G "tests/fuzz/regressions/*" >/dev/null; then dirs+=(tests/fuzz/regressions); fi
args=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
      -artifact_prefix="$run/artifacts/")
((fuzz_jobs > 1)) && args+=(-fork="$fuzz_jobs")

echo "fuzz: mxmoe_fuzz for ${secs}s ($fuzz_jobs process(es)), log $log"
touch "$log.start"
t0=$SECONDS
set +e
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
  build/fuzz/tests/fuzz/mxmoe_fuzz "${args[@]}" "${dirs[@]}" >"$log" 2>&1
rc=$?
set -e

# Final stats: "Done N runs in S second(s)" (one process), else the last "#N: ... time: Ss" (fork).
calls=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
took=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\2/p' "$log" | tail -1)
if [[ -z $calls ]]; then
  last=$(grep -E '^#[0-9]+: ' "$log" | tail -1 || true)
  calls=$(sed -n 's/^#\([0-9]*\): .*/\1/p' <<<"$last")
  took=$(sed -n 's/.* time: \([0-9]*\)s.*/\1/p' <<<"$last")
fi
# A run stopped by a crash prints neither: its final stats and the wall time then.
[[ -n $calls ]] || calls=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
[[ -n $took ]] || took=$((SECONDS - t0))
crashes=$(find "$run/artifacts" -newer "$log.start" -type f 2>/dev/null | wc -l || true)
reports=$(grep -cE '^==[0-9]+==ERROR|runtime error:|^SUMMARY: |==mxmoe_fuzz== CHECK FAILED|ERROR: libFuzzer|LeakSanitizer' "$log" || true)
n_bad=$((crashes > reports ? crashes : reports))
if [[ $rc -ne 0 || $n_bad -ne 0 ]]; then
  echo "fuzz: FAILED (exit $rc, ${calls:-?} calls in ${took:-?} s); the report:"
  grep -E -A40 '==mxmoe_fuzz== CHECK FAILED|^==[0-9]+==ERROR|runtime error:|ERROR: libFuzzer|LeakSanitizer' "$log" | head -80
  echo "fuzz: crash inputs of this run:"
  for a in $(find "$run/artifacts" -newer "$log.start" -type f | head -20); do
    same=""
    for r in tests/fuzz/regressions/*; do [[ -f $r ]] && cmp -s "$a" "$r" && same=" (= $r)"; done
    echo "  $a$same"
  done
  exit 1
fi
echo "fuzz: ${calls:-?} calls in ${took:-?} s, 0 crashes"
