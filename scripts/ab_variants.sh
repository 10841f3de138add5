#!/usr/bin/env bash
# Same-run A/B of kernel variants on the MoE layer (docs/development.md, "Kernel variants"): several
# builds of libmxmoe.so, each timed on the same layer step in alternating repetitions, with the step's
# largest kernels, so a kernel change is judged against the library it replaces in one warm run.
#
#   Here (after building a variant into BUILD, default build-cuda):
#     bash scripts/ab_variants.sh save NAME [BUILD]     # BUILD/src/core/libmxmoe.so -> .carry/var/NAME (xz, ~7 MB)
#   On the GPU machine (carrying .carry: the packed build of device_run.sh --pack and the variants):
#     MXMOE_BUILD=$PWD/.carry/build bash scripts/ab_variants.sh run NAME...
#
# run: for each variant, the GoogleTest filter MXMOE_AB_GTEST against its library (default: the tile128
# GEMM tests, the fused variants among them; "none" skips them; MXMOE_AB_GTEST_TIMEOUT seconds, default
# 90), so no variant is timed unchecked: one that fails or hangs is dropped from the rounds,
# then MXMOE_AB_REPS rounds (default 2) over all variants of `python -m mxmoe bench --moe` with
# MXMOE_AB_ARGS (default: Qwen3-30B-A3B, 16K tokens, mxmoe_tile128, eager, with the per-kernel
# profile): per variant the fwd+bwd and fwd times and the 9 largest kernels (us / calls). The rows and
# logs come back as $OUT/ab.tgz.
set -uo pipefail
cd "$(dirname "$0")/.."
cmd=${1:-}
shift || true
case "$cmd" in
  save)
    name=${1:?variant name}
    build=${2:-build-cuda}
    [[ -f "$build/src/core/libmxmoe.so" ]] || { echo "ab_variants: $build/src/core/libmxmoe.so missing"; exit 1; }
    mkdir -p ".carry/var/$name"
    xz -T0 -6 -c "$build/src/core/libmxmoe.so" >".carry/var/$name/libmxmoe.so.xz"
    du -sh .carry
    ;;
  run)
    [[ $# -gt 0 ]] || { echo "ab_variants run: name at least one variant"; exit 1; }
    export MXMOE_BUILD=${MXMOE_BUILD:-$PWD/.carry/build}
    export OUT=${OUT:-$PWD/out/device}
    mkdir -p "$OUT"
    for f in src/core/libmxmoe.so src/ops/libmxmoe_torch.so tests/cpp/mxmoe_tests; do
      [[ -f "$MXMOE_BUILD/$f.xz" && ! -f "$MXMOE_BUILD/$f" ]] && xz -dk "$MXMOE_BUILD/$f.xz"
    done
    export MXMOE_OPS_LIBRARY=$MXMOE_BUILD/src/ops/libmxmoe_torch.so PYTHONPATH=$PWD/python:${PYTHONPATH:-}
    for v in "$@"; do
      [[ -f ".carry/var/$v/libmxmoe.so" ]] || xz -dk ".carry/var/$v/libmxmoe.so.xz" || exit 1
    done
    gtest=${MXMOE_AB_GTEST:-CudaGemmTile128.*}
    if [[ "$gtest" != none ]]; then
      # A variant whose tests fail or hang (a kernel deadlock would otherwise hold every bench
      # round until its timeout) is dropped from the timed rounds.
      passed=()
      for v in "$@"; do
        log="$OUT/ab-gtest-$v.log"
        LD_LIBRARY_PATH=$PWD/.carry/var/$v timeout "${MXMOE_AB_GTEST_TIMEOUT:-90}" \
          "$MXMOE_BUILD/tests/cpp/mxmoe_tests" --gtest_filter="$gtest" >"$log" 2>&1
        rc=$?
        echo "== gtest $v: rc $rc $(grep -E '^\[  (PASSED|FAILED)' "$log" | tr '\n' ' ')"
        if [[ $rc -eq 0 ]]; then passed+=("$v"); else echo "== $v dropped (rc $rc; 124: timed out)"; fi
      done
      [[ ${#passed[@]} -gt 0 ]] || { echo "ab_variants: no variant passed its tests"; exit 1; }
      set -- "${passed[@]}"
    fi
    args=${MXMOE_AB_ARGS:---moe-configs qwen3-30b-a3b --moe-tokens 16384 --moe-impls mxmoe_tile128 --moe-modes eager --moe-profile}
    for rep in $(seq 1 "${MXMOE_AB_REPS:-2}"); do
      for v in "$@"; do
        lib=$PWD/.carry/var/$v
        # shellcheck disable=SC2086
        MXMOE_LIBRARY=$lib/libmxmoe.so LD_LIBRARY_PATH=$lib timeout 240 python3 -m mxmoe bench --moe $args \
          --out "$OUT/ab-$v-$rep.json" >"$OUT/ab-$v-$rep.log" 2>&1 || echo "$v rep $rep: bench exit $?"
        python3 - "$OUT/ab-$v-$rep.json" "$v" "$rep" <<'PY'
import json, re, sys
path, name, rep = sys.argv[1:]
try:
    d = json.load(open(path))
except (OSError, ValueError) as e:
    sys.exit(f"{name} rep {rep}: no result ({e})")
for r in d.get("rows", []):
    if r.get("fwd_bwd_us") and r.get("impl", "").startswith("mxmoe"):
        print(f"{name} rep {rep}: {r['config']} T={r['tokens']} {r['impl']} {r['mode']}: "
              f"fwd+bwd {r['fwd_bwd_us']:.0f} us, fwd {r.get('fwd_us') or 0:.0f} us")
for b in d.get("breakdown", []):
    if str(b.get("impl", "")).startswith("mxmoe"):
        short = lambda n: re.sub(r"mxmoe::|cuda::|gemm::|sm90::|\(anonymous namespace\)::|void ", "", n)[:44]
        print("   " + " | ".join(f"{short(k['kernel'])} {k['us']:.0f}/{k['calls']}" for k in b.get("top", [])[:9]))
PY
      done
    done
    (cd "$OUT" && tar -czf ab.tgz ab-*.json ab-*.log 2>/dev/null && rm -f ab-*.json ab-*.log)
    ;;
  *)
    echo "usage: ab_variants.sh save NAME [BUILD] | run NAME..."
    exit 1
    ;;
esac
