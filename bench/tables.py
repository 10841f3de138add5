"""Markdown tables for BENCHMARKS.md from the device run's JSON rows.

    python3 bench/tables.py benchmarks [RESULTS_DIR] [--out BENCHMARKS.md]
        (the whole BENCHMARKS.md from the latest result files in bench/results/: one section per
        benchmark, each file headed by the commit, date, GPU and command recorded in it;
        tests/python/test_docs.py checks that BENCHMARKS.md equals this output)
    python3 bench/tables.py host bench/results/host.json
    python3 bench/tables.py e2e bench/results/e2e.json [more e2e.json ...]
    python3 bench/tables.py moe bench/results/moe_layer.json
    python3 bench/tables.py quantize bench/results/quantize.json   (kernel x shape: "us (copy ratio)")
    python3 bench/tables.py gemm bench/results/gemm.json           (one row per pass and shape)
    python3 bench/tables.py tile128_ab bench/results/quantize.json bench/results/quantize-tile128-off.json
        (the tile128 pass kernel against the general kernels on the same requests, same run)
"""
from __future__ import annotations

import json
import math
import os
import sys


_PAD = " "  # the space around table cells; BENCHMARKS.md drops it (same rendering, a smaller file)


def _md(header, rows):
    sep, edge = f"{_PAD}|{_PAD}", f"|{_PAD}"
    out = [edge + sep.join(header) + edge[::-1], "|" + "---|" * len(header)]
    out += [edge + sep.join(str(c) for c in r) + edge[::-1] for r in rows]
    return "\n".join(out)


def host(path: str) -> str:
    d = json.load(open(path))
    rows = []
    for r in d["rows"]:
        ratio = r.get("host_ratio")
        eg = r.get("eager_graph_ratio")
        rows.append([r["shape"], f"({r['M']}, {r['N']}, {r['K']}, G={r['G']})", r["impl"], f"{r['host_us']:.0f}",
                     f"{r['torch_host_us']:.0f}", f"{ratio:.2f}x" if ratio else "-", r.get("host_target", "-"),
                     f"{r['eager_us']:.0f}", f"{r['graph_us']:.0f}" if r.get("graph_us") else "-",
                     f"{eg:.2f}" if eg else "-", r.get("graph_target", "-")])
    head = ["shape", "(M, N, K, G)", "impl", "host_us", "torch_host_us", "host ratio", "<= 1.3x", "eager_us",
            "graph_us", "eager/graph", "<= 1.1 (fine)"]
    text = [f"{d['date']}, commit {d['commit']}, {d['device']} (torch {d['torch']}), reps {d['reps']}", "",
            _md(head, rows)]
    for b in d.get("host_breakdown", []):
        top = ", ".join(f"{t['op']} {t['self_us']:.0f} us (x{t['calls']:g})" for t in b["top"][:6])
        text.append(f"\n- host split, {b['shape']} {b['impl']} (profiler, per step): {b['wall_us']:.0f} us = ops "
                    f"{b['ops_self_us']:.0f} + Python/autograd {b['python_us']:.0f}; top: {top}")
    return "\n".join(text)


def e2e(paths) -> str:
    rows = []
    for path in paths:
        rows += json.load(open(path))["rows"]
    return _e2e_rows(rows)


def _e2e_rows(rows) -> str:
    """python -m mxmoe bench's rows; the torchao columns when the run measured torchao beside mxmoe."""
    ao = any(r.get("torchao_e2e_us") for r in rows)
    g = lambda r, k, fmt: fmt.format(r[k]) if r.get(k) is not None else "-"  # noqa: E731
    body = [[r["A_shape"], r["B_shape"], r["recipe"], r["mode"], r.get("micro_batches", 1),
             g(r, "bf16_e2e_us", "{:.0f}"), g(r, "scaled_e2e_us", "{:.0f}"), g(r, "scaled_e2e_speedup", "{:.3f}x")] +
            ([g(r, "torchao_e2e_us", "{:.0f}"), g(r, "scaled_vs_torchao_e2e", "{:.2f}x")] if ao else []) +
            [g(r, "scaled_fwd_speedup", "{:.3f}x"), g(r, "peak_mem_ratio", "{:.2f}x")] for r in rows]
    head = (["A_shape", "B_shape", "recipe", "mode", "micro-batches", "bf16_e2e_us", "scaled_e2e_us", "e2e speedup"] +
            (["torchao fp8 rowwise e2e us", "mxmoe vs torchao"] if ao else []) +
            ["fwd speedup", "peak mem vs bf16"])
    return _md(head, body)


def _x(v) -> str:
    return f"{v:.2f}x" if v else "-"


def _sonic_cell(e, gr) -> str:
    """SonicMoE's fwd+bwd us, eager (graph), or why it has none."""
    r = e or gr
    if r is None:
        return "-"
    if not (e or {}).get("fwd_bwd_us") and not (gr or {}).get("fwd_bwd_us"):
        err = r.get("error") or ""
        return ("skipped" if err.startswith("skipped") else "not importable" if "not importable" in err
                else "OOM" if r.get("oom") else "error" if err else "-")
    t = f"{e['fwd_bwd_us']:.0f}" if (e or {}).get("fwd_bwd_us") else "-"
    return t + (f" ({gr['fwd_bwd_us']:.0f})" if (gr or {}).get("fwd_bwd_us") else "")


