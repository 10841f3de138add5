#!/usr/bin/env python3
"""Benchmark of the Hopper tile128 FP8 grouped GEMMs (forward, dgrad, wgrad) against, in the same run,
bf16 ``torch._grouped_mm`` and fp8 rowwise ``torch._scaled_grouped_mm`` (BENCH.md method: medians of
CUDA-event timings via triton.testing.do_bench, which also flushes L2 between runs; random inputs).

Shapes: every BENCH.md row, and Qwen3-30B-A3B's expert GEMMs. Passes (A: (M, K) activations, W: (G, N, K) experts, dY: (M, N)):
  forward  Y  (M, N)    = A . W_g^T          mxmoe: a = x (1x128 blocks), b = W (128x128 tiles)
  dgrad    dA (M, K)    = dY . W_g           mxmoe: a = dY (1x128 along N), b = W^T copy (G, K, N)
  wgrad    dW (G, N, K) = dY_g^T . A_g       mxmoe: a = dY^T (N, M), b = x^T (K, M), 1x128 along M
FLOPs = 2 M N K for every pass. The mxmoe time is the whole C API call (group descriptors, scale
conversion, staging when groups are not 16-aligned, zero fill, GEMM); quantization is not included
(the baselines get their operands ready-made too). Output bf16 everywhere.

Never calls the MXFP8 torch._scaled_grouped_mm (it corrupts the CUDA context on sm90); rowwise fp8
with float32 scales only.

Writes rows to --json (fields: pass, recipe, M, N, K, G, mxmoe_us, bf16_us, fp8_rowwise_us,
ratio_vs_bf16, mxmoe_tflops, bf16_tflops, fp8_rowwise_tflops, groups, config: the library's
configuration of the call (mxmoe_sm90_gemm_config), kernel / tile: the same in short, date, commit,
device) and a short table to --table. --profile adds per-kernel times of one mxmoe call per pass (stage
costs).
"""
from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ (bench_meta)
from bench_meta import commit_id, library_env as _library_env  # noqa: E402

RECIPE = "mxfp8_rceil_tile128"

SHAPES = [  # name, M, N, K, G list, jagged (True: random sizes; "routed": a top-8 router's, each padded to 16)
    ("seeds", 16640, 8192, 5120, [1, 4, 16, 64], False),
    ("llama4-scout", 128000, 8192, 5120, [1, 8], False),
    ("deepseek-v3", 128000, 2048, 7168, [1, 8], False),
    ("jagged", 16384, 4096, 2048, [8, 32], True),
    # fine-grained experts (BENCH.md: Qwen3-like gate_up / down), and Qwen3-30B-A3B's own (hidden 2048,
    # width 768, 128 experts, 16K tokens x top-8, jagged as a router leaves them)
    ("fine-gate-up", 32768, 1536, 1024, [16], False),
    ("fine-down", 32768, 1024, 768, [16], False),
    ("qwen3-30b-gate-up", 131072, 1536, 2048, [128], True),
    ("qwen3-30b-down", 131072, 2048, 768, [128], True),
    # the same as the MoE layer hands them over: 16K tokens routed top-8 at random, each expert's rows
    # padded to 16 (the layer's alignment, so the wgrad reads every group in place)
    ("qwen3-30b-gate-up-routed", 131072, 1536, 2048, [128], "routed"),
    ("qwen3-30b-down-routed", 131072, 2048, 768, [128], "routed"),
    # and at 4K tokens (~256 routed rows an expert: two k-blocks a wgrad tile)
    ("qwen3-30b-gate-up-routed-4k", 32768, 1536, 2048, [128], "routed"),
    ("qwen3-30b-down-routed-4k", 32768, 2048, 768, [128], "routed"),
]


