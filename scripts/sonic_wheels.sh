#!/usr/bin/env bash
# SonicMoE (sonic-moe 0.1.2.post1, the bf16 MoE-layer peer of bench/bench_moe.py) carried to the GPU
# machine, which has no network (shared/BENCH.md "Carrying SonicMoE to the GPU machine"). Its wheels are
# never committed: they live in the ignored folder .whl-sonic/ (add `/.whl-sonic/` to the main repo's
# .git/info/exclude), split so that one part fits in a device call beside a ~30 MB build:
#   .whl-sonic/1/  libs wheel part aa (25 MiB) + the five small wheels (4.3 MiB)
#   .whl-sonic/2/  libs wheel part ab (25 MiB)
#   .whl-sonic/3/  libs wheel part ac (20.9 MiB)
# (nvidia_cutlass_dsl_libs_base is 74 MB, more than one call carries beside a build: 64 MiB a call.)
# Parts may arrive in different calls: each is copied into /tmp/sonic-wheels, which survives between
# calls while the machine stays warm (30 s after a call returns: chain the calls).
# One call instead: `pack` installs the six wheels here into a tree laid out as the device's install
# (pip --target for CPython 3.12, manylinux_2_28) and compresses it (xz -9e: the tree's stripped MLIR
# libraries compress to ~55 MB against the wheels' 78 MB), .whl-sonic/one/sonic-tree.tar.xz plus its
# SHA-256. Carried with a build packed without the test binary, it fits one call's 64 MiB; `install`
# (and `auto`) extract it into /tmp/sonic when it is there.
#
#   bash scripts/sonic_wheels.sh prepare   # dev machine (network): download, split, lay out .whl-sonic/
#   bash scripts/sonic_wheels.sh pack      # dev machine, after prepare: .whl-sonic/one/ (one call's carry)
#   bash scripts/sonic_wheels.sh stage     # device: copy whatever .whl-sonic/ holds into /tmp/sonic-wheels
#   bash scripts/sonic_wheels.sh install   # device: stage, then (all parts there) cat + pip --target /tmp/sonic
#   bash scripts/sonic_wheels.sh status    # device: what is staged / installed
#   source scripts/sonic_wheels.sh auto    # device: stage + install when complete + export PYTHONPATH
#                                          # (scripts/device.d/45-moe.sh does this; never fails the caller)
#
# Install: python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/sonic;
# PYTHONPATH gets /tmp/sonic and /tmp/sonic/nvidia_cutlass_dsl/python_packages (the `cutlass` package:
# the wheel's nvidia_cutlass_dsl.pth that points there is not read from a PYTHONPATH folder). --no-deps:
# sonic-moe pins torch <= 2.9.1 and runs on the machine's torch 2.11; the other needs (numpy,
# typing-extensions, einops, packaging, cuda-bindings >= 12.8 for `cuda.bindings.*`) are on the machine.
# Every file is checked against the SHA-256 below. Env: SONIC_WHEELS_SRC (default .whl-sonic),
# SONIC_STAGE (/tmp/sonic-wheels), SONIC_TARGET (/tmp/sonic).

_sonic_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SONIC_WHEELS_SRC=${SONIC_WHEELS_SRC:-$_sonic_root/.whl-sonic}
SONIC_STAGE=${SONIC_STAGE:-/tmp/sonic-wheels}
SONIC_TARGET=${SONIC_TARGET:-/tmp/sonic}
SONIC_PART_SIZE=25M
SONIC_LIBS=nvidia_cutlass_dsl_libs_base-4.4.2-cp312-cp312-manylinux_2_28_x86_64.whl
SONIC_LIBS_SHA=22e37b58f7a6f2f43bba533c4df8a088012122e0b4e9a632eca23937adeafb39
# name, sha256, sub-folder of .whl-sonic (the call that carries it)
SONIC_FILES="
sonic_moe-0.1.2.post1-py3-none-any.whl de103b91c3e5fab09c10b45c989d38b5204ce0fe1e97bec596359b59aed76932 1
quack_kernels-0.4.1-py3-none-any.whl c1c8df2935bf5156ec47d2c5384ac08b411fd0ee702d80ae916dbf6d6f5ae813 1
nvidia_cutlass_dsl-4.4.2-py3-none-any.whl 7cfb9ef19062b055b9372c7a627004724e2755e4c8b16c3cc88807d64501a4ae 1
apache_tvm_ffi-0.1.15.post2-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl 059eed9bfc94bcd41650fb8eefde74040a1bc7e7b1a6f0a8ff897b02b118875b 1
torch_c_dlpack_ext-0.1.5-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl e6f9da4bb9af70e27facc777458be62e10dbbbddda7672d16138db0553c5a524 1
$SONIC_LIBS.part-aa 144a09f0a149963f6a6fe06c8dedf46d6b960ff9c6c40f2ce656e2f90a638a06 1
$SONIC_LIBS.part-ab fef5151533012602d6dceaaeebc51c837a6b56379c2d5d33b1601245dc237c90 2
$SONIC_LIBS.part-ac bab17e0c4bd92a3c4b0e0fa46c8780c87aee9c4419eba241befe45ac9bbbc31c 3
"

