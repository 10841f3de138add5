#!/usr/bin/env bash
# The one script for the GPU machine (device tool): builds the CUDA library and tests unless a
# carried build is present, runs the GPU tests and the benchmarks, and prints short tables last.
#
#   On the dev machine (nvcc 13.0 is there):  bash scripts/device_run.sh --build-only
#   Then on the device, carrying build-cuda:  bash scripts/device_run.sh [STEP ...]
#   Or pack the build first (--pack: .carry/build, ~10 MB with the large files xz-compressed, which
#   leaves room in a call's 64 MiB for wheels) and on the device, carrying .carry:
#     MXMOE_BUILD=$PWD/.carry/build bash scripts/device_run.sh [STEP ...]
#
# Steps are scripts/device.d/NN-name.sh, run in order (all when none is named); each gets
# MXMOE_BUILD (the build dir), MXMOE_LIBRARY (libmxmoe.so), MXMOE_OPS_LIBRARY (libmxmoe_torch.so,
# the op layer the Python package loads), OUT (results folder) in its env.
# Results (logs, JSON) go under $OUT when the device tool sets it, else ./out/device; when there are
# more than the 8 files the device tool returns, they come back as $OUT/results.tgz + tables.txt
# (a log the caller redirects into $OUT is packed too: read it from the archive).
set -uo pipefail
cd "$(dirname "$0")/.."
export MXMOE_BUILD=${MXMOE_BUILD:-$PWD/build-cuda}
export OUT=${OUT:-$PWD/out/device}
mkdir -p "$OUT"

build() {
  # MXMOE_PYTHON: the interpreter with torch (op library headers) and nvidia-cutlass (tile128 GEMMs);
  # on the dev machine that is .venv/bin/python (scripts/setup.sh makes it).
  local py=${MXMOE_PYTHON:-$([[ -x .venv/bin/python ]] && echo "$PWD/.venv/bin/python" || command -v python3)}
  cmake -S . -B "$MXMOE_BUILD" -G Ninja -DMXMOE_CUDA=ON -DMXMOE_TORCH_OPS=ON -DMXMOE_BUILD_TESTS=ON \
    -DMXMOE_PYTHON="$py" >"$OUT/cmake.log" 2>&1 \
    && ninja -C "$MXMOE_BUILD" -j"$(nproc)" >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
}

if [[ "${1:-}" == "--build-only" ]]; then build; echo "built $MXMOE_BUILD"; exit 0; fi
# The three files the steps use (libraries and the GoogleTest binary), the large two compressed.
packed=(src/core/libmxmoe.so src/ops/libmxmoe_torch.so tests/cpp/mxmoe_tests)
if [[ "${1:-}" == "--pack" ]]; then
  rm -rf .carry/build
  for f in "${packed[@]}"; do
    [[ -f "$MXMOE_BUILD/$f" ]] || { echo "--pack: $MXMOE_BUILD/$f missing (build first)"; exit 1; }
    mkdir -p ".carry/build/$(dirname "$f")" && cp "$MXMOE_BUILD/$f" ".carry/build/$f"
    [[ $f == src/ops/* ]] || xz -T0 -6 ".carry/build/$f"
  done
  du -sh .carry/build; echo "carry .carry; on the device: MXMOE_BUILD=\$PWD/.carry/build bash scripts/device_run.sh [STEP ...]"
  exit 0
fi
for f in "${packed[@]}"; do  # a build packed by --pack
  [[ -f "$MXMOE_BUILD/$f.xz" && ! -f "$MXMOE_BUILD/$f" ]] && xz -dk "$MXMOE_BUILD/$f.xz"
done
[[ -f "$MXMOE_BUILD/src/ops/libmxmoe_torch.so" ]] || build
export MXMOE_LIBRARY="$MXMOE_BUILD/src/core/libmxmoe.so"
export MXMOE_OPS_LIBRARY="$MXMOE_BUILD/src/ops/libmxmoe_torch.so"
export LD_LIBRARY_PATH="$MXMOE_BUILD/src/core:${LD_LIBRARY_PATH:-}"
export PYTHONPATH="$PWD/python:${PYTHONPATH:-}"
# Python packages the GPU machine lacks (torchtitan, torchao, ...) travel as wheels in .whl (carried).
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
export PYTHONUNBUFFERED=1

{ nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,driver_version --format=csv,noheader
  python3 -c 'import torch; print("torch", torch.__version__)'
  # The device's copy of the tree can carry the landed commit's git metadata: MXMOE_COMMIT names the tree.
  echo "commit $(python3 bench/bench_meta.py) (MXMOE_COMMIT ${MXMOE_COMMIT:-unset}; +dirty: the tree is not its .git's HEAD)"
  date -u; } \
  | tee "$OUT/device.txt"

status=0
steps=("$@")
[[ ${#steps[@]} -eq 0 ]] && steps=(scripts/device.d/*.sh)
for step in "${steps[@]}"; do
  [[ -f "$step" ]] || step=$(ls scripts/device.d/*"$step"*.sh 2>/dev/null | head -1)
  echo "=== $step"
  bash "$step" || { echo "FAILED: $step"; status=1; }
done
# BENCHMARKS.md regenerated from this run's result rows over the committed ones (bench/results): copy
# the run's JSON files into bench/results and this file over BENCHMARKS.md to land them.
results=$(mktemp -d) && cp bench/results/*.json "$results"/ 2>/dev/null
cp "$OUT"/*.json "$results"/ 2>/dev/null
python3 bench/tables.py benchmarks "$results" --out "$OUT/BENCHMARKS.md" >/dev/null 2>&1 || echo "BENCHMARKS.md: not regenerated"
# Short tables last (each step writes $OUT/table-*.txt).
for t in "$OUT"/table-*.txt; do [[ -f "$t" ]] && { echo; cat "$t"; }; done
# The device tool brings back at most 8 files from $OUT (two folders deep): with more, everything
# travels in one archive, results.tgz, beside tables.txt (the short tables above).
if (( $(find "$OUT" -type f | wc -l) > 8 )); then
  tgz=$(mktemp /tmp/mxmoe-results.XXXXXX.tgz) && chmod 644 "$tgz"
  if tar -C "$OUT" -czf "$tgz" .; then
    cat "$OUT"/table-*.txt > "$tgz.tables" 2>/dev/null
    find "$OUT" -mindepth 1 -delete
    mv "$tgz" "$OUT/results.tgz"
    mv "$tgz.tables" "$OUT/tables.txt" 2>/dev/null
    echo "results: $OUT/results.tgz (tar -xzf; $OUT held more than the 8 files the device tool returns)"
  fi
fi
exit $status