def _moe_vs_sonic(d, by, cell) -> list:
    """The table against SonicMoE (bench_moe's sonic_bf16 rows): its time, every impl's ratio to it and
    peak over its peak, same run. Only for files whose run measured (or tried) SonicMoE."""
    s = d.get("sonic") or {}
    impls = ["mxmoe_bf16", "mxmoe_tile128", "mxmoe_exact"]
    body = []
    for (cfg, tokens), g in by.items():
        e, gr = g.get(("sonic_bf16", "eager")), g.get(("sonic_bf16", "graph"))
        first = (e or gr or {}).get("first_call_s")
        peak = (e or {}).get("peak_mib")
        cached = g.get(("mxmoe_tile128_cached", "eager"), {})
        chk = (e or gr or {}).get("sonic_check") or {}
        err = chk.get("out_rel_err_vs_transformers")
        check = "-" if not chk else (
            ("same load" if chk.get("load_equal") else f"load differs by {chk.get('load_diff_tokens')}") +
            (f", out {err:.1e}" if err is not None else ""))
        body.append([cfg, tokens, _sonic_cell(e, gr), f"{first:.1f}" if first else "-", check] +
                    [cell(g, i, "ratio_vs_sonic") for i in impls] + [_x(cached.get("ratio_vs_sonic")),
                     cell(g, "transformers_bf16", "ratio_vs_sonic"), f"{peak:.0f}" if peak else "-"] +
                    [_x(g.get((i, "eager"), {}).get("peak_vs_sonic")) for i in impls])
    if s.get("source"):
        what = (f"SonicMoE: sonic-moe {s.get('version')} (quack {s.get('quack')}, cutlass-dsl "
                f"{s.get('cutlass_dsl')}), GEMMs {s.get('gemm_configs')}")
    else:
        what = f"SonicMoE: not importable ({s.get('import_error', 'not recorded')})"
    return [what + "; its layer also routes (router GEMM, top-k softmax and their backward on the same router "
            "and tokens).", "",
            _md(["config", "tokens", "SonicMoE bf16 us", "SonicMoE first call s", "SonicMoE routing, output",
                 "mxmoe bf16", "mxmoe tile128",
                 "mxmoe exact", "tile128 cached W", "transformers bf16", "peak MiB SonicMoE", "peak bf16",
                 "peak tile128", "peak exact"], body),
            "\nfwd+bwd against SonicMoE in the same run: SonicMoE us / impl us (eager; graph in brackets); > 1 is "
            "faster than SonicMoE. Peak: the step's peak allocation over SonicMoE's. First call: its JIT "
            "compile (untimed). Routing, output: SonicMoE's tokens per expert against the routing every impl "
            "gets, and its output's relative error against transformers' on the same weights.\n"]


# Where the tile128 layer's time goes (one eager fwd+bwd, weights written first): the profile's top
# kernels grouped into the layer's pieces, each with the work it must do (N = tokens x top_k routed
# rows, H hidden, I intermediate, E experts; FLOPs for GEMMs, bytes read + written once for the memory
# passes, a gather's reads once per routed row) and the rate that gives. Kernel names as the profiler
# truncates them; the quantize pass's template argument names its source (quantize.h: 1 gather with
# row scale, 2 SwiGLU, 3 SwiGLU backward; tile128_bf16.cu: 100 gather, 102 / 103 their plain-layout
# instances; 0 with tile: the weights' 128x128 pass).
# The fused GEMMs' kernel names (as the profiler truncates them), by the name `fused` gives them below.
_FUSED = {"dswiglu": "GroupedMGatherDSwigl", "swiglu": "GroupedMGatherSwigl"}
_TILE128_PIECES = [
    # column, name patterns, work(N, H, I, E, fused) -> (amount, unit), what it is and the next step. A kernel
    # counts in the first column whose pattern it matches (the fused GEMMs before the plain ones); fused: the
    # set of fused kernels the step ran ("dswiglu", "swiglu").
    ("down dgrad + dSwiGLU", (_FUSED["dswiglu"],), lambda n, h, i, e, f: (2 * n * h * i, "flop"),
     "the down projection's dgrad (2 N H I FLOPs) with dSwiGLU, the routing weights' grad and dH's two FP8 "
     "forms in its epilogue (h read, the forms written: 8 N I bytes) on a fourth warpgroup, its bound; "
     "next: a tile's hand-over overlapped with the epilogue's work"),
    ("up proj + SwiGLU", (_FUSED["swiglu"],), lambda n, h, i, e, f: (4 * n * h * i, "flop"),
     "GEMM1 (4 N H I FLOPs) storing h and writing act's two FP8 forms in its epilogue (a fourth warpgroup, "
     "a gate and up tile pair per hand-over); next: its epilogue below the pair's two mainloops"),
    ("fwd+dgrad GEMMs", ("grouped_m_kernel",),
     lambda n, h, i, e, f: ((6 + (0 if "swiglu" in f else 4) + (0 if "dswiglu" in f else 2)) * n * h * i, "flop"),
     "the other forward / dgrad GEMMs, 6 N H I FLOPs (+4 with GEMM1 unfused, +2 with the down dgrad "
     "unfused)"),
    ("wgrad GEMMs", ("GemmUniversal", "grouped_k_kernel", "grouped_k_prepare", "kg_prologue"),
     lambda n, h, i, e, f: (6 * n * h * i, "flop"),
     "6 N H I; bound by L2 -> SM bytes on CTA pairs, by its math side on 2 x 2 clusters (gemm-sm90.md)"),
    ("weights' pass", ("tile128_pass_kernel<0, true>", "sm90_bf16_quantize_128x128_kernel", "sm90_weights_scale_expand"),
     lambda n, h, i, e, f: (12 * e * h * i, "byte"),
     "W read, q and qt written, 12 E H I bytes (TMA kernel on Hopper: quantize.md); next: once per optimizer "
     "step (cached W), or the dgrad reading the forward form (qt not written)"),
    ("SwiGLU pass", ("tile128_pass_kernel<102,", "tile128_pass_kernel<2,"), lambda n, h, i, e, f: (6 * n * i, "byte"),
     "where GEMM1 is unfused (interleaved halves, I % 128 != 0, b13): h read, act's two FP8 forms written, "
     "6 N I; next: the fused epilogue for those layouts"),
    ("dSwiGLU pass", ("tile128_pass_kernel<103,", "tile128_pass_kernel<3,"),
     lambda n, h, i, e, f: (10 * n * i, "byte"),
     "where the down dgrad is unfused (interleaved halves, I % 128 != 0, b13): dY' and h read, dH's two forms "
     "written, 10 N I; next: the fused epilogue for those layouts"),
    ("x wgrad operand", ("tile128_pass_kernel<100,",), lambda n, h, i, e, f: (3 * n * h, "byte"),
     "routed x read, its 128x1 form written, 3 N H; next: GEMM1's producer"),
    ("w*dout wgrad operand", ("tile128_pass_kernel<104,", "tile128_pass_kernel<1,"), lambda n, h, i, e, f: (3 * n * h, "byte"),
     "3 N H; next: the down projection dgrad's producer"),
    ("weights' grad", ("swiglu_weight_grad",), lambda n, h, i, e, f: (6 * n * i, "byte"),
     "unfused only: dY' and h read, 6 N I"),
]