_sonic_sha() { sha256sum "$1" 2>/dev/null | cut -d' ' -f1; }

sonic_prepare() {  # dev machine with network; the device README's pip download line, Python 3.12
  local dl; dl=$(mktemp -d) || return 1
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$dl" \
    sonic-moe==0.1.2.post1 quack-kernels==0.4.1 nvidia-cutlass-dsl==4.4.2 nvidia-cutlass-dsl-libs-base==4.4.2 \
    apache-tvm-ffi==0.1.15.post2 torch-c-dlpack-ext==0.1.5 || return 1
  [[ "$(_sonic_sha "$dl/$SONIC_LIBS")" == "$SONIC_LIBS_SHA" ]] || { echo "sha256 mismatch: $SONIC_LIBS"; return 1; }
  (cd "$dl" && split -b "$SONIC_PART_SIZE" -a 2 "$SONIC_LIBS" "$SONIC_LIBS.part-") || return 1
  rm -rf "$SONIC_WHEELS_SRC" && mkdir -p "$SONIC_WHEELS_SRC"/{1,2,3}
  local name sha sub bad=0
  while read -r name sha sub; do
    [[ -n "$name" ]] || continue
    [[ "$(_sonic_sha "$dl/$name")" == "$sha" ]] || { echo "sha256 mismatch: $name"; bad=1; }
    cp "$dl/$name" "$SONIC_WHEELS_SRC/$sub/"
  done <<< "$SONIC_FILES"
  rm -rf "$dl"
  du -b "$SONIC_WHEELS_SRC"/*/* | sed "s|$SONIC_WHEELS_SRC/||"
  du -sh "$SONIC_WHEELS_SRC"/*
  return $bad
}

SONIC_TREE=sonic-tree.tar.xz  # in $SONIC_WHEELS_SRC/one (sonic_pack)

sonic_pack() {  # dev machine: the installed tree of all six wheels as one .tar.xz (needs .whl-sonic/1-3)
  local tmp; tmp=$(mktemp -d) || return 1
  SONIC_STAGE="$tmp/wheels" sonic_stage >/dev/null || { echo "sonic pack: run prepare first"; rm -rf "$tmp"; return 1; }
  cat "$tmp/wheels/$SONIC_LIBS".part-* > "$tmp/wheels/$SONIC_LIBS" && rm "$tmp/wheels/$SONIC_LIBS".part-*
  [[ "$(_sonic_sha "$tmp/wheels/$SONIC_LIBS")" == "$SONIC_LIBS_SHA" ]] || { echo "sonic pack: $SONIC_LIBS sha256"; return 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --only-binary=:all: --ignore-requires-python \
    --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 --target "$tmp/tree" \
    "$tmp/wheels"/*.whl || { echo "sonic pack: pip install failed"; rm -rf "$tmp"; return 1; }
  mkdir -p "$SONIC_WHEELS_SRC/one"
  tar -C "$tmp/tree" -cf - . | xz -T0 -9e > "$SONIC_WHEELS_SRC/one/$SONIC_TREE" || return 1
  (cd "$SONIC_WHEELS_SRC/one" && sha256sum "$SONIC_TREE" > "$SONIC_TREE.sha256")
  rm -rf "$tmp"
  ls -l "$SONIC_WHEELS_SRC/one"
}

sonic_stage() {  # copy (and check) whatever was carried into $SONIC_STAGE; report what is still missing
  mkdir -p "$SONIC_STAGE"
  local name sha sub f missing=() got=()
  while read -r name sha sub; do
    [[ -n "$name" ]] || continue
    if [[ "$(_sonic_sha "$SONIC_STAGE/$name")" != "$sha" ]]; then
      f=$(find "$SONIC_WHEELS_SRC" -name "$name" -type f 2>/dev/null | head -1)
      if [[ -n "$f" && "$(_sonic_sha "$f")" == "$sha" ]]; then
        cp "$f" "$SONIC_STAGE/$name" && got+=("$name")
      elif [[ -n "$f" ]]; then
        echo "sonic wheels: sha256 mismatch in $f (not staged)"
      fi
    fi
    [[ "$(_sonic_sha "$SONIC_STAGE/$name")" == "$sha" ]] || missing+=("$sub:$name")
  done <<< "$SONIC_FILES"
  ((${#got[@]})) && echo "sonic wheels: staged ${got[*]}"
  if ((${#missing[@]})); then
    echo "sonic wheels: still missing in $SONIC_STAGE (carry .whl-sonic/N): ${missing[*]}"
    return 1
  fi
  echo "sonic wheels: all parts staged in $SONIC_STAGE"
}

sonic_installed() { [[ -f "$SONIC_TARGET/.sonic-installed" && -d "$SONIC_TARGET/sonicmoe" ]]; }

sonic_install() {
  if sonic_installed; then echo "sonic wheels: installed in $SONIC_TARGET"; return 0; fi
  local tree="$SONIC_WHEELS_SRC/one/$SONIC_TREE"
  if [[ -f "$tree" ]]; then  # sonic_pack's tree: one call's carry
    if (cd "$SONIC_WHEELS_SRC/one" && sha256sum --quiet -c "$SONIC_TREE.sha256"); then
      mkdir -p "$SONIC_TARGET" && tar -C "$SONIC_TARGET" -xJf "$tree" || { echo "sonic wheels: extract failed"; return 1; }
      touch "$SONIC_TARGET/.sonic-installed"
      echo "sonic wheels: installed in $SONIC_TARGET (from $SONIC_TREE)"
      return 0
    fi
    echo "sonic wheels: $tree: sha256 mismatch (not used)"
  fi
  sonic_stage || return 1
  local whl="$SONIC_STAGE/$SONIC_LIBS"
  if [[ "$(_sonic_sha "$whl")" != "$SONIC_LIBS_SHA" ]]; then
    cat "$SONIC_STAGE/$SONIC_LIBS".part-* > "$whl"
    [[ "$(_sonic_sha "$whl")" == "$SONIC_LIBS_SHA" ]] || { echo "sonic wheels: $SONIC_LIBS: sha256 mismatch after cat"; return 1; }
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SONIC_TARGET" \
    "$SONIC_STAGE"/*.whl || { echo "sonic wheels: pip install failed"; return 1; }
  touch "$SONIC_TARGET/.sonic-installed"
  echo "sonic wheels: installed in $SONIC_TARGET"
}

sonic_env() {  # PYTHONPATH for the installed packages (a no-op when they are not installed); first, so
  # that the DSL's `cutlass` wins over any other `cutlass` (nvidia-cutlass' Python interface) on the path
  sonic_installed || return 1
  case ":${PYTHONPATH:-}:" in *":$SONIC_TARGET:"*) ;; *)
    export PYTHONPATH="$SONIC_TARGET:$SONIC_TARGET/nvidia_cutlass_dsl/python_packages${PYTHONPATH:+:$PYTHONPATH}" ;;
  esac
}

sonic_status() {
  if sonic_installed; then
    sonic_env
    python3 -c 'import sonicmoe, quack, cutlass; print("sonic wheels: sonic-moe", sonicmoe.__version__, "quack",
          quack.__version__, "cutlass-dsl", cutlass.__version__, "import ok")' 2>&1 | tail -1
  else
    sonic_stage | tail -1
    echo "sonic wheels: not installed in $SONIC_TARGET"
  fi
}

sonic_auto() {  # for `source`: stage, install when complete, export PYTHONPATH; never fails
  if ! sonic_installed; then
    if compgen -G "$SONIC_WHEELS_SRC/*" >/dev/null || compgen -G "$SONIC_STAGE/*" >/dev/null; then
      sonic_install || echo "sonic wheels: not installed (the sonic_bf16 rows will say 'sonic-moe not importable')"
    fi
  fi
  sonic_env && echo "sonic wheels: PYTHONPATH has $SONIC_TARGET"
  return 0
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -uo pipefail
  case "${1:-status}" in
    prepare) sonic_prepare ;;
    pack) sonic_pack ;;
    stage) sonic_stage ;;
    install) sonic_install && sonic_status ;;
    status) sonic_status ;;
    *) sed -n '2,32p' "$0"; exit 2 ;;
  esac
else
  case "${1:-auto}" in
    auto) sonic_auto ;;
    env) sonic_env ;;
    *) echo "source scripts/sonic_wheels.sh [auto|env]" ;;
  esac
fi
