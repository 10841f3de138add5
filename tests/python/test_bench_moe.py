"""Smoke test of bench/bench_moe.py (the MoE layer benchmark): a CPU run of its plumbing on tiny configs
writes JSON rows with every field, and its transformers baseline is transformers' grouped_mm experts math.
Asserts the script works, never a time."""
import importlib.util
import json
from pathlib import Path

import pytest
import torch

BENCH_MOE = Path(__file__).resolve().parents[2] / "bench" / "bench_moe.py"
ROW_FIELDS = ["config", "tokens", "impl", "mode", "fwd_bwd_us", "fwd_us", "peak_mib", "ratio_vs_transformers",
              "ratio_vs_mxmoe_bf16", "sonic_us", "ratio_vs_sonic", "peak_vs_sonic", "first_call_s", "date", "commit",
              "device", "error"]
TOP_FIELDS = ["rows", "breakdown", "date", "commit", "device", "torch", "transformers", "sonic", "gpt_oss", "settings"]


def _load():
    spec = importlib.util.spec_from_file_location("bench_moe", BENCH_MOE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _need_moe_experts():
    import mxmoe

    if not hasattr(mxmoe, "moe_experts"):
        pytest.skip("mxmoe.moe_experts is not there yet")


def test_bench_moe_cpu_tiny(tmp_path, capsys):
    _need_moe_experts()
    bench_moe = _load()
    out = tmp_path / "moe_layer.json"
    doc = bench_moe.run(configs="tiny,tiny-bias", modes="eager,graph", reps=1, warmup=1, profile=True, device="cpu",
                        out=str(out), budget_s=0)
    d = json.loads(out.read_text())
    for f in TOP_FIELDS:
        assert f in d, f"missing top-level field {f}"
    assert d["device"] == "cpu" and d["torch"] == torch.__version__
    assert d["transformers"]["source"] in ("transformers", "local")
    assert d["gpt_oss"]["activation"] in ("swiglu", "gpt_oss")
    rows = d["rows"]
    assert len(rows) == len(doc["rows"]) == 2 * len(bench_moe.IMPLS)  # graph mode is skipped on CPU
    assert [r["impl"] for r in rows[:len(bench_moe.IMPLS)]] == bench_moe.IMPLS  # SonicMoE first
    assert d["sonic"]["function"].startswith("sonicmoe.moe_TC_softmax_topk_layer(")
    # SonicMoE needs CUDA (and its wheels): on CPU its rows carry why and the run goes on; never for gpt-oss.
    sonic_rows = [r for r in rows if r["impl"] == bench_moe.SONIC]
    assert len(sonic_rows) == 2
    for r in sonic_rows:
        assert r["fwd_bwd_us"] is None and r["error"], r
        if r["config"] == "tiny-bias":
            assert r["error"].startswith("skipped: SonicMoE has no gpt-oss layer"), r
        else:  # not installed here, or installed but no GPU
            assert r["error"].startswith(("sonic-moe not importable", "sonic-moe needs a CUDA device")), r
    rows = [r for r in rows if r["impl"] != bench_moe.SONIC]
    for r in rows:
        for f in ROW_FIELDS:
            assert f in r, f"missing field {f} in {r}"
        assert r["mode"] == "eager" and r["tokens"] == 64
        assert r["error"] is None, r
        assert r["first_call_s"] >= 0
        assert r["sonic_us"] is None and r["ratio_vs_sonic"] is None and r["peak_vs_sonic"] is None
        assert r["fwd_bwd_us"] > 0 and r["fwd_us"] > 0 and r["peak_mib"] is None  # no CUDA memory stats on CPU
        assert r["ratio_vs_transformers"] > 0
        if r["impl"] == bench_moe.BASELINE:
            assert r["ratio_vs_transformers"] == 1.0 and r["ratio_vs_mxmoe_bf16"] is None
        else:
            assert r["ratio_vs_mxmoe_bf16"] > 0
    for r in rows:  # the tile128 rows record the layer's six sm90 GEMM configurations
        tile128 = bench_moe.RECIPES.get(r["impl"]) == "mxfp8_rceil_tile128"
        assert (r["gemm_configs"] is not None) == tile128, r
        if tile128:
            assert len(r["gemm_configs"]) == 6 and all(c.startswith("gemm sm90 pass=") for c in r["gemm_configs"].values())
            assert "m=128 n=64 k=64 g=4" in r["gemm_configs"]["w13_forward"], r["gemm_configs"]
    assert {r["config"] for r in rows} == {"tiny", "tiny-bias"}
    assert all(r["bias"] for r in rows if r["config"] == "tiny-bias")
    assert len(d["breakdown"]) == len(rows)
    for b in d["breakdown"]:
        assert "error" not in b, b
        assert b["total_us"] > 0 and b["top"] and set(b["categories_us"]) <= {c for c, _ in bench_moe.CATEGORIES} | {"other"}
    table = capsys.readouterr().out
    assert "vs transformers" in table and "vs mxmoe_bf16" in table and "vs sonic" in table


def test_bench_moe_sonic_ratios_and_untuned():
    """The SonicMoE plumbing without SonicMoE: every row of a (config, tokens, mode) gets SonicMoE's time,
    its ratio to it and its peak over SonicMoE's; QuACK's GEMMs are rebound to tuned=False."""
    bench_moe = _load()
    base = {"config": "c", "tokens": 64}
    rows = [dict(base, impl=i, mode=m, fwd_bwd_us=us, fwd_us=None, peak_mib=pk)
            for i, m, us, pk in [("sonic_bf16", "eager", 100.0, 50.0), ("sonic_bf16", "graph", 80.0, 50.0),
                                 ("transformers_bf16", "eager", 200.0, 100.0), ("mxmoe_bf16", "eager", 50.0, 75.0),
                                 ("mxmoe_bf16", "graph", 40.0, 75.0), ("mxmoe_exact", "eager", None, None)]]
    for r in rows:
        r.update(ratio_vs_transformers=None, ratio_vs_mxmoe_bf16=None, fwd_ratio_vs_transformers=None,
                 sonic_us=None, ratio_vs_sonic=None, peak_vs_sonic=None)  # as bench_case's rows
    bench_moe.add_ratios(rows)
    got = {(r["impl"], r["mode"]): (r["sonic_us"], r["ratio_vs_sonic"], r["peak_vs_sonic"]) for r in rows}
    assert got[("sonic_bf16", "eager")] == (100.0, 1.0, 1.0)
    assert got[("transformers_bf16", "eager")] == (100.0, 0.5, 2.0)
    assert got[("mxmoe_bf16", "eager")] == (100.0, 2.0, 1.5)
    assert got[("mxmoe_bf16", "graph")] == (80.0, 2.0, 1.5)
    assert got[("mxmoe_exact", "eager")] == (100.0, None, None)

    calls = []

    def gemm(*args, tuned=True, **kwargs):
        calls.append(tuned)

    untuned = bench_moe._untuned(gemm)
    untuned()
    untuned(tuned=True)
    assert calls == [False, True] and bench_moe._untuned(untuned) is untuned
    cfg = bench_moe.CONFIGS
    assert bench_moe.sonic_skip_reason(cfg["qwen3-30b-a3b"], "swiglu", "concatenated") is None
    assert bench_moe.sonic_skip_reason(cfg["gpt-oss-120b"], "gpt_oss", "interleaved").startswith("skipped")


def test_bench_moe_configs():
    bench_moe = _load()
    c = bench_moe.CONFIGS
    # BENCH.md "MoE layer configs": (hidden, expert intermediate, local experts, top-k)
    assert tuple(c["qwen3-30b-a3b"][1:5]) == (2048, 768, 128, 8)
    assert tuple(c["deepseek-v3-ep8"][1:5]) == (7168, 2048, 32, 8)
    assert tuple(c["llama4-scout"][1:5]) == (5120, 8192, 16, 1)
    assert tuple(c["mixtral-8x7b"][1:5]) == (4096, 14336, 8, 2)
    assert tuple(c["gpt-oss-120b"][1:5]) == (2880, 2880, 128, 4) and c["gpt-oss-120b"].bias
    runs = bench_moe.runs_for(bench_moe.parse_configs("default"), "")
    assert len(runs) == 6 and ("qwen3-30b-a3b", 4096) in runs and all(t == 16384 for n, t in runs if n != "qwen3-30b-a3b")
    assert bench_moe.parse_configs("Qwen3-30B-A3B,mixtral") == ["qwen3-30b-a3b", "mixtral-8x7b"]
    assert bench_moe.runs_for(["tiny"], "32,64") == [("tiny", 32), ("tiny", 64)]
    with pytest.raises(SystemExit):
        bench_moe.parse_configs("nope")


def test_bench_moe_kernel_categories():
    bench_moe = _load()
    cases = {
        "_ZN7cutlass13device_kernelINS_4gemm6kernel13GemmUniversalINS1_17Gro": "gemm",
        "nvjet_tst_128x256_64x4_2x1_v_bz_TNN": "gemm",
        "void at::cuda::detail::prepare_grouped_gemm_data<cutlass::bfloat16_t>": "setup",
        "void mxmoe::cuda::(anonymous namespace)::quant_tile_kernel<unsigned": "quantize",
        "mxmoe::cuda::(anonymous namespace)::fwd_sfa_kernel(mxmoe::cuda::til": "quantize",
        "void at::native::vectorized_elementwise_kernel<4, at::native::silu_kernel": "swiglu",
        "void at::native::index_elementwise_kernel<128, 4>": "gather_scatter",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float>>": "combine",
        "void at::native::vectorized_elementwise_kernel<4, at::native::AUnaryFunctor<mul>>": "other",
    }
    for name, cat in cases.items():
        assert bench_moe.classify(name) == cat, name


def _experts_loop(ex, x, idx, w):
    """transformers' eager Experts.forward (the per-expert loop its integrations/moe.py documents)."""
    out = torch.zeros_like(x, dtype=torch.float32)
    for e in range(ex.num_experts):
        tok, pos = torch.where(idx == e)
        if tok.numel() == 0:
            continue
        h = x[tok] @ ex.gate_up_proj[e].T
        if ex.has_bias:
            h = h + ex.gate_up_proj_bias[e]
        y = ex._apply_gate(h) @ ex.down_proj[e].T
        if ex.has_bias:
            y = y + ex.down_proj_bias[e]
        out.index_add_(0, tok, (y * w[tok, pos, None]).float())
    return out


@pytest.mark.parametrize("key,layout", [("tiny", None), ("tiny-bias", "interleaved"), ("tiny-bias", "concatenated")])
def test_bench_moe_baseline_math(key, layout):
    """The baseline (transformers' function where it imports, else the local copy of its op sequence)
    computes the MoE experts layer; and where transformers imports, the local copy equals it bit for bit."""
    bench_moe = _load()
    case = bench_moe.Case(bench_moe.CONFIGS[key], 64, torch.device("cpu"))
    fn, info = bench_moe.transformers_experts_forward()
    ex = bench_moe.HFExperts(case.w13, case.w2, case.b13, case.b2, gpt_oss_layout=layout)
    with torch.no_grad():
        ref = _experts_loop(ex, case.x, case.topk_idx, case.topk_weights)
        got = fn(ex, case.x, case.topk_idx, case.topk_weights)
        local = bench_moe.local_grouped_mm_experts_forward(ex, case.x, case.topk_idx, case.topk_weights)
    torch.testing.assert_close(got.float(), ref, rtol=2e-2, atol=2e-2)
    if info["source"] == "transformers":
        assert torch.equal(got, local)


def test_moe_memory_trace():
    """bench/moe_memory.py (the layer's live op outputs under FakeTensorMode) runs on the CPU, and its peak
    for a shape is at least what must be alive at the dW13 GEMM: dW13 and h (grads of w13, the saved
    pre-activation)."""
    import subprocess
    import sys

    script = BENCH_MOE.parent / "moe_memory.py"
    for impl in ("mxmoe_tile128", "mxmoe_bf16"):
        r = subprocess.run([sys.executable, str(script), "--config", "tiny", "--tokens", "512", "--impl", impl],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-2000:]
        line = r.stdout.splitlines()[0]
        peak = int(line.split(" bytes)")[0].split("(")[-1])
        H, I, E, k = 64, 32, 4, 2  # the tiny config
        must = (E * 2 * I * H + 512 * k * 2 * I) * 2  # dW13 and h, bf16
        assert must <= peak < 8 * must, (line, must)


def test_tile128_pieces_count_fused_gemms_once():
    """BENCHMARKS.md's 'where tile128's time goes': each fused GEMM in its own column with its own FLOPs,
    and the plain forward / dgrad GEMMs' FLOPs without the fused ones (hand-computed rates)."""
    spec = importlib.util.spec_from_file_location("bench_tables", BENCH_MOE.parent / "tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    n_tok, k, h, i = 1000, 2, 1024, 512  # N = 2000 routed rows
    n = n_tok * k
    top = [{"kernel": "void mxmoe::cuda::gemm::sm90::grouped_m_kernel<GroupedMGatherDSwiglu<4> >(...)", "us": 100.0},
           {"kernel": "void mxmoe::cuda::gemm::sm90::grouped_m_kernel<GroupedMGatherSwiglu<4> >(...)", "us": 200.0},
           {"kernel": "void mxmoe::cuda::gemm::sm90::grouped_m_kernel<GroupedM<128, 5, __nv_bfloat16> >", "us": 300.0},
           {"kernel": "mxmoe::cuda::tile128_pass_kernel<0, true>(...)", "us": 50.0}]
    d = {"rows": [{"config": "c", "tokens": n_tok, "top_k": k, "hidden": h, "intermediate": i, "experts": 4}],
         "breakdown": [{"config": "c", "tokens": n_tok, "impl": "mxmoe_tile128", "total_us": 700.0, "top": top}]}
    (row,) = tables._tile128_bound(d)
    cols = {c: v for (c, *_), v in zip(tables._TILE128_PIECES, row[3:])}
    assert cols["down dgrad + dSwiGLU"] == f"100, {2 * n * h * i / 100 / 1e6:.0f} TF/s"
    assert cols["up proj + SwiGLU"] == f"200, {4 * n * h * i / 200 / 1e6:.0f} TF/s"
    assert cols["fwd+dgrad GEMMs"] == f"300, {6 * n * h * i / 300 / 1e6:.0f} TF/s"  # 6 N H I: both fused
    assert cols["weights' pass"] == f"50, {12 * 4 * h * i / 50 / 1e6:.2f} TB/s"
    assert cols["SwiGLU pass"] == "-" and row[-1] == "50"  # the rest: 700 - 650 us


def test_tile128_targets_floor_and_gaps():
    """BENCHMARKS.md's targets table: the time a target needs, the fused data flow's floor at the
    ceilings and the pieces furthest above their floor (hand-computed)."""
    spec = importlib.util.spec_from_file_location("bench_tables", BENCH_MOE.parent / "tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    t, k, h, i, e = 1000, 2, 1024, 512, 4
    n = t * k
    top = [{"kernel": "grouped_k_kernel<GroupedK<5> >", "us": 400.0},
           {"kernel": "mxmoe::cuda::tile128_pass_kernel<0, true>(...)", "us": 50.0},
           {"kernel": "mxmoe::cuda::combine_kernel<true>", "us": 30.0}]
    shape = {"config": "c", "config_key": "qwen3-30b-a3b", "tokens": t, "top_k": k, "hidden": h,
             "intermediate": i, "experts": e, "mode": "eager"}
    d = {"rows": [dict(shape, impl="sonic_bf16", fwd_bwd_us=1300.0, peak_mib=100.0),
                  dict(shape, impl="mxmoe_tile128", fwd_bwd_us=1000.0, peak_mib=150.0)],
         "breakdown": [{"config": "c", "tokens": t, "impl": "mxmoe_tile128", "total_us": 500.0, "top": top}]}
    (row,) = tables._tile128_targets(d)
    fp8, copy = 1260e6, 4.3e6  # FLOP and bytes per us (an H200: no device named)
    floor = 18 * n * h * i / fp8 + 12 * e * h * i / copy + 2 * 3 * n * h / copy + (4 * n * h + 4 * t * h) / copy
    wgrad_over = 400 - 6 * n * h * i / fp8
    weights_over = 50 - 12 * e * h * i / copy
    combine_over = 30 - (4 * n * h + 4 * t * h) / copy
    assert row[:8] == ["c", t, "1300", "1.30x", "1.5x", f"{1300 / 1.5:.0f}", "1000",
                       f"{floor:.0f} ({1300 / floor:.2f}x)"]
    gaps = sorted([(wgrad_over, "wgrad GEMMs"), (weights_over, "weights' pass"), (combine_over, "combine")], reverse=True)
    assert row[8] == ", ".join(f"{name} +{us:.0f}" for us, name in gaps)
    assert row[9:] == ["1.50x, -", f"{6 * e * h * i / 2**20:.0f}", "-"]
    # The bf16 layer's ratio and peak beside (its target: >= 1.0x SonicMoE, peak <= SonicMoE's).
    d["rows"].append(dict(shape, impl="mxmoe_bf16", fwd_bwd_us=1625.0, peak_mib=90.0))
    assert tables._tile128_targets(d)[0][9:] == ["1.50x, 0.90x", f"{6 * e * h * i / 2**20:.0f}", "0.80x"]
    d["rows"].pop()
    # Qwen3-30B-A3B at 4K tokens has its own target; a config without SonicMoE has no row.
    for r in d["rows"]:
        r["tokens"] = 4096
    d["breakdown"][0]["tokens"] = 4096
    assert tables._tile128_targets(d)[0][4] == "1.3x"
    # Each layer at its faster mode: SonicMoE's graph replay, where faster, sets the bar.
    d["rows"].append(dict(d["rows"][0], mode="graph", fwd_bwd_us=800.0))
    assert tables._tile128_targets(d)[0][2:4] == ["800", "0.80x"]
    d["rows"].pop()
    # An H100 copies ~3.0 TB/s: the same rows against its floor.
    d["device"] = "NVIDIA H100 80GB HBM3"
    n4 = 4096 * k
    floor_h100 = 18 * n4 * h * i / fp8 + (12 * e * h * i + 6 * n4 * h + 4 * n4 * h + 4 * 4096 * h) / 3.0e6
    assert tables._tile128_targets(d)[0][7] == f"{floor_h100:.0f} ({1300 / floor_h100:.2f}x)"
    d["rows"] = d["rows"][1:]
    assert tables._tile128_targets(d) == []


def test_preact_precision_round_trips_the_saved_h(capsys):
    """bench/preact_precision.py finds the one saved pre-activation of each layer and replaces it by its
    MXFP8 round trip: the output is unchanged (the forward never reads the stored h), the grads that
    read h lose accuracy on the bf16 layer, and the tile128 layer's dW2 (its own act(h) operand) stays."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("preact_precision", BENCH_MOE.parent / "preact_precision.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--tokens", "48", "--hidden", "128", "--inter", "64", "--experts", "4", "--topk", "2"])
    rows = {}
    for line in capsys.readouterr().out.splitlines()[2:]:
        layer, *rest = line.split()
        saved = " ".join(rest[:-5])
        rows[(layer, saved)] = [float(v) for v in rest[-5:]]  # out, dx, dtopk_weights, dw13, dw2
    assert len(rows) == 6, rows
    for layer in ("tile128", "bf16"):
        base, fp8 = rows[(layer, "bf16")], rows[(layer, "MXFP8 1x32")]
        assert fp8[0] == base[0], (layer, "the output does not read the stored h")
    assert rows[("bf16", "MXFP8 1x32")][1] < rows[("bf16", "bf16")][1] - 10, "dx of the bf16 layer"
    assert rows[("tile128", "MXFP8 1x32")][4] == rows[("tile128", "bf16")][4], "tile128's dW2"


def test_bench_bf16_gather_cpu_tiny():
    """bench/bench_bf16_gather.py (each bf16 gather kernel against the gathered path it replaces) runs on
    the CPU through the kernels' host references: one row per op, each pair agreeing before it is timed."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_bf16_gather", BENCH_MOE.parent / "bench_bf16_gather.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rows = module.main(["--device", "cpu", "--config", "tiny", "--tokens", "64", "--reps", "1", "--warmup", "0"])
    assert [r["op"] for r in rows] == ["up+swiglu", "up", "down dgrad", "down dgrad+act", "down mm", "dW13", "dW2"]
    assert all(r["rel_err"] < 1e-3 and r["ours_us"] > 0 for r in rows), rows


def test_cpu_smoke_keeps_the_committed_rows(tmp_path, monkeypatch):
    """The CPU smoke test's command line writes no rows unless --out names a file: its default is the
    committed GPU results' path, which a smoke run must not replace. The extra impls run there too."""
    _need_moe_experts()
    bench_moe = _load()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bench" / "results").mkdir(parents=True)
    assert bench_moe.main(["--device", "cpu", "--moe-configs", "tiny", "--moe-reps", "1", "--moe-warmup", "0",
                           "--moe-modes", "eager", "--moe-impls",
                           "mxmoe_tile128,mxmoe_tile128_unfused,mxmoe_bf16_gathered"]) == 0
    assert not (tmp_path / "bench" / "results" / "moe_layer.json").exists()


def test_bf16_gather_impls_choose_their_pieces():
    """The measurement impls set Sm90Backend's bf16 gather pieces while their steps run and restore them
    after: mxmoe_bf16_gather all of them, mxmoe_bf16_gathered none, mxmoe_bf16_kgather the pieces Hopper
    takes at the config's hidden size plus the K-grouped gather wgrads."""
    _need_moe_experts()
    from mxmoe.backends import BF16_GATHER_PIECES
    from mxmoe.backends.sm90 import Sm90Backend

    bench_moe = _load()
    # the tiny config at Qwen3-30B-A3B's hidden size, where Hopper takes the up projection (with its SwiGLU
    # epilogue) and the dgrad
    case = bench_moe.Case(bench_moe.CONFIGS["tiny"]._replace(hidden=2048), 16, torch.device("cpu"))
    want = {"mxmoe_bf16_gather": frozenset(BF16_GATHER_PIECES), "mxmoe_bf16_gathered": frozenset(),
            "mxmoe_bf16_kgather": frozenset({"up", "up_swiglu", "down_dgrad", "wgrad"})}
    for impl, pieces in want.items():
        case.impl = impl
        with case.paths():
            assert frozenset(Sm90Backend.bf16_gather_gemms) == pieces, impl
        assert Sm90Backend.bf16_gather_gemms is None, impl
    assert bench_moe.BF16_KGATHER in bench_moe.EXTRA_IMPLS and bench_moe.RECIPES[bench_moe.BF16_KGATHER] is None


def test_merge_joins_runs_of_one_commit(tmp_path, capsys):
    """--moe-merge joins runs split over device calls (rows, breakdowns, configs and impls in order,
    wall_s summed) and refuses runs of different commits, whose ratios do not compare."""
    _need_moe_experts()
    bench_moe = _load()
    paths = []
    for n, impls in enumerate(["mxmoe_bf16", "mxmoe_bf16_gathered,mxmoe_bf16_gather"]):
        paths.append(str(tmp_path / f"run{n}.json"))
        assert bench_moe.main(["--device", "cpu", "--moe-configs", "tiny", "--moe-reps", "1", "--moe-warmup", "0",
                               "--moe-modes", "eager", "--moe-impls", impls, "--out", paths[-1]]) == 0
    runs = [json.load(open(p)) for p in paths]
    out = str(tmp_path / "merged.json")
    assert bench_moe.main(["--moe-merge", *paths, "--out", out]) == 0
    merged = json.load(open(out))
    assert merged["rows"] == runs[0]["rows"] + runs[1]["rows"]
    assert merged["settings"]["impls"] == ["transformers_bf16", "mxmoe_bf16", "mxmoe_bf16_gathered",
                                           "mxmoe_bf16_gather"]
    assert merged["wall_s"] == round(runs[0]["wall_s"] + runs[1]["wall_s"], 1)
    assert {r["impl"] for r in merged["rows"]} >= {"mxmoe_bf16_gathered", "mxmoe_bf16_gather"}
    runs[1]["commit"] = "0000000"
    json.dump(runs[1], open(paths[1], "w"))
    with pytest.raises(SystemExit, match="commit differ"):
        bench_moe.main(["--moe-merge", *paths, "--out", out])


def test_commit_id_names_the_tree_that_ran(tmp_path, monkeypatch):
    """bench_meta.commit_id: MXMOE_COMMIT first; else the source tree's HEAD, marked +dirty when tracked
    files differ from it (a device copy carries another commit's .git under the tree being tested)."""
    import importlib.util
    import subprocess

    spec = importlib.util.spec_from_file_location("bench_meta", BENCH_MOE.parent / "bench_meta.py")
    meta = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(meta)
    monkeypatch.setenv("MXMOE_COMMIT", "abc1234")
    assert meta.commit_id() == "abc1234"
    monkeypatch.delenv("MXMOE_COMMIT")
    repo = tmp_path / "repo"
    repo.mkdir()
    git = lambda *a: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=repo,  # noqa: E731
                                    check=True, capture_output=True, text=True).stdout.strip()
    git("init", "-q")
    (repo / "f.txt").write_text("a")
    git("add", "f.txt")
    git("commit", "-qm", "one")
    head = git("rev-parse", "--short", "HEAD")
    monkeypatch.setattr(meta, "HERE", str(repo))
    assert meta.commit_id() == head
    (repo / "f.txt").write_text("b")
    assert meta.commit_id() == head + "+dirty"
    monkeypatch.setattr(meta, "HERE", str(tmp_path))  # no repository there
    assert meta.commit_id("none") == "none"