def _match_pieces(top, pieces):
    """The profile's top kernels split over pieces (each kernel in the first piece whose name patterns
    it matches): per piece its us (None where no kernel matched), and the kernels left over."""
    left, us = list(top), []
    for _, pats, *_ in pieces:
        hit = [t for t in left if any(p in t["kernel"] for p in pats)]
        left = [t for t in left if t not in hit]
        us.append(sum(t["us"] for t in hit) if hit else None)
    return us, left


def _fused_kernels(top) -> set:
    return {name for name, pat in _FUSED.items() if any(pat in t["kernel"] for t in top)}


def _tile128_bound(d) -> list:
    """One row per tile128 breakdown: per piece 'us, rate', then the rest of the kernel time."""
    shape = {(r["config"], r["tokens"]): r for r in d["rows"] if r.get("hidden")}
    out = []
    for b in d.get("breakdown", []):
        if b.get("error") or b["impl"] != "mxmoe_tile128" or (b["config"], b["tokens"]) not in shape:
            continue
        r = shape[(b["config"], b["tokens"])]
        n, h, i, e = b["tokens"] * r["top_k"], r["hidden"], r["intermediate"], r["experts"]
        fused = _fused_kernels(b["top"])
        piece_us, left = _match_pieces(b["top"], _TILE128_PIECES)
        cells = []
        for (_, _, work, _), us in zip(_TILE128_PIECES, piece_us):
            amount, unit = work(n, h, i, e, fused)
            cells.append("-" if us is None else f"{us:.0f}, " + (f"{amount / us / 1e6:.0f} TF/s" if unit == "flop"
                                                                 else f"{amount / us / 1e6:.2f} TB/s"))
        rest = b["total_us"] - sum(t["us"] for t in b["top"]) + sum(t["us"] for t in left)
        out.append([b["config"], b["tokens"], f"{b['total_us']:.0f}"] + cells + [f"{rest:.0f}"])
    return out


# Issue 32's targets against SonicMoE (fwd+bwd, same run, each layer at its faster of eager and graph)
# and what they ask of the tile128 layer: the time a target needs, the floor of the fused data flow at
# the GPU's ceilings, and the pieces furthest above their own floor. Ceilings: FP8 GEMMs at the best
# grouped FP8 rate measured here (BENCHMARKS.md GEMM table, H200, mxmoe sm90 grouped_m, ~1260 TFLOP/s;
# the H100 has the same FP8 rate); memory at the GPU's device-to-device copy rate (H200 ~4.3 TB/s,
# H100 ~3.0 TB/s, bytes read + written; device/KINDS.md).
_TARGETS = {("qwen3-30b-a3b", 4096): 1.3}  # every other config: 1.5
_FP8_TFLOPS = 1260.0


def _copy_tbs(device: str) -> float:
    return 3.0 if "H100" in (device or "") else 4.3


# The fused data flow's work beyond the pieces of _TILE128_PIECES: the combine (forward, and dx in the
# backward: N rows of H read, T rows written, bf16).
_COMBINE = ("combine", ("combine_kernel",), lambda n, h, i, e, t: (4 * n * h + 4 * t * h, "byte"))


def _floor_us(amount, unit, copy_tbs) -> float:
    return amount / (_FP8_TFLOPS * 1e6 if unit == "flop" else copy_tbs * 1e6)


def _tile128_targets(d) -> list:
    """One row per config with SonicMoE and tile128 eager rows and a tile128 breakdown: SonicMoE us,
    tile128's ratio, the target, the us it needs, the fused data flow's floor (18 N H I GEMM FLOPs, the
    weights' pass, the two wgrad operands, the combine, at the ceilings above) and the three pieces
    furthest above their floor, peak over SonicMoE's and the size of the weights' FP8 forms (6 E H I bytes)."""
    rows = {(r["config"], r["tokens"], r["impl"], r["mode"]): r for r in d["rows"]}
    cb = _copy_tbs(d.get("device"))
    out = []
    for b in d.get("breakdown", []):
        key = (b["config"], b["tokens"])
        s, t = rows.get(key + ("sonic_bf16", "eager")), rows.get(key + ("mxmoe_tile128", "eager"))
        if (b.get("error") or b["impl"] != "mxmoe_tile128" or not (s or {}).get("fwd_bwd_us")
                or not (t or {}).get("fwd_bwd_us")):
            continue
        # Each layer at its faster mode (SonicMoE's eager step is launch-bound at few tokens).
        def best(r, impl):
            return min(filter(None, [r["fwd_bwd_us"], rows.get(key + (impl, "graph"), {}).get("fwd_bwd_us")]))
        s, t = dict(s, fwd_bwd_us=best(s, "sonic_bf16")), dict(t, fwd_bwd_us=best(t, "mxmoe_tile128"))
        n, h, i, e = b["tokens"] * t["top_k"], t["hidden"], t["intermediate"], t["experts"]
        target = _TARGETS.get((t.get("config_key"), b["tokens"]), 1.5)
        need = s["fwd_bwd_us"] / target
        fused = _fused_kernels(b["top"])
        floor = _floor_us(18 * n * h * i, "flop", cb) + _floor_us(12 * e * h * i, "byte", cb) \
            + 2 * _floor_us(3 * n * h, "byte", cb) + _floor_us(*_COMBINE[2](n, h, i, e, b["tokens"]), cb)
        pieces = _TILE128_PIECES + [_COMBINE]
        over = sorted(((us - _floor_us(*work(n, h, i, e, b["tokens"] if name == "combine" else fused), cb), name)
                       for (name, _, work, *_), us in zip(pieces, _match_pieces(b["top"], pieces)[0])
                       if us is not None), reverse=True)
        forms = 6 * e * h * i / 2**20
        peak = f"{t['peak_mib'] / s['peak_mib']:.2f}x" if t.get("peak_mib") and s.get("peak_mib") else "-"
        bf = rows.get(key + ("mxmoe_bf16", "eager"))
        bf_x = f"{s['fwd_bwd_us'] / best(bf, 'mxmoe_bf16'):.2f}x" if (bf or {}).get("fwd_bwd_us") else "-"
        bf_peak = f"{bf['peak_mib'] / s['peak_mib']:.2f}x" if (bf or {}).get("peak_mib") and s.get("peak_mib") else "-"
        out.append([b["config"], b["tokens"], f"{s['fwd_bwd_us']:.0f}", f"{s['fwd_bwd_us'] / t['fwd_bwd_us']:.2f}x",
                    f"{target:.1f}x", f"{need:.0f}", f"{t['fwd_bwd_us']:.0f}",
                    f"{floor:.0f} ({s['fwd_bwd_us'] / floor:.2f}x)",
                    ", ".join(f"{name} +{us:.0f}" for us, name in over[:3]),
                    f"{peak}, {bf_peak}", f"{forms:.0f}", bf_x])
    return out


