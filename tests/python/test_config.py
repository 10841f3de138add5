"""Kernel configurations from Python: mxmoe.sm90_gemm_config (the Hopper tile128 GEMM configuration of a
shape; pure host logic, so it answers without a GPU), the MXMOE_* environment (read once per process,
invalid values an error) and MXMOE_PRINT_CONFIGS. Environment cases run in a subprocess."""
import os
import subprocess
import sys

import pytest
import torch

import mxmoe

OWN_LONG_K = ("gemm sm90 pass=fwd/dgrad m=16640 n=8192 k=5120 g=4 out=bf16 -> impl=own block_n=128 stages=6 lean "
              "producer=warp cluster=2 fallback=cutlass")


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MXMOE_") or k == "MXMOE_OPS_LIBRARY"}
    env.update(extra)
    return env


def _run(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env=_clean_env(**env))


@pytest.mark.skipif(any(k.startswith(("MXMOE_GEMM_", "MXMOE_TILE128_")) for k in os.environ),
                    reason="the GEMM knobs are set in this environment")
def test_sm90_gemm_config_follows_the_heuristics():
    assert mxmoe.sm90_gemm_config("forward", 16640, 8192, 5120, 4) == OWN_LONG_K
    short_k = mxmoe.sm90_gemm_config("dgrad", 131072, 768, 2048, 128, torch.float32)
    assert "out=f32 -> impl=own block_n=128 stages=4 producer=thread cluster=1" in short_k, short_k
    assert "impl=own" in mxmoe.sm90_gemm_config("wgrad", 32768, 1536, 1024, 16)
    qwen3 = mxmoe.sm90_gemm_config("wgrad", 131072, 1536, 2048, 128)  # ~1K-token groups: own, CTA pairs
    assert "impl=own" in qwen3 and "cluster=2" in qwen3, qwen3
    cutlass = mxmoe.sm90_gemm_config("wgrad", 16384, 4096, 2048, 2)
    assert cutlass.endswith("-> impl=cutlass block_n=128 stages=auto cluster=2 raster=m swizzle=1"), cutlass


def test_sm90_gemm_config_rejects_bad_arguments():
    with pytest.raises(ValueError, match="pass_: expected one of"):
        mxmoe.sm90_gemm_config("fwd", 1, 1, 1, 1)
    with pytest.raises(ValueError, match="out_dtype"):
        mxmoe.sm90_gemm_config("forward", 1, 1, 1, 1, torch.float16)
    with pytest.raises(ValueError, match="non-negative"):
        mxmoe.sm90_gemm_config("forward", -1, 1, 1, 1)


def test_environment_overrides_apply_in_the_config():
    code = "import mxmoe; print(mxmoe.sm90_gemm_config('forward', 16640, 8192, 5120, 4))"
    res = _run(code)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == OWN_LONG_K
    res = _run(code, MXMOE_GEMM_CLUSTER="1", MXMOE_GEMM_PRODUCER="thread")
    assert res.returncode == 0, res.stderr
    assert "producer=thread cluster=1" in res.stdout, res.stdout
    res = _run(code, MXMOE_GEMM_SM90="cutlass", MXMOE_TILE128_RASTER="n", MXMOE_TILE128_SWIZZLE="4")
    assert res.returncode == 0, res.stderr
    assert "impl=cutlass" in res.stdout and "raster=n swizzle=4" in res.stdout, res.stdout


def test_invalid_environment_values_are_errors():
    res = _run("import mxmoe; mxmoe.sm90_gemm_config('forward', 16640, 8192, 5120, 4)", MXMOE_GEMM_CLUSTER="3")
    assert res.returncode != 0
    assert "ValueError" in res.stderr and 'MXMOE_GEMM_CLUSTER="3" is invalid: expected one of 1, 2, 4' in res.stderr, \
        res.stderr
    # CPU kernels read the environment too (MXMOE_NUM_THREADS): an invalid value fails them as well.
    quantize = "import torch, mxmoe; mxmoe.quantize(torch.ones(4, 64), dim=-1)"
    res = _run(quantize, MXMOE_PRINT_CONFIGS="yes")
    assert res.returncode != 0 and 'MXMOE_PRINT_CONFIGS="yes"' in res.stderr, res.stderr
    res = _run(quantize, MXMOE_PRINT_CONFIGS="1", MXMOE_NUM_THREADS="2")
    assert res.returncode == 0, res.stderr


PRINT_SCRIPT = """
import torch, mxmoe
from mxmoe import ops
M, N, K, G = 512, 256, 512, 2
a = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn)
b = torch.randn(G, N, K, device="cuda").to(torch.float8_e4m3fn)
s = lambda *shape: torch.full(shape, 127, dtype=torch.uint8, device="cuda").view(torch.float8_e8m0fnu)
offs = torch.tensor([300, 512], dtype=torch.int32, device="cuda")
for _ in range(3):
    ops.grouped_mm_tile128(a, s(M, K // 32), b, s(G, N, K // 32), offs, None, torch.bfloat16)
    ops.quantize(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), None, 1, 32, 0, True, False, True, False)
torch.cuda.synchronize()
print(mxmoe.sm90_gemm_config("forward", M, N, K, G))
"""


@pytest.mark.gpu
def test_print_configs_prints_each_launch_config_once():
    if torch.cuda.get_device_capability() != (9, 0) or not mxmoe.build_info()["tile128_gemm"]:
        pytest.skip("needs a Hopper GPU and the tile128 GEMMs")
    res = _run(PRINT_SCRIPT, MXMOE_PRINT_CONFIGS="1")
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("mxmoe config: ")]
    gemm = [ln for ln in lines if ln.startswith("mxmoe config: gemm sm90 ")]
    quant = [ln for ln in lines if ln.startswith("mxmoe config: quantize ")]
    assert gemm == ["mxmoe config: " + res.stdout.strip()], lines
    assert len(quant) == 1 and "-> kernel=" in quant[0], lines
    res = _run(PRINT_SCRIPT)
    assert res.returncode == 0, res.stderr
    assert "mxmoe config:" not in res.stderr