# ---- library ---------------------------------------------------------------------------------------
def load_lib():
    """libmxmoe through the package's loader (python/mxmoe/_lib.py) when importable, else plain ctypes."""
    view = check = None
    try:
        from mxmoe import _lib as L  # noqa: WPS433

        handle = L.lib()
        view, check = L.view, L.check
    except Exception as e:  # the package may be mid-change; the bench only needs the C API
        print(f"(mxmoe._lib not usable: {e!r}; using a minimal ctypes binding)")
        path = os.environ.get("MXMOE_LIBRARY", "build-cuda/src/core/libmxmoe.so")
        handle = ctypes.CDLL(path)
        handle.mxmoe_last_error.restype = ctypes.c_char_p

        class T(ctypes.Structure):
            _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int), ("ndim", ctypes.c_int32),
                        ("shape", ctypes.c_int64 * 4), ("strides", ctypes.c_int64 * 4), ("device", ctypes.c_int32)]

        codes = {torch.bfloat16: 0, torch.float32: 1, torch.float8_e4m3fn: 2, torch.float8_e8m0fnu: 3,
                 torch.int32: 4, torch.float64: 5}

        def view(t, name):
            if t is None:
                return None
            v = T()
            v.data = t.data_ptr()
            v.dtype = codes[t.dtype]
            v.ndim = t.dim()
            for i, (s, st) in enumerate(zip(t.shape, t.stride())):
                v.shape[i], v.strides[i] = s, st
            v.device = t.device.index if t.is_cuda else -1
            return ctypes.byref(v)

        def check(status, what):
            if status != 0:
                raise RuntimeError(f"{what}: {handle.mxmoe_last_error().decode()}")

    for name in ("mxmoe_grouped_mm_tile128_workspace_size", "mxmoe_grouped_mm_tile128_kgroups_workspace_size"):
        fn = getattr(handle, name)
        fn.restype = ctypes.c_int64
        fn.argtypes = [ctypes.c_int64] * 4 + [ctypes.c_int32]
    # Views are passed as ctypes.byref objects (argtypes left unset: no conversion; None -> NULL).
    handle.mxmoe_grouped_mm_tile128.restype = ctypes.c_int
    handle.mxmoe_grouped_mm_tile128_kgroups.restype = ctypes.c_int
    handle.mxmoe_last_error.restype = ctypes.c_char_p
    handle.mxmoe_sm90_gemm_config.restype = ctypes.c_int
    handle.mxmoe_sm90_gemm_config.argtypes = [ctypes.c_int32] + [ctypes.c_int64] * 4 + [
        ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t]
    handle.mxmoe_reload_env.restype = ctypes.c_int
    handle.mxmoe_reload_env.argtypes = []
    return handle, view, check


LIB, VIEW, CHECK = load_lib()


def _v(t, name):
    return VIEW(t, name)


def stream_ptr():
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def workspace(nbytes):
    if nbytes < 0:
        raise RuntimeError(LIB.mxmoe_last_error().decode())
    return torch.empty(max(nbytes, 1), dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)


def mx_fwd_call(a, a_s, b, b_s, offs, out, ws):
    args = [_v(a, "a"), _v(a_s, "a_scale"), _v(b, "b"), _v(b_s, "b_scale"), _v(offs, "offs"), None, _v(out, "out"),
            _v(ws, "workspace")]
    keep = (a, a_s, b, b_s, offs, out, ws)

    def run():
        CHECK(LIB.mxmoe_grouped_mm_tile128(*args, stream_ptr()), "grouped_mm_tile128")
        return keep

    return run


def mx_kg_call(a, a_s, b, b_s, offs, out, ws):
    args = [_v(a, "a"), _v(a_s, "a_scale"), _v(b, "b"), _v(b_s, "b_scale"), _v(offs, "offs"), _v(out, "out"),
            _v(ws, "workspace")]
    keep = (a, a_s, b, b_s, offs, out, ws)

    def run():
        CHECK(LIB.mxmoe_grouped_mm_tile128_kgroups(*args, stream_ptr()), "grouped_mm_tile128_kgroups")
        return keep

    return run