def moe(path: str, full: bool = True) -> str:
    """bench/bench_moe.py's moe_layer.json: the table against SonicMoE (where the run measured it), a
    summary (each impl's fwd+bwd ratio vs transformers' bf16 grouped_mm experts, eager with graph in
    brackets), every row, and the per-kernel breakdowns. full=False (BENCHMARKS.md): the tables, the rows
    that failed, and the breakdowns as one table. Files from before SonicMoE render as before."""
    d = json.load(open(path))
    rows = d["rows"]
    hf = d.get("transformers") or {}
    base = (f"transformers {hf['version']} `grouped_mm_experts_forward`" if hf.get("source") == "transformers"
            else "a local copy of transformers' `grouped_mm_experts_forward` (transformers not importable)")
    text = [f"{d['date']}, commit {d['commit']}, {d['device']} (torch {d['torch']}"
            f"{', clocks ' + d['clocks'] if d.get('clocks') else ''}); baseline {base}"]
    if d.get("gpt_oss"):
        text.append(f"gpt-oss rows: activation `{d['gpt_oss']['activation']}`, layout `{d['gpt_oss']['layout']}`")
    text.append("")
    by = {}
    for r in rows:
        by.setdefault((r["config"], r["tokens"]), {})[(r["impl"], r["mode"])] = r
    impls = ["mxmoe_bf16", "mxmoe_tile128", "mxmoe_exact"]

    def cell(g, impl, key):
        e, gr = g.get((impl, "eager")), g.get((impl, "graph"))
        if e is None and gr is None:
            return "-"
        if (e or gr).get("error") and not (e or {}).get(key) and not (gr or {}).get(key):
            return "OOM" if (e or gr).get("oom") else "error"
        out = _x((e or {}).get(key))
        return out + (f" ({_x(gr.get(key))})" if gr is not None else "")

    sonic = any(r["impl"] == "sonic_bf16" for r in rows)
    if sonic:
        text += _moe_vs_sonic(d, by, cell)
    summary = []
    for (cfg, tokens), g in by.items():
        t_e, t_g = g.get(("transformers_bf16", "eager"), {}), g.get(("transformers_bf16", "graph"), {})
        t = f"{t_e['fwd_bwd_us']:.0f}" if t_e.get("fwd_bwd_us") else "-"
        t += f" ({t_g['fwd_bwd_us']:.0f})" if t_g.get("fwd_bwd_us") else ""
        cached = g.get(("mxmoe_tile128_cached", "eager"), {})
        peak_t = t_e.get("peak_mib")
        peaks = [f"{g[(i, 'eager')]['peak_mib'] / peak_t:.2f}x"
                 if peak_t and g.get((i, "eager"), {}).get("peak_mib") else "-" for i in impls]
        summary.append([cfg, tokens, t] + [cell(g, i, "ratio_vs_transformers") for i in impls]
                       + [cell(g, i, "ratio_vs_mxmoe_bf16") for i in impls[1:]]
                       + [_x(cached.get("ratio_vs_transformers")), _x(cached.get("ratio_vs_mxmoe_bf16"))] + peaks)
    text.append(_md(["config", "tokens", "transformers bf16 us", "mxmoe bf16", "mxmoe tile128", "mxmoe exact",
                     "tile128 vs mxmoe bf16", "exact vs mxmoe bf16", "tile128 cached W", "cached W vs mxmoe bf16",
                     "peak bf16", "peak tile128", "peak exact"], summary))
    text.append("\nfwd+bwd ratios vs transformers' bf16 in the same run (eager; graph in brackets); > 1 is faster. "
                "Every step writes the weights first (one micro-batch per optimizer step: the weights are "
                "re-quantized every step), except 'tile128 cached W' (eager): micro-batches 2..N of a "
                "gradient-accumulation step, weights' FP8 forms from the weight cache. Peak: the step's peak "
                "allocation over transformers'.\n")
    if not full:
        # One entry per config, impl and message (eager and graph usually fail alike).
        failed = list(dict.fromkeys(f"{r['config']} T={r['tokens']} {r['impl']}: {(r.get('error') or '')[:80]}"
                                    for r in rows if r.get("error")))
        if failed:
            text.append("Failed rows: " + "; ".join(failed) + "\n")
        # The impls the targets compare (the exact, cached and transformers' breakdowns stay in the JSON).
        bds = [b for b in d.get("breakdown", []) if not b.get("error")
               and b["impl"] in ("sonic_bf16", "mxmoe_bf16", "mxmoe_tile128")]
        cats = list(dict.fromkeys(c for b in bds for c in b["categories_us"]))
        if bds:
            text.append("Kernel time of one eager fwd+bwd (us, torch.profiler):\n")
            text.append(_md(["config", "tokens", "impl", "total"] + cats,
                            [[b["config"], b["tokens"], b["impl"], f"{b['total_us']:.0f}"] +
                             [f"{b['categories_us'][c]:.0f}" if c in b["categories_us"] else "-" for c in cats]
                             for b in bds]))
        bound = _tile128_bound(d)
        if bound:
            text.append("\nWhere tile128's time goes (the same eager fwd+bwd; per piece us, and the rate of the work "
                        "it must do: N = tokens x top_k routed rows, bytes read + written once, a gather's reads "
                        f"once per routed row; this GPU copies ~{_copy_tbs(d.get('device'))} TB/s; -: not among the 10 "
                        "largest kernels, in rest):\n")
            text.append(_md(["config", "tokens", "total us"] + [c for c, *_ in _TILE128_PIECES] + ["rest"], bound))
            text.append("\n" + "; ".join(f"**{c}**: {what}" for c, _, _, what in _TILE128_PIECES) + ".\n")
        targets = _tile128_targets(d)
        if targets:
            text.append("Against the targets (tile128 vs SonicMoE, fwd+bwd, each at its faster of eager and graph): "
                        "the us a target needs, the floor "
                        "and the pieces furthest above their own floor (us; next steps above):\n")
            text.append(_md(["config", "tokens", "SonicMoE us", "tile128", "target", "needs us", "tile128 us",
                             "floor us (x SonicMoE)", "furthest above their floor", "peak tile128, bf16 vs SonicMoE",
                             "W forms MiB", "mxmoe bf16 (target 1.0x)"], targets))
            text.append(f"\nFloor: the fused data flow at FP8 GEMMs {_FP8_TFLOPS:.0f} TFLOP/s (the best grouped rate "
                        f"measured here) and {_copy_tbs(d.get('device'))} TB/s: 18 N H I FLOPs, the weights' pass "
                        "(12 E H I bytes), the two wgrad operands (3 N H each), the combine (4 N H + 4 T H). W forms: "
                        "the weights' two FP8 forms (6 E H I bytes), which the bf16 layers do not have.\n")
        return "\n".join(text)
    full = []
    for r in rows:
        f = lambda k, fmt="{:.0f}": fmt.format(r[k]) if r.get(k) is not None else "-"
        full.append([r["config"], r["tokens"], r["impl"], r["mode"], f("fwd_bwd_us"), f("fwd_us"), f("peak_mib")] +
                    ([_x(r.get("ratio_vs_sonic")), _x(r.get("peak_vs_sonic")), f("first_call_s", "{:.1f}")]
                     if sonic else []) +
                    [_x(r.get("ratio_vs_transformers")), _x(r.get("ratio_vs_mxmoe_bf16")),
                     (r.get("error") or "").replace("|", "/")[:80]])
    text.append(_md(["config", "tokens", "impl", "mode", "fwd_bwd_us", "fwd_us", "peak MiB"] +
                    (["vs SonicMoE", "peak vs SonicMoE", "first call s"] if sonic else []) +
                    ["vs transformers", "vs mxmoe bf16", "error"], full))
    for b in d.get("breakdown", []):
        if b.get("error"):
            text.append(f"\n- kernels, {b['config']} T={b['tokens']} {b['impl']}: failed ({b['error']})")
            continue
        tot = b["total_us"] or 1.0
        cats = ", ".join(f"{c} {us:.0f} us ({us / tot:.0%})"
                         for c, us in sorted(b["categories_us"].items(), key=lambda x: -x[1]))
        top = ", ".join(f"{t['kernel'][:50]} {t['us']:.0f} us" for t in b["top"][:4])
        text.append(f"\n- kernels, {b['config']} T={b['tokens']} {b['impl']} (one eager fwd+bwd): {tot:.0f} us = "
                    f"{cats}; top: {top}")
    return "\n".join(text)


