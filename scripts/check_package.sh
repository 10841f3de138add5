#!/usr/bin/env bash
# Packaging check (run by scripts/test.sh, so by CI): `pip install .` into a fresh virtual
# environment, with pip's build isolation (the build requirements of pyproject.toml, nothing from
# .venv), must build and package every kernel this machine can build: the op layer always, and with
# nvcc present the CUDA kernels including the Hopper tile128 GEMMs (CUTLASS from the nvidia-cutlass
# build requirement). The installed package is then imported from outside the source tree and its
# build_info() checked; one op runs on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/pkg-venv
rm -rf "$venv"
python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
# Runtime needs first (torch 2.13 CPU: the pinned wheel on this kind of machine), then mxmoe itself.
"$venv/bin/python" -m pip install -q "torch==2.13.0" numpy >/dev/null
expect_cuda=0
command -v nvcc >/dev/null && expect_cuda=1
echo "check_package: pip install . (fresh venv, build isolation; nvcc present: $expect_cuda)"
SECONDS=0
"$venv/bin/python" -m pip install -q --no-deps -C build-dir=build/pkg . >build/pkg-install.log 2>&1 \
  || { tail -40 build/pkg-install.log; echo "check_package: FAILED (pip install .)"; exit 1; }
echo "check_package: built and installed in ${SECONDS}s"
cd /tmp
MXMOE_EXPECT_CUDA=$expect_cuda "$OLDPWD/$venv/bin/python" - <<'PY'
import os, sys
import torch
import mxmoe

info = mxmoe.build_info()
print("check_package: build_info", info)
assert "site-packages" in mxmoe.__file__ and "site-packages" in info["library"], (mxmoe.__file__, info["library"])
assert info["torch_abi"] == "stable", info
if os.environ["MXMOE_EXPECT_CUDA"] == "1":
    assert info["cuda"], "nvcc is on PATH but the installed mxmoe has no CUDA kernels"
    assert info["tile128_gemm"], "nvcc is on PATH but the installed mxmoe lacks the tile128 GEMMs"
    assert "90a" in info["cuda_archs"], info["cuda_archs"]
q, _, s, _ = mxmoe.ops.quantize(torch.randn(64, 64), None, 1, 32, 0, True, False, True, False)
assert q.dtype == torch.float8_e4m3fn and s.shape == (64, 2)
print("check_package: PASS")
PY