# ---- inputs ----------------------------------------------------------------------------------------
def group_sizes(m, g, jagged, seed):
    if jagged == "routed":  # m / 8 tokens, top-8 of random scores; sizes padded to 16 (sum >= m)
        gen = torch.Generator().manual_seed(seed)
        idx = torch.rand(m // 8, g, generator=gen).topk(8, dim=1).indices
        counts = torch.bincount(idx.flatten(), minlength=g)
        return [(int(c) + 15) // 16 * 16 for c in counts]
    if not jagged:  # as equal as possible, in multiples of 128
        tiles = m // 128
        sizes = [128 * (tiles // g + (1 if i < tiles % g else 0)) for i in range(g)]
        sizes[-1] += m - sum(sizes)
        return sizes
    gen = torch.Generator().manual_seed(seed)
    w = torch.rand(g, generator=gen)
    w[torch.randperm(g, generator=gen)[: max(1, g // 8)]] = 0.0  # some empty groups
    sizes = (w / w.sum() * m).floor().long().tolist()
    sizes[int(torch.argmax(w))] += m - sum(sizes)
    return sizes


def fp8(shape, gen=None):
    return (torch.randn(*shape, device="cuda") * 2).to(torch.float8_e4m3fn)


def scale_bytes(shape):
    return torch.randint(120, 135, shape, dtype=torch.uint8, device="cuda").view(torch.float8_e8m0fnu)


def coarse_rows(rows, cols32):  # (rows, cols32) bytes constant over 4 consecutive entries (1x128)
    s = torch.randint(120, 135, (rows, (cols32 + 3) // 4), dtype=torch.uint8, device="cuda")
    return s.repeat_interleave(4, dim=1)[:, :cols32].contiguous().view(torch.float8_e8m0fnu)


def coarse_tiles(g, rows, cols32):  # (g, rows, cols32) constant over 128 rows x 4 entries
    s = torch.randint(120, 135, (g, (rows + 127) // 128, (cols32 + 3) // 4), dtype=torch.uint8, device="cuda")
    s = s.repeat_interleave(128, dim=1)[:, :rows].repeat_interleave(4, dim=2)[:, :, :cols32]
    return s.contiguous().view(torch.float8_e8m0fnu)


# ---- DeepGEMM (issue 12's anchor; only when importable on the GPU machine) ----------------------------
def deepgemm_m_grouped(a8, b8, sizes, n_out):
    """A DeepGEMM M-grouped contiguous FP8 GEMM (1x128 activation scales, 128x128 weight scales, fp32)
    on the same operands, or None when deep_gemm is not importable. DeepGEMM needs every group padded
    to its M alignment (128): a DeepGEMM user pads, so the padded rows are timed too (the jagged rows'
    FLOPs stay the unpadded ones). Both API generations are tried (m_grouped_fp8_gemm_nt_contiguous,
    2025-H2; m_grouped_gemm_fp8_fp8_bf16_nt_contiguous, 2025-H1)."""
    try:
        import deep_gemm
    except ImportError:
        return None
    G, K = b8.shape[0], b8.shape[2]
    align = 128
    padded = [(s + align - 1) // align * align for s in sizes]
    Mp = sum(padded)
    a = a8 if Mp == a8.shape[0] else fp8((Mp, K))
    m_indices = torch.repeat_interleave(torch.arange(G, dtype=torch.int32),
                                        torch.tensor(padded)).cuda()
    a_s = torch.rand(Mp, (K + 127) // 128, device="cuda") + 0.5
    b_s = torch.rand(G, (n_out + 127) // 128, (K + 127) // 128, device="cuda") + 0.5
    align_fn = getattr(deep_gemm, "get_mn_major_tma_aligned_tensor", None) or \
        getattr(deep_gemm, "get_col_major_tma_aligned_tensor")
    a_s = align_fn(a_s)
    out = torch.empty(Mp, n_out, device="cuda", dtype=torch.bfloat16)
    fn = getattr(deep_gemm, "m_grouped_fp8_gemm_nt_contiguous", None) or \
        getattr(deep_gemm, "m_grouped_gemm_fp8_fp8_bf16_nt_contiguous")
    return lambda: fn((a, a_s), (b8, b_s), out, m_indices)


def deepgemm_k_grouped(N, K, sizes):
    """DeepGEMM's k-grouped wgrad (k_grouped_wgrad_gemm_fp8_fp8_fp32_nt, 1x128 scales on both
    operands, fp32 output accumulated in place) on operands of the same shape, or None when deep_gemm
    is not importable or has no k-grouped wgrad. Its layout is one contiguous (rows, k_g) block per
    group, fp32 scales, and a host list of group sizes; groups are padded to 128 tokens as for the
    M-grouped anchor (a DeepGEMM user pads). Empty groups are left out (it asserts k > 0)."""
    try:
        import deep_gemm
    except ImportError:
        return None
    fn = getattr(deep_gemm, "k_grouped_wgrad_gemm_fp8_fp8_fp32_nt", None)
    if fn is None:
        return None
    padded = [(s + 127) // 128 * 128 for s in sizes if s > 0]
    Mp, kb = sum(padded), sum(p // 128 for p in padded)
    lhs, rhs = fp8((N * Mp,)), fp8((K * Mp,))
    lhs_s = torch.rand(kb, N, device="cuda") + 0.5
    rhs_s = torch.rand(kb, K, device="cuda") + 0.5
    out = torch.zeros(len(padded), N, K, device="cuda", dtype=torch.float32)
    return lambda: fn((lhs, lhs_s), (rhs, rhs_s), out, padded)


# ---- timing ----------------------------------------------------------------------------------------
def bench_us(fn):
    import triton.testing

    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median") * 1e3


def try_bench(label, fn):
    try:
        return bench_us(fn)
    except Exception as e:  # baseline variants not supported by this torch build
        print(f"    {label}: n/a ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
        return None


def profile_kernels(fn, label):
    """Per-kernel device times of one call (stage costs)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0)
        if t > 0:
            rows.append((t, e.key))
    rows.sort(reverse=True)
    print(f"    stage costs, {label}:")
    for t, k in rows:
        print(f"      {t:10.1f} us  {k[:110]}")
    return [{"us": t, "kernel": k} for t, k in rows]


# ---- configurations and environment ------------------------------------------------------------------
def library_env(env):
    """bench_meta.library_env on this script's library handle."""
    return _library_env(env, LIB)


def gemm_config(pas, M, N, K, G):
    """The library's configuration of a call (mxmoe_sm90_gemm_config under the current environment:
    kernel, tile, stages, producer, cluster, scheduler). pas: forward, dgrad (the call reduces over the
    model's N and writes K columns) or wgrad; bf16 output."""
    text = ctypes.create_string_buffer(512)
    cn, ck = (K, N) if pas == "dgrad" else (N, K)
    CHECK(LIB.mxmoe_sm90_gemm_config(1 if pas == "wgrad" else 0, M, cn, ck, G, 0, text, len(text)),
          "sm90_gemm_config")
    return text.value.decode()


def kernel_of(config, pas, M):
    """(kernel, tile) in short for the tables, from a config text. The query assumes the own kernel takes
    the call: the K-grouped one declines M % 16 != 0 (CUTLASS then runs it)."""
    tokens = config.split(" -> ", 1)[1].split()
    f = dict(t.split("=", 1) for t in tokens if "=" in t)
    if f["impl"] == "cutlass" or (pas == "wgrad" and M % 16 != 0):
        return "cutlass_coop_fp8_blockwise", "128x128x128 cluster 1x2"
    if pas == "wgrad":
        return "mxmoe_sm90_grouped_k", f"128x128x128 cluster {f['cluster']}"
    extra = (" +1 stage" if "lean" in tokens else "") + (" warp producer" if f["producer"] == "warp" else "")
    return "mxmoe_sm90_grouped_m", f"128x{f['block_n']}x128 cluster {f['cluster']}{extra}"


# ---- passes ----------------------------------------------------------------------------------------
def sweep_scheduler(mx, label):
    """mxmoe time per scheduler setting (raster order x max swizzle)."""
    res = {}
    for raster in ("m", "n"):
        for swz in (1, 2, 4, 8):
            with library_env({"MXMOE_TILE128_RASTER": raster, "MXMOE_TILE128_SWIZZLE": str(swz)}):
                res[f"{raster}{swz}"] = bench_us(mx)
    print(f"    scheduler sweep {label}: " + "  ".join(f"{k}:{v:.0f}us" for k, v in res.items()))
    return res


def parse_variants(spec):
    """'label:VAR=VAL+VAR2=VAL2,label2:VAR=VAL' -> [(label, {VAR: VAL, ...}), ...]."""
    out = []
    for item in filter(None, spec.split(",")):
        label, _, env = item.partition(":")
        out.append((label, dict(kv.split("=", 1) for kv in filter(None, env.split("+")))))
    return out


def bench_variants(mx, variants):
    """mxmoe time of the same call under each variant's environment, measured in this run beside the
    default."""
    res = {}
    for label, env in variants:
        with library_env(env):
            res[label] = bench_us(mx)
    if res:
        print("    variants: " + "  ".join(f"{k} {v:.1f} us" for k, v in res.items()), flush=True)
    return res


def run_shape(name, M, N, K, G, jagged, passes, profile, sweep=False, variants=()):
    sizes = group_sizes(M, G, jagged, seed=M + N + K + G)
    M = sum(sizes)  # "routed" pads every group
    offs = torch.tensor(sizes, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
    flops = 2.0 * M * N * K
    rows = []
    stages = {}

    # shared operands
    x_bf = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    w_bf = torch.randn(G, N, K, device="cuda", dtype=torch.bfloat16) * 0.05
    x8, w8 = fp8((M, K)), fp8((G, N, K))

    def deepgemm(a8, b8, n_out, label):
        try:
            fn = deepgemm_m_grouped(a8, b8, sizes, n_out)
        except Exception as e:  # an API this script does not know: say so, keep the run going
            print(f"    deepgemm {label}: n/a ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
            return None
        return try_bench(f"deepgemm {label}", fn) if fn else None

    def record(pas, t_mx, t_bf, t_f8, var=None, t_dg=None):
        row = dict(pass_=pas, M=M, N=N, K=K, G=G, mxmoe_us=t_mx, bf16_us=t_bf, fp8_rowwise_us=t_f8, deepgemm_us=t_dg)
        row["config"] = gemm_config(pas, M, N, K, G)
        row["kernel"], row["tile"] = kernel_of(row["config"], pas, M)
        if var:
            row["variants_us"] = var
            row["variants_config"] = {}
            for label, env in variants:
                with library_env(env):
                    row["variants_config"][label] = gemm_config(pas, M, N, K, G)
            row["variants_kernel"] = {label: " ".join(kernel_of(c, pas, M))
                                      for label, c in row["variants_config"].items()}
        row["ratio_vs_bf16"] = (t_bf / t_mx) if (t_bf and t_mx) else None
        for k in ("mxmoe", "bf16", "fp8_rowwise"):
            t = row[f"{k}_us"]
            row[f"{k}_tflops"] = flops / (t * 1e-6) / 1e12 if t else None
        rows.append(row)
        r = row["ratio_vs_bf16"]
        print(f"  {pas:8s} G={G:3d}  mxmoe {t_mx or float('nan'):9.1f} us  bf16 {t_bf or float('nan'):9.1f} us  "
              f"fp8-rowwise {t_f8 or float('nan'):9.1f} us  -> {r if r else float('nan'):.2f}x bf16", flush=True)

    if "forward" in passes:
        a_s, b_s = coarse_rows(M, K // 32), coarse_tiles(G, N, K // 32)
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        ws = workspace(LIB.mxmoe_grouped_mm_tile128_workspace_size(M, N, K, G, 0))
        mx = mx_fwd_call(x8, a_s, w8, b_s, offs, out, ws)
        t_mx = bench_us(mx)
        var = bench_variants(mx, variants)
        if profile:
            stages["forward"] = profile_kernels(mx, f"forward {name} G={G}")
        if sweep:
            stages["forward_sweep"] = sweep_scheduler(mx, f"forward {name} G={G}")
        wt_bf = w_bf.transpose(-2, -1)
        t_bf = try_bench("bf16 forward", lambda: torch._grouped_mm(x_bf, wt_bf, offs=offs))
        sa, sb = torch.rand(M, device="cuda") + 0.5, torch.rand(G, N, device="cuda") + 0.5
        w8t = w8.transpose(-2, -1)
        t_f8 = try_bench("fp8 rowwise forward", lambda: torch._scaled_grouped_mm(
            x8, w8t, sa, sb, offs=offs, out_dtype=torch.bfloat16))
        record("forward", t_mx, t_bf, t_f8, var, deepgemm(x8, w8, N, "forward"))
        del out, ws, a_s, b_s

    if "dgrad" in passes:
        dy_bf = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        dy8 = fp8((M, N))
        wt8 = w8.transpose(-2, -1).contiguous()  # the quantizer's qt copy (G, K, N)
        a_s, b_s = coarse_rows(M, N // 32), coarse_tiles(G, K, N // 32)
        out = torch.empty(M, K, device="cuda", dtype=torch.bfloat16)
        ws = workspace(LIB.mxmoe_grouped_mm_tile128_workspace_size(M, K, N, G, 0))
        mx = mx_fwd_call(dy8, a_s, wt8, b_s, offs, out, ws)
        t_mx = bench_us(mx)
        var = bench_variants(mx, variants)
        if profile:
            stages["dgrad"] = profile_kernels(mx, f"dgrad {name} G={G}")
        t_bf = try_bench("bf16 dgrad", lambda: torch._grouped_mm(dy_bf, w_bf, offs=offs))
        sa, sb = torch.rand(M, device="cuda") + 0.5, torch.rand(G, K, device="cuda") + 0.5
        wt8_cm = wt8.transpose(-2, -1)  # (G, N, K) view, column-major as _scaled_grouped_mm wants
        t_f8 = try_bench("fp8 rowwise dgrad", lambda: torch._scaled_grouped_mm(
            dy8, wt8_cm, sa, sb, offs=offs, out_dtype=torch.bfloat16))
        record("dgrad", t_mx, t_bf, t_f8, var, deepgemm(dy8, wt8, K, "dgrad"))
        del dy_bf, dy8, wt8, out, ws, a_s, b_s

    if "wgrad" in passes:
        dyt8 = fp8((N, M))  # dY^T (N, M): the quantizer's qt of dY
        xt8 = fp8((K, M))   # x^T (K, M)
        cap = (M + 31) // 32 + G
        a_s, b_s = scale_bytes((N, cap)), scale_bytes((K, cap))
        out = torch.empty(G, N, K, device="cuda", dtype=torch.bfloat16)
        ws = workspace(LIB.mxmoe_grouped_mm_tile128_kgroups_workspace_size(M, N, K, G, 0))
        mx = mx_kg_call(dyt8, a_s, xt8, b_s, offs, out, ws)
        t_mx = bench_us(mx)
        var = bench_variants(mx, variants)
        if profile:
            stages["wgrad"] = profile_kernels(mx, f"wgrad {name} G={G}")
        if sweep:
            stages["wgrad_sweep"] = sweep_scheduler(mx, f"wgrad {name} G={G}")
        del xt8
        # torch's grouped mm needs every token group 16-aligned along the reduction (it asserts on the
        # device otherwise, which would end this process): time the baselines on groups padded to 16
        # tokens, as a torch-based training step would have to.
        sizes_b = [(s + 15) // 16 * 16 for s in sizes]
        Mb = sum(sizes_b)
        offs_b = torch.tensor(sizes_b, dtype=torch.int64).cumsum(0).to(torch.int32).cuda()
        if Mb != M:
            print(f"    (baselines: groups padded to 16 tokens, {Mb} tokens)")
        x_b = x_bf if Mb == M else torch.randn(Mb, K, device="cuda", dtype=torch.bfloat16)
        dyt_bf = torch.randn(N, Mb, device="cuda", dtype=torch.bfloat16)
        t_bf = try_bench("bf16 wgrad", lambda: torch._grouped_mm(dyt_bf, x_b, offs=offs_b))
        del dyt_bf, x_b
        dyt8_b = dyt8 if Mb == M else fp8((N, Mb))
        x8_cm = fp8((K, Mb)).t()  # (Mb, K) column-major
        sa, sb = torch.rand(G * N, device="cuda") + 0.5, torch.rand(G * K, device="cuda") + 0.5
        t_f8 = try_bench("fp8 rowwise wgrad", lambda: torch._scaled_grouped_mm(
            dyt8_b, x8_cm, sa, sb, offs=offs_b, out_dtype=torch.bfloat16))
        del dyt8_b
        del x8_cm, out, ws, a_s, b_s
        try:
            dg = deepgemm_k_grouped(N, K, sizes)
        except Exception as e:  # an API this script does not know: say so, keep the run going
            print(f"    deepgemm wgrad: n/a ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
            dg = None
        t_dg = try_bench("deepgemm wgrad", dg) if dg else None
        del dg
        record("wgrad", t_mx, t_bf, t_f8, var, t_dg)
        del dyt8

    del x_bf, w_bf, x8, w8
    torch.cuda.empty_cache()
    return rows, sizes, stages


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "gemm.json"))
    ap.add_argument("--table", default=os.path.join(os.environ.get("OUT", "."), "table-gemm.txt"))
    ap.add_argument("--passes", default="forward,dgrad,wgrad")
    ap.add_argument("--only", default="", help="shape names to run (comma list); default all")
    ap.add_argument("--profile", default="llama4-scout:8,jagged:32", help="name:G pairs to profile")
    ap.add_argument("--sweep", default="", help="name:G pairs for the scheduler sweep (e.g. llama4-scout:8)")
    ap.add_argument("--variants", default="",
                    help="every pass re-timed under library env knobs, e.g. "
                         "'cutlass:MXMOE_GEMM_SM90=cutlass,n128:MXMOE_GEMM_BLOCK_N=128'")
    args = ap.parse_args()
    variants = parse_variants(args.variants)
    passes = args.passes.split(",")
    profile_set = {p for p in args.profile.split(",") if p}
    sweep_set = {p for p in args.sweep.split(",") if p}

    props = torch.cuda.get_device_properties(0)
    device = props.name
    try:
        clocks = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.max.sm,clocks.mem",
                                 "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    except OSError:
        clocks = "?"
    commit = commit_id("?")
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    print(f"device {device} ({props.multi_processor_count} SMs), clocks sm,max,mem: {clocks}; torch {torch.__version__}; "
          f"commit {commit}; {date}")
    print(f"mxmoe library: {getattr(LIB, '_name', '?')}")

    def fmt(v, spec):
        return format(v, spec) if v is not None else "n/a"

    def emit(all_rows):
        """Writes the JSON rows and the short table of what has been measured so far (called after every
        shape, so a run stopped by its time limit keeps its rows)."""
        out_rows = []
        for r in all_rows:
            out_rows.append({
                "pass": r["pass_"], "recipe": RECIPE, "shape": r["shape"], "M": r["M"], "N": r["N"], "K": r["K"],
                "G": r["G"], "mxmoe_us": r["mxmoe_us"], "bf16_us": r["bf16_us"], "fp8_rowwise_us": r["fp8_rowwise_us"],
                "ratio_vs_bf16": r["ratio_vs_bf16"], "mxmoe_tflops": r["mxmoe_tflops"], "bf16_tflops": r["bf16_tflops"],
                "fp8_rowwise_tflops": r["fp8_rowwise_tflops"], "groups": r["groups"], "stages": r["stages"],
                "variants_us": r.get("variants_us"), "variants_kernel": r.get("variants_kernel"),
                "variants_config": r.get("variants_config"), "config": r["config"],
                "kernel": r["kernel"], "tile": r["tile"],
                # DeepGEMM beside mxmoe (issue 12) when the GPU machine can import it
                "deepgemm_us": r.get("deepgemm_us"),
                "date": date, "commit": commit, "device": device, "clocks": clocks, "torch": torch.__version__,
            })
        with open(args.json, "w") as f:
            json.dump(out_rows, f, indent=1)
        lines = [f"tile128 grouped GEMMs ({RECIPE}), {device}, clocks {clocks}, torch {torch.__version__}, "
                 f"commit {commit}, {date}",
                 "| pass | M | N | K | G | mxmoe us | TFLOP/s | bf16 us | TFLOP/s | fp8 rowwise us | TFLOP/s | deepgemm us "
                 "| vs bf16 | vs deepgemm |",
                 "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in out_rows:
            lines.append(f"| {r['pass']} | {r['M']} | {r['N']} | {r['K']} | {r['G']}{'*' if r['groups'] else ''} | "
                         f"{fmt(r['mxmoe_us'], '.0f')} | {fmt(r['mxmoe_tflops'], '.0f')} | {fmt(r['bf16_us'], '.0f')} | "
                         f"{fmt(r['bf16_tflops'], '.0f')} | {fmt(r['fp8_rowwise_us'], '.0f')} | "
                         f"{fmt(r['fp8_rowwise_tflops'], '.0f')} | {fmt(r['deepgemm_us'], '.0f')} | "
                         f"{fmt(r['ratio_vs_bf16'], '.2f')}x | "
                         f"{fmt(r['deepgemm_us'] / r['mxmoe_us'] if r['deepgemm_us'] and r['mxmoe_us'] else None, '.2f')}x |")
        lines.append("(* jagged: random group sizes, some empty, not multiples of 32; or routed: a random "
                     "top-8 router's, each padded to 16)")
        with open(args.table, "w") as f:
            f.write("\n".join(lines) + "\n")
        return lines

    all_rows = []
    for name, M, N, K, gs, jagged in SHAPES:
        if args.only and name not in args.only.split(","):
            continue
        for G in gs:
            print(f"[{name}] M={M} N={N} K={K} G={G}", flush=True)
            rows, sizes, stages = run_shape(name, M, N, K, G, jagged, passes, f"{name}:{G}" in profile_set,
                                            f"{name}:{G}" in sweep_set, variants)
            for r in rows:
                r.update(shape=name, groups=sizes if jagged else None,
                         stages={"kernels": stages.get(r["pass_"]), "sweep": stages.get(r["pass_"] + "_sweep")})
            all_rows += rows
            emit(all_rows)
    print("\n".join(emit(all_rows)))


if __name__ == "__main__":
    sys.exit(main())