def quantize(path: str) -> str:
    """One table per input family (the shape's first word: A, dY, W, jag, moe), kernels as rows."""
    rows = json.load(open(path))
    fams = {}
    for r in rows:
        fams.setdefault(r["shape"].split()[0], []).append(r)
    out = []
    for fam, rs in fams.items():
        shapes = list(dict.fromkeys(r["shape"] for r in rs))
        kernels = list(dict.fromkeys(r["kernel"] for r in rs))
        cell = {(r["kernel"], r["shape"]): r for r in rs}
        body = [[k] + [f"{cell[k, sh]['us']:.0f} ({cell[k, sh]['copy_ratio']:.2f})" if (k, sh) in cell else ""
                       for sh in shapes] for k in kernels]
        out.append(_md(["kernel"] + shapes, body))
    return "\n\n".join(out)


def _kernel(r) -> str:
    """The kernel a GEMM row ran and its configuration (the 128x128x128 tile is every kernel's)."""
    tile = (r.get("tile") or "").replace("128x128x128", "").strip()
    return f"{r.get('kernel') or '-'}" + (f" ({tile})" if tile else "")


def gemm(path: str) -> str:
    rows = json.load(open(path))
    f = lambda v, spec: format(v, spec) if v is not None else "n/a"  # noqa: E731
    dg = any(r.get("deepgemm_us") for r in rows)  # the DeepGEMM columns when that run measured it
    kern = any(r.get("kernel") for r in rows)  # which kernel ran each row, when the run recorded it
    body = [[r["pass"], r["shape"], r["M"], r["N"], r["K"], f"{r['G']}{'*' if r.get('groups') else ''}"] +
            ([_kernel(r)] if kern else []) +
            [f(r["mxmoe_us"], ".0f"), f(r["mxmoe_tflops"], ".0f"), f(r["bf16_us"], ".0f"), f(r["fp8_rowwise_us"], ".0f")] +
            ([f(r.get("deepgemm_us"), ".0f"),
              f"{f(r['deepgemm_us'] / r['mxmoe_us'] if r.get('deepgemm_us') and r['mxmoe_us'] else None, '.2f')}x"]
             if dg else []) +
            [f"{f(r['ratio_vs_bf16'], '.2f')}x",
             f"{f(r['bf16_us'] / r['fp8_rowwise_us'] if r['bf16_us'] and r['fp8_rowwise_us'] else None, '.2f')}x"]
            for r in rows]
    return _md(["pass", "shape", "M", "N", "K", "G"] + (["kernel"] if kern else []) +
               ["mxmoe us", "TFLOP/s", "bf16 us", "fp8 rowwise us"] +
               (["DeepGEMM us", "mxmoe vs DeepGEMM"] if dg else []) + ["mxmoe vs bf16", "fp8 rowwise vs bf16"],
               body) + "\n(* jagged: random group sizes, some empty)"


def gemm_kernels(path: str) -> str:
    """Forward/dgrad rows timed under several kernel choices in one run (bench_gemm.py --variants):
    the default's time, each variant's, and the best variant against the default."""
    rows = [r for r in json.load(open(path)) if r.get("variants_us")]
    labels = list(rows[0]["variants_us"]) if rows else []
    body = []
    for r in rows:
        v = r["variants_us"]
        best = min(v.values())
        body.append([r["pass"], r["shape"], f"{r['G']}{'*' if r.get('groups') else ''}", r["kernel"].split("_")[0],
                     f"{r['mxmoe_us']:.0f}"] + [f"{v[k]:.0f}" for k in labels] +
                    [f"{r['mxmoe_us'] / best:.2f}x", f"{r['bf16_us'] / min(best, r['mxmoe_us']):.2f}x"])
    return _md(["pass", "shape", "G", "default", "default us"] + [f"{k} us" for k in labels] +
               ["best variant vs default", "fastest vs bf16"], body)


