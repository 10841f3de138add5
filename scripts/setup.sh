#!/usr/bin/env bash
# Prepares a fresh machine for mxmoe (idempotent; quick when everything is already there):
#   - system packages: a C++17 compiler, CMake, Ninja, GoogleTest;
#   - a virtual environment .venv with torch 2.13 (CPU wheel on this kind of machine; pinned so
#     pip never pulls a multi-GB CUDA build), the build/test dependencies and mxmoe itself.
# nvcc is optional: when present, the C++ build also compiles the CUDA kernels (sm_90a, sm_100a).
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v cmake >/dev/null || need_apt+=(cmake)
command -v ninja >/dev/null || need_apt+=(ninja-build)
command -v g++ >/dev/null || need_apt+=(g++)
[[ -f /usr/include/gtest/gtest.h ]] || need_apt+=(libgtest-dev)
if ((${#need_apt[@]})); then
  echo "setup: installing ${need_apt[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi

if [[ ! -x .venv/bin/python ]]; then
  echo "setup: creating .venv"
  python3 -m venv .venv
fi
PY=.venv/bin/python
# transformers: the integration tests (tiny random-init Qwen3-MoE / Mixtral / OLMoE / DeepSeek-V3 /
# gpt-oss configs) and `train --model hf-qwen3`; 5.17 is the release on the GPU machine.
# torchtitan 0.3.0: the integration tests build its models (its MoE and model code import spmd_types,
# tyro and triton; the trainer's data, checkpoint and logging dependencies are left out: --no-deps).
# torchao 0.18: its wheel carries the TorchTitan reference MoE the GPU tests convert.
stamp=.venv/.mxmoe-deps-v3
if [[ ! -f $stamp ]]; then
  echo "setup: installing Python dependencies (torch 2.13 CPU, transformers, torchtitan, build and test tools)"
  $PY -m pip install -q --upgrade pip >/dev/null
  $PY -m pip install -q "torch==2.13.0" "scikit-build-core>=0.10" "cmake>=3.24" ninja pytest numpy matplotlib tqdm \
    "nvidia-cutlass==4.2.0.0" "transformers==5.17.0" "tyro==1.0.17" "triton==3.9.0"
  $PY -m pip install -q --no-deps "torchtitan==0.3.0" "spmd_types==0.2.3" "torchao==0.18.0"
  rm -f .venv/.mxmoe-deps-v1 .venv/.mxmoe-deps-v2
  touch $stamp
fi
# The Python package: CPU build of libmxmoe (the CUDA kernels are compiled by the C++ build in
# scripts/test.sh; a GPU machine installs with MXMOE_CUDA=ON). Reinstalled when sources change.
# The hash covers the tree as it is: tracked and new (not ignored) files, without deleted ones.
src_files=$(git ls-files --cached --others --exclude-standard src include python 2>/dev/null \
  || find src include python -type f)
src_hash=$(for f in CMakeLists.txt pyproject.toml $src_files; do if [[ -f $f ]]; then cat "$f"; fi; done \
  | sha1sum | cut -c1-16)
if [[ ! -f .venv/.mxmoe-src-$src_hash ]]; then
  echo "setup: building and installing mxmoe"
  rm -f .venv/.mxmoe-src-*
  $PY -m pip install -q --no-build-isolation --no-deps -C cmake.define.MXMOE_CUDA="${MXMOE_CUDA:-OFF}" \
    -C build-dir=build/py . >/dev/null
  touch .venv/.mxmoe-src-$src_hash
fi
