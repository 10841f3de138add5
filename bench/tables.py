"""Markdown tables for BENCHMARKS.md from the device run's JSON rows.

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
import sys


def _md(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
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
        d = json.load(open(path))
        for r in d["rows"]:
            rows.append([r["A_shape"], r["B_shape"], r["recipe"], r["mode"], r.get("micro_batches", 1),
                         f"{r['bf16_e2e_us']:.0f}", f"{r['scaled_e2e_us']:.0f}", f"{r['scaled_e2e_speedup']:.3f}x",
                         f"{r['bf16_fwd_us']:.0f}", f"{r['scaled_fwd_us']:.0f}", f"{r['scaled_fwd_speedup']:.3f}x",
                         f"{r['peak_mem_ratio']:.2f}x"])
    head = ["A_shape", "B_shape", "recipe", "mode", "micro-batches", "bf16_e2e_us", "scaled_e2e_us", "e2e speedup",
            "bf16_fwd_us", "scaled_fwd_us", "fwd speedup", "peak mem vs bf16"]
    return _md(head, rows)


def _x(v) -> str:
    return f"{v:.2f}x" if v else "-"


def moe(path: str) -> str:
    """bench/bench_moe.py's moe_layer.json: a summary (each impl's fwd+bwd ratio vs transformers' bf16
    grouped_mm experts, eager with graph in brackets), every row, and the per-kernel breakdowns."""
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
    full = []
    for r in rows:
        f = lambda k, fmt="{:.0f}": fmt.format(r[k]) if r.get(k) is not None else "-"
        full.append([r["config"], r["tokens"], r["impl"], r["mode"], f("fwd_bwd_us"), f("fwd_us"), f("peak_mib"),
                     _x(r.get("ratio_vs_transformers")), _x(r.get("ratio_vs_mxmoe_bf16")),
                     (r.get("error") or "").replace("|", "/")[:80]])
    text.append(_md(["config", "tokens", "impl", "mode", "fwd_bwd_us", "fwd_us", "peak MiB", "vs transformers",
                     "vs mxmoe bf16", "error"], full))
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


def gemm(path: str) -> str:
    rows = json.load(open(path))
    f = lambda v, spec: format(v, spec) if v is not None else "n/a"  # noqa: E731
    dg = any(r.get("deepgemm_us") for r in rows)  # the DeepGEMM columns when that run measured it
    body = [[r["pass"], r["shape"], r["M"], r["N"], r["K"], f"{r['G']}{'*' if r.get('groups') else ''}",
             f(r["mxmoe_us"], ".0f"), f(r["mxmoe_tflops"], ".0f"), f(r["bf16_us"], ".0f"), f(r["fp8_rowwise_us"], ".0f"),
             f(r["fp8_rowwise_tflops"], ".0f")] +
            ([f(r.get("deepgemm_us"), ".0f"),
              f"{f(r['deepgemm_us'] / r['mxmoe_us'] if r.get('deepgemm_us') and r['mxmoe_us'] else None, '.2f')}x"]
             if dg else []) +
            [f"{f(r['ratio_vs_bf16'], '.2f')}x",
             f"{f(r['bf16_us'] / r['fp8_rowwise_us'] if r['bf16_us'] and r['fp8_rowwise_us'] else None, '.2f')}x"]
            for r in rows]
    return _md(["pass", "shape", "M", "N", "K", "G", "mxmoe us", "TFLOP/s", "bf16 us", "fp8 rowwise us", "TFLOP/s"] +
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


if __name__ == "__main__":
    kind, *files = sys.argv[1:]
    one = {"host": host, "moe": moe, "quantize": quantize, "gemm": gemm, "gemm_kernels": gemm_kernels}
    if kind == "tile128_ab":
        print(tile128_ab(*files))
    else:
        print(one[kind](files[0]) if kind in one else e2e(files))