def tile128_ab(main_path: str, off_path: str) -> str:
    main = {(r["kernel"], r["shape"]): r for r in json.load(open(main_path))}
    body = []
    for r in json.load(open(off_path)):
        m = main.get((r["kernel"], r["shape"]))
        if m is None:
            continue
        body.append([r["kernel"], r["shape"], f"{m['us']:.0f} ({m['copy_ratio']:.2f})",
                     f"{r['us']:.0f} ({r['copy_ratio']:.2f})", f"{r['us'] / m['us']:.2f}x"])
    return _md(["request", "shape", "tile128 pass kernel us (copy)", "general kernels us (copy)", "speedup"], body)


# ---- BENCHMARKS.md: every benchmark's latest rows --------------------------------------------------

NOT_RECORDED = "not recorded"


def _load(path: str):
    return json.load(open(path))


def _rows_of(doc):
    if isinstance(doc, list):
        return [r for r in doc if isinstance(r, dict)]
    if isinstance(doc, dict) and isinstance(doc.get("rows"), list):
        return [r for r in doc["rows"] if isinstance(r, dict)]
    return []


def _distinct(values) -> str:
    seen = list(dict.fromkeys(str(v) for v in values if v not in (None, "")))
    return ", ".join(seen) if seen else NOT_RECORDED


def file_meta(doc, rows=None) -> dict:
    """commit, date, GPU, torch and command of one result file: its "meta" object, else its top-level
    keys, else the values its rows carry (several distinct values are listed); "not recorded" where the
    file has none."""
    top = doc.get("meta") if isinstance(doc, dict) and isinstance(doc.get("meta"), dict) else doc
    top = top if isinstance(top, dict) else {}
    rows = _rows_of(doc) if rows is None else rows
    out = {}
    for field, keys in (("commit", ("commit",)), ("date", ("date",)), ("GPU", ("gpu", "device")),
                        ("torch", ("torch",)), ("command", ("command",))):
        val = _distinct(r.get(k) for r in rows for k in keys)  # the rows' own values first
        if val == NOT_RECORDED:
            val = next((top[k] for k in keys if top.get(k) not in (None, "")), NOT_RECORDED)
        out[field] = str(val)
    return out


def _cell(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if v != v:  # NaN
            return "-"
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"
    if isinstance(v, (list, dict)):
        v = json.dumps(v, separators=(",", ":"))
        v = v if len(v) <= 60 else v[:57] + "..."
    return str(v).replace("|", "/").replace("\n", " ")


def _table_of(rows) -> str:
    keys = list(dict.fromkeys(k for r in rows for k in r))
    return _md(keys, [[_cell(r.get(k)) for k in keys] for r in rows])


def generic(doc) -> str:
    """Any result file: each list of row objects as a table (grouped by a "bench" key where rows have
    one), other top-level values as a list. Unknown keys are shown as they are."""
    if isinstance(doc, list):
        doc = {"rows": doc}
    if not isinstance(doc, dict):
        return _cell(doc)
    out, scalars = [], []
    for key, val in doc.items():
        if key == "meta":
            continue
        if isinstance(val, list) and val and all(isinstance(r, dict) for r in val):
            groups = {}
            for r in val:
                groups.setdefault(r.get("bench"), []).append(r)
            for name, rs in groups.items():
                label = key if name is None else f"{key}, {name}"
                out.append(f"{label}:\n\n" + _table_of(rs))
        else:
            scalars.append(f"- {key}: {_cell(val)}")
    return "\n\n".join(out + (["\n".join(scalars)] if scalars else []))


def models(path: str) -> str:
    """bench/bench_models.py's JSON: the per-recipe summary and each profile's GPU time per step (the
    speed preset's, --shape: tokens/s per recipe and mode with its ratios and targets)."""
    d = _load(path)
    if d.get("shape"):
        return _models_speed(d)
    m = d.get("model") or {}
    text = []
    if m:
        text.append(f"Model: transformers Qwen3-MoE, dim {m.get('dim')}, {m.get('n_layers')} layers, "
                    f"{m.get('num_experts')} experts top-{m.get('top_k')} of width {m.get('moe_hidden')}, "
                    f"{d.get('params_b', 0):.2f}B parameters, {d.get('tokens_per_step')} tokens a step; " +
                    (f"{d.get('steps')} eager steps x seeds {d.get('seeds')}; " if d.get("steps") else
                     "compiled runs only (one per recipe); ") +
                    f"transformers {d.get('transformers', NOT_RECORDED)}.\n")
    g = lambda v, fmt: fmt.format(v) if isinstance(v, (int, float)) and v == v else "-"  # noqa: E731
    body = []
    for recipe, sm in (d.get("summary") or {}).items():
        body.append([recipe, g(sm.get("eval_mean"), "{:.4f}") + (
            f" [{g(sm.get('eval_min'), '{:.4f}')}, {g(sm.get('eval_max'), '{:.4f}')}]" if sm.get("seeds") else ""),
            g(100 * sm["rel_eval_vs_bf16"] if "rel_eval_vs_bf16" in sm else None, "{:+.2f}%"),
            g(sm.get("tokens_per_s_eager"), "{:,.0f}"), g(sm.get("speedup_eager"), "{:.2f}x"),
            g(sm.get("tokens_per_s_compiled"), "{:,.0f}"), g(sm.get("speedup_compiled"), "{:.2f}x"),
            g(sm.get("peak_mem_gib"), "{:.2f}"), g(sm.get("peak_mem_vs_bf16"), "{:.2f}x")])
    text.append(_md(["recipe", "held-out loss, mean [min, max]", "vs bf16", "tokens/s eager", "x bf16",
                     "tokens/s compiled", "x bf16", "peak GiB", "x bf16"], body))
    profs = d.get("profiles") or {}
    if profs:
        kinds = list(dict.fromkeys(k for p in profs.values() for k in (p.get("per_step_us_by_kind") or {})))
        body = [[k] + [g((p.get("per_step_us_by_kind") or {}).get(k, math.nan) / 1000, "{:.1f}")
                       for p in profs.values()] for k in kinds]
        body.append(["total GPU"] + [g(sum((p.get("per_step_us_by_kind") or {}).values()) / 1000, "{:.1f}")
                                     for p in profs.values()])
        text.append("\nGPU time per training step (ms, torch.profiler):\n\n" +
                    _md(["kind"] + list(profs), body))
    return "\n".join(text)


def _models_speed(d) -> str:
    m = d.get("model") or {}
    g = lambda v, fmt: fmt.format(v) if isinstance(v, (int, float)) and v == v else "-"  # noqa: E731
    text = [f"Model ({d.get('shape')}): transformers Qwen3-MoE, hidden {m.get('dim')}, {m.get('n_heads')} / "
            f"{m.get('kv_heads')} heads of {m.get('head_dim')}, {m.get('num_experts')} experts top-{m.get('top_k')} "
            f"of width {m.get('moe_hidden')}, {m.get('n_layers')} layers, vocab {m.get('vocab')}, "
            f"{d.get('params_b', 0):.2f}B parameters, {d.get('tokens_per_step')} tokens a step; random init and "
            f"tokens (speed only, no loss verdict); eager {d.get('steps')} steps ({d.get('timing_warmup')} untimed), "
            f"compiled {d.get('compile_steps')} ({d.get('compile_warmup')} untimed); "
            f"transformers {d.get('transformers', NOT_RECORDED)}.\n"]
    body = []
    for mode in ("eager", "compiled"):
        for recipe, sm in (d.get("summary") or {}).items():
            tps = sm.get(f"tokens_per_s_{mode}")
            if not (isinstance(tps, (int, float)) and tps == tps):
                continue
            body.append([recipe, mode, g(tps, "{:,.0f}"), g(sm.get(f"step_ms_{mode}"), "{:.1f}"),
                         g(sm.get(f"vs_bf16_{mode}"), "{:.2f}x"), g(sm.get(f"vs_mxmoe_bf16_{mode}"), "{:.2f}x"),
                         g(sm.get(f"peak_mem_gib_{mode}"), "{:.2f}"), g(sm.get(f"peak_vs_bf16_{mode}"), "{:.2f}x")])
    text.append(_md(["recipe", "mode", "tokens/s", "ms/step", "x transformers bf16", "x mxmoe bf16", "peak GiB",
                     "x bf16"], body))
    targets = []
    for t in d.get("targets") or []:
        met = "not measured" if t.get("met") is None else ("met" if t["met"] else "not met")
        ref = "transformers bf16" if t.get("vs") == "bf16" else "mxmoe bf16"
        targets.append(f"- target: {t.get('recipe')} {t.get('mode')} >= {t.get('target')}x {ref}: "
                       f"{g(t.get('ratio'), '{:.2f}x')}, {met}")
    if targets:
        text.append("\n" + "\n".join(targets))
    return "\n".join(text)


def torchtitan(path: str) -> str:
    """bench/bench_torchtitan.py: the reference-MoE layer rows and the Trainer rows."""
    d = _load(path)
    f = lambda v, fmt: "-" if v is None else fmt.format(v)  # noqa: E731
    layer = [r for r in d["rows"] if r.get("bench") == "layer"]
    train = [r for r in d["rows"] if r.get("bench") == "train"]
    text = []
    if layer:
        body = [[str(r["score_before_experts"]), str(r.get("shared_experts", 1)), r["mode"], r["impl"],
                 f(r["ms"], "{:.2f}"), f(r["ratio_vs_bf16"], "{:.2f}x"), f(r["peak_gib"], "{:.1f}"),
                 f(r.get("out_sqnr"), "{:.1f}"), f(r.get("input_grad_sqnr"), "{:.1f}"),
                 f(r.get("min_param_grad_sqnr"), "{:.1f}"), str(r.get("counts_bitwise_equal", "-"))]
                for r in layer]
        text.append(f"torchao's reference MoE, {layer[0]['tokens']} tokens, dim {layer[0]['dim']}, hidden "
                    f"{layer[0]['hidden']}, 8 experts top-1, non-zero expert bias; fwd+bwd, weights written "
                    "before every step. SQNR (dB) against the bf16 model; torchao's bars 23 / 27 / 21.\n\n" +
                    _md(["score before experts", "shared experts", "mode", "impl", "ms", "x bf16", "peak GiB",
                         "SQNR out", "SQNR dx", "min SQNR dW", "counts bitwise"], body))
    if train:
        body = []
        for r in train:
            if "error" in r:
                body.append([r.get("model", "-"), r["mode"], r["impl"], "failed: " + r["error"]] + ["-"] * 6)
                continue
            body.append([r["model"], r["mode"], r["impl"], f(r["tokens_per_s"], "{:,.0f}"),
                         f(r.get("ratio_vs_bf16"), "{:.2f}x"), f(r["final_loss"], "{:.4f}"),
                         f(100 * r["final_loss_vs_bf16"] if "final_loss_vs_bf16" in r else None, "{:+.2f}%"),
                         f(r["peak_gib"], "{:.2f}"),
                         f"{r['max_mean_load_first']:.2f} -> {r['max_mean_load_last']:.2f}",
                         f"{r.get('converted', '-')}/{r.get('moe_layers', '-')}"])
        steps = train[0].get("steps", "?")
        text.append(f"TorchTitan's Trainer, {steps} steps of {train[0].get('tokens_per_step', '?')} tokens "
                    "(synthetic language); final loss = mean of the last 10% of steps; expert load = max / mean "
                    "tokens per expert, first -> last 10 steps.\n\n" +
                    _md(["model", "mode", "impl", "tokens/s", "x bf16", "final loss", "vs bf16", "peak GiB",
                         "expert load", "MoEs converted"], body))
    return "\n\n".join(text)


def _e2e_latest(paths) -> dict:
    """Each e2e row key (shapes, recipe, mode, micro-batches) kept from the newest file that has it."""
    best = {}
    for path in paths:
        for r in _rows_of(_load(path)):
            key = (r["A_shape"], r["B_shape"], r["recipe"], r["mode"], str(r.get("micro_batches", 1)))
            if key not in best or str(r.get("date", "")) > str(best[key][1].get("date", "")):
                best[key] = (path, r)
    return {path: [r for p, r in best.values() if p == path] for path in paths}


# (anchor title, device step, what it measures, [(file, renderer)]). Renderers take the path;
# "e2e" files are rendered together (newest row per key). Files no section names get a generic
# section of their own, so a new benchmark shows up before it has a renderer.
SECTIONS = [
    ("Real models", "50-models",
     "A transformers Qwen3-MoE trained with transformers' bf16 `grouped_mm` experts and with "
     "`experts_implementation=\"mxmoe\"` (bench/bench_models.py): held-out loss over seeds, tokens/s eager "
     "and compiled, peak memory, and a per-kernel profile.",
     [("models.json", models), ("models-compiled.json", models), ("models-qwen3-30b-a3b.json", models)]),
    ("TorchTitan", "55-torchtitan",
     "torchao's reference MoE and TorchTitan's Trainer on its debug MoE model, bf16 against "
     "`mxmoe.convert` / `MXMoEConverter` (bench/bench_torchtitan.py).",
     [("torchtitan.json", torchtitan)]),
    ("MoE layer", "45-moe",
     "fwd+bwd of one MoE layer's experts (dispatch, SwiGLU experts, combine; grads of x, routing weights, "
     "weights) for the benchmark's MoE configs, against SonicMoE's bf16 layer (where the run measured it) "
     "and transformers' bf16 `grouped_mm` experts on the same weights (bench/bench_moe.py).",
     [("moe_layer.json", "moe")]),
    ("End to end", "40-e2e",
     "One `mxmoe.grouped_mm` forward+backward against bf16 `torch._grouped_mm` (`python -m mxmoe bench`); "
     "each row from the newest run that measured it.",
     [("e2e-tile128.json", "e2e"), ("e2e.json", "e2e")]),
    ("GEMMs", "30-gemm",
     "The tile128 FP8 grouped GEMMs on Hopper, every pass and shape, against bf16 `torch._grouped_mm` "
     "and torch's fp8 rowwise grouped GEMM (bench/bench_gemm.py).",
     [("gemm.json", gemm)]),
    ("Quantization", "20-quantize",
     "The CUDA quantization kernels: time in us and, in brackets, the fraction of a device copy's "
     "bandwidth over the same bytes (bench/quantize_bench.cu).",
     [("quantize.json", quantize), ("quantize-tile128-off.json", "tile128_ab")]),
    ("Host time", "25-host",
     "Host enqueue time of one grouped_mm forward+backward against bf16 `torch._grouped_mm`'s, and "
     "device time eager vs replayed as a CUDA graph (bench/bench_host.py).",
     [("host.json", host)]),
    ("Distributed", "60-distributed",
     "What one rank pays to send its tile128 expert weights through FSDP2 as MX tiles "
     "(bench/bench_distributed.py).",
     [("distributed.json", None)]),
]

_PREAMBLE = """# mxmoe benchmarks

Generated by `python3 bench/tables.py benchmarks --out BENCHMARKS.md` from the latest result files in
`bench/results/` (do not edit by hand: tests/python/test_docs.py checks it). Each result file is headed by
the commit, date, GPU and command recorded in it ("not recorded" where the file has none). Method:
medians of CUDA-event timings, inputs larger than L2, ratios against the named baseline measured in the
same run; > 1 is faster. Earlier measurements are in git history. What the numbers mean for each part of
the library: docs/design/."""


def _file_block(path: str, body: str, rows=None) -> str:
    m = file_meta(_load(path), rows)
    cmd = m["command"] if m["command"] == NOT_RECORDED else f"`{m['command']}`"
    head = (f"**`bench/results/{os.path.basename(path)}`**: commit {m['commit']}, date {m['date']}, "
            f"GPU {m['GPU']}, torch {m['torch']}; command {cmd}")
    return head + "\n\n" + body


def benchmarks(results: str = None) -> str:
    """The whole BENCHMARKS.md from the result files in `results` (default: bench/results/)."""
    global _PAD
    pad, _PAD = _PAD, ""
    try:
        return _benchmarks(results)
    finally:
        _PAD = pad


def _benchmarks(results):
    results = results or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    present = sorted(f for f in os.listdir(results) if f.endswith(".json"))
    named = {f for *_, files in SECTIONS for f, _ in files}
    out = [_PREAMBLE]
    sections = list(SECTIONS) + [(f"Other results: {f[:-5]}", None, "A result file without a dedicated "
                                  "renderer, shown as recorded.", [(f, None)]) for f in present if f not in named]
    for title, step, what, files in sections:
        files = [(f, r) for f, r in files if f in present]
        if not files:
            continue
        paths = [os.path.join(results, f) for f, _ in files]
        again = f" Regenerate: `bash scripts/device_run.sh {step}`." if step else ""
        blocks = [f"## {title}\n\n{what}{again}"]
        latest = _e2e_latest([p for p, (_, r) in zip(paths, files) if r == "e2e"])
        for path, (_, render) in zip(paths, files):
            if render == "e2e":
                body = _e2e_rows(latest[path]) if latest[path] else "(every row superseded by a newer file)"
            elif render == "moe":
                body = moe(path, full=False)
            elif render == "tile128_ab":
                main = os.path.join(results, "quantize.json")
                body = ("The tile128 passes' kernel against the general kernels on the same requests "
                        "(`MXMOE_QUANT_TILE128=0`), same run:\n\n" + tile128_ab(main, path))
            elif render is None:
                body = generic(_load(path))
            else:
                body = render(path)
            blocks.append(_file_block(path, body, latest.get(path)))
        out.append("\n\n".join(blocks))
    return "\n\n".join(out) + "\n"


if __name__ == "__main__":
    kind, *files = sys.argv[1:]
    one = {"host": host, "moe": moe, "quantize": quantize, "gemm": gemm, "gemm_kernels": gemm_kernels,
           "models": models}
    if kind == "benchmarks":
        out = None
        if "--out" in files:
            i = files.index("--out")
            out, files = files[i + 1], files[:i] + files[i + 2:]
        text = benchmarks(files[0] if files else None)
        if out:
            with open(out, "w") as fh:
                fh.write(text)
        else:
            sys.stdout.write(text)
    elif kind == "tile128_ab":
        print(tile128_ab(*files))
    elif kind == "generic":
        print(generic(_load(files[0])))
    else:
        print(one[kind](files[0]) if kind in one else e2e(files))
