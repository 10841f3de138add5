#!/usr/bin/env python3
"""`python -m mxmoe bench`: end-to-end MXFP8 grouped GEMM vs bf16 on the GPU (method: docs/development.md, "Benchmarks").

This file is the command (mxmoe/__main__.py loads it from the source tree's bench/; it is not part of
the installed package): ``python -m mxmoe bench [args]`` == ``python3 bench/bench_e2e.py [args]``;
``--host`` / ``--moe`` run bench/bench_host.py / bench/bench_moe.py instead.

Prints the seeds' table (A_shape, B_shape, recipe, bf16_e2e_us, scaled_e2e_us, scaled_e2e_speedup,
bf16_fwd_us, scaled_fwd_us, scaled_fwd_speedup; e2e = forward + backward) for the benchmark shapes and
the chosen recipes, eager, torch.compile'd and replayed as a CUDA graph (the ratio without host
overhead), with the step's peak memory next to bf16's, and a
single MoE layer (router + experts) forward+backward. Every ratio is against bf16
`torch._grouped_mm` measured in the same run (the machines are shared; absolute times drift).
Rows also go to <out>/e2e.json. A benchmark, not a test: nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import os
import statistics
import sys
from dataclasses import asdict, dataclass
from typing import Callable, List, Optional

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ (bench_meta)
from bench_meta import commit_id  # noqa: E402

SHAPES = {
    # name: list of (M, N, K, G, jagged)
    "seeds": [(16640, 8192, 5120, g, False) for g in (1, 4, 16, 64)],
    "scout": [(128000, 8192, 5120, g, False) for g in (1, 8)],
    "dsv3": [(128000, 2048, 7168, g, False) for g in (1, 8)],
    "jagged": [(16384, 4096, 2048, g, True) for g in (8, 32)],
}


@dataclass
class Row:
    A_shape: str
    B_shape: str
    recipe: str
    compiled: bool
    mode: str  # eager | compiled | cuda_graph (the eager step captured once, then replayed) | cuda_graph_mb
    # (one micro-batch's fwd+bwd captured, replayed micro_batches times per step; mxmoe under graph_weight_cache)
    bf16_e2e_us: float
    scaled_e2e_us: float
    scaled_e2e_speedup: float
    bf16_fwd_us: float
    scaled_fwd_us: float
    scaled_fwd_speedup: float
    bf16_peak_mib: float
    scaled_peak_mib: float
    peak_mem_ratio: float
    micro_batches: int = 1  # fwd+bwd per weight update; the e2e times are per fwd+bwd
    # torchao's fp8 rowwise grouped mm (the drop-in's peer), same inputs and mode, when torchao is
    # importable and the groups are 16-row multiples (it does not pad them here); else None
    torchao_e2e_us: Optional[float] = None
    torchao_fwd_us: Optional[float] = None
    scaled_vs_torchao_e2e: Optional[float] = None
    date: str = ""
    commit: str = ""
    device: str = ""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shapes", default="seeds,scout,dsv3,jagged", help=f"comma list of {', '.join(SHAPES)}")
    p.add_argument("--recipes", default="mxfp8_rceil,mxfp8_rceil_tile128")
    p.add_argument("--backend", default="auto")
    p.add_argument("--compile", choices=["all", "both", "eager", "compiled", "graph", "graph-mb"], default="all",
                   help="eager, torch.compile'd, and/or the eager step replayed as a CUDA graph (no host "
                   "overhead: the GPU-bound ratio); 'both' = eager + compiled, 'all' = the three; 'graph-mb': "
                   "one micro-batch's fwd+bwd captured and replayed --micro-batches times per step, mxmoe's "
                   "side under mxmoe.graph_weight_cache() (the forms kept across replays)")
    p.add_argument("--reps", type=int, default=10, help="timed repetitions per measurement (median)")
    p.add_argument("--no-moe-layer", action="store_true", help="skip the single MoE layer benchmark")
    p.add_argument("--profile", default="", help="comma list of shape names (e.g. seeds:1 = seeds G=1) whose "
                   "e2e step is profiled per kernel (torch.profiler), for each recipe and bf16")
    p.add_argument("--out", default=os.environ.get("OUT", "out/bench"), help="folder for e2e.json")
    p.add_argument("--micro-batches", type=int, default=1, metavar="N",
                   help="fwd+bwd per weight update (gradient accumulation): the weights change once per N "
                   "steps, as after an optimizer step, so mxmoe quantizes them once per N (times are per fwd+bwd)")
    p.add_argument("--host", nargs=argparse.REMAINDER, default=None, metavar="ARGS",
                   help="run bench/bench_host.py instead (host enqueue time, eager vs graph) with the ARGS that "
                   "follow (see --host --help)")
    p.add_argument("--moe", nargs=argparse.REMAINDER, default=None, metavar="ARGS",
                   help="run bench/bench_moe.py instead (the MoE layer configs: transformers' bf16 "
                   "grouped_mm experts vs mxmoe.moe_experts, fwd+bwd, eager and graph) with the ARGS that "
                   "follow (see --moe --help)")


def _offsets(m: int, g: int, jagged: bool, device) -> torch.Tensor:
    """Equal groups (multiples of 128 rows) or, for the jagged shapes, random sizes with empty groups
    and sizes that are not multiples of 32."""
    gen = torch.Generator().manual_seed(1234 + g)
    if jagged:
        w = torch.rand(g, generator=gen)
        w[torch.randperm(g, generator=gen)[: max(1, g // 8)]] = 0  # some empty groups
        sizes = (w / w.sum() * m).floor().long()
        sizes[-1] += m - sizes.sum()
    else:
        base = (m // g) // 128 * 128
        sizes = torch.full((g,), base, dtype=torch.long)
        sizes[-1] += m - sizes.sum()
    return torch.cumsum(sizes, 0).to(torch.int32).to(device)


def _time_us(fn: Callable[[], None], reps: int) -> float:
    """Median of per-repetition CUDA-event timings after warm-up. The repetitions are launched back to
    back and synchronized once at the end (as triton's do_bench does and as training steps run), so
    the host's launch latency at the start of a step is not counted as device time; the same for the
    bf16 baseline and mxmoe."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) * 1000.0 for start, end in events)


def _peak_mib(fn: Callable[[], None]) -> float:
    """Peak memory allocated during one call, above what was allocated before it. Dead objects of the
    rows before (a CUDA graph and its private pool, stale weight-cache entries) are freed first: freed
    during the call, they made the peak fall below the base (peaks of 0 MiB were recorded)."""
    import mxmoe

    gc.collect()
    mxmoe.refresh_weights()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _env() -> dict:
    commit = commit_id("")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": commit,
        "device": torch.cuda.get_device_name(),
    }


_COMPILED = {}


def _compiled(key, fn):
    if key not in _COMPILED:
        _COMPILED[key] = torch.compile(fn, fullgraph=True, dynamic=True)
    return _COMPILED[key]


def _graphed(fn: Callable[[], None]) -> Callable[[], None]:
    """fn captured once into a CUDA graph (after warm-up on a side stream); returns its replay. Both
    sides of a comparison are captured the same way, so the ratio is the one without host overhead."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def touch_weights(*weights: torch.Tensor) -> None:
    """An optimizer-style write to each weight, as after an optimizer step: an in-place op on one
    element (x * 1 == x, bit for bit) bumps the weight's version counter, so mxmoe's once-per-step
    weight quantization (mxmoe/weight_cache.py) is redone, as in training, without timing an
    optimizer. Both sides of a comparison run it."""
    with torch.no_grad():
        for w in weights:
            w.as_strided((1,), (1,)).mul_(1.0)


def _torchao_rowwise():
    """torchao's differentiable fp8 rowwise grouped mm (the drop-in's peer), or None without torchao."""
    try:
        from torchao.prototype.moe_training.fp8_grouped_mm import _to_fp8_rowwise_then_scaled_grouped_mm
    except Exception:  # torchao is a benchmark peer, not a dependency
        return None

    def run(a, w, offs):
        return _to_fp8_rowwise_then_scaled_grouped_mm(a, w.transpose(-2, -1), offs, out_dtype=torch.bfloat16,
                                                      pad_token_groups_for_grouped_mm=False)
    return run


def bench_grouped_mm(shape, recipe: str, backend: str, mode: str, reps: int, micro_batches: int = 1) -> Row:
    import mxmoe

    m, n, k, g, jagged = shape
    dev = torch.device("cuda")
    torch.manual_seed(0)
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(g, n, k, device=dev, dtype=torch.bfloat16).mul_(k**-0.5).requires_grad_(True)
    dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
    offs = _offsets(m, g, jagged, dev)

    def bf16(a, w, offs):
        return torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)

    def scaled(a, w, offs):
        return mxmoe.grouped_mm(a, w.transpose(-2, -1), offs, recipe=recipe, backend=backend)

    compiled = mode == "compiled"
    if compiled:  # one compiled function per recipe for all shapes (dynamic shapes: no recompiles)
        bf16 = _compiled(("bf16",), bf16)
        scaled = _compiled((recipe, backend), scaled)

    mb = micro_batches

    def fwd(f):
        def run():
            with torch.no_grad():
                f(a, w, offs)
            touch_weights(w)
        return run

    def e2e(f):  # one optimizer step: mb fwd+bwd (grads accumulate), then the weight changes
        def run():
            a.grad = None
            w.grad = None
            for _ in range(mb):
                f(a, w, offs).backward(dy)
            touch_weights(w)
        return run

    def graphed_micro_batches(f, keep):
        # One micro-batch captured; a step = mb replays, then the weight write and what an optimizer
        # step's post-hook does (refresh_weights: the kept forms recompute in the next replay).
        def one():
            f(a, w, offs).backward(dy)

        a.grad = w.grad = None
        with mxmoe.graph_weight_cache() if keep else contextlib.nullcontext():
            replay = _graphed(one)

        def run():
            for _ in range(mb):
                replay()
            touch_weights(w)
            mxmoe.refresh_weights()
        return run

    # Peak memory of the eager/compiled step (a graph's private pool would hide the allocations).
    a.grad = w.grad = None
    bf16_peak, scaled_peak = _peak_mib(e2e(bf16)), _peak_mib(e2e(scaled))
    wrap = _graphed if mode.startswith("cuda_graph") else (lambda fn: fn)
    bf16_fwd, scaled_fwd = _time_us(wrap(fwd(bf16)), reps), _time_us(wrap(fwd(scaled)), reps)
    if mode == "cuda_graph_mb":
        bf16_e2e = _time_us(graphed_micro_batches(bf16, False), reps) / mb
        scaled_e2e = _time_us(graphed_micro_batches(scaled, True), reps) / mb
    else:
        bf16_e2e, scaled_e2e = _time_us(wrap(e2e(bf16)), reps) / mb, _time_us(wrap(e2e(scaled)), reps) / mb
    ao_e2e = ao_fwd = None
    ao = _torchao_rowwise() if mode in ("eager", "cuda_graph") else None
    if ao is not None and bool((torch.diff(offs, prepend=offs.new_zeros(1)) % 16 == 0).all()):
        try:
            ao_fwd, ao_e2e = _time_us(wrap(fwd(ao)), reps), _time_us(wrap(e2e(ao)), reps) / mb
        except Exception as e:  # a peer that fails on a shape leaves its column empty
            print(f"torchao fp8 rowwise {shape} {mode}: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    return Row(
        A_shape=str((m, k)), B_shape=str((g, n, k)), recipe=recipe, compiled=compiled, mode=mode,
        bf16_e2e_us=bf16_e2e, scaled_e2e_us=scaled_e2e, scaled_e2e_speedup=bf16_e2e / scaled_e2e,
        bf16_fwd_us=bf16_fwd, scaled_fwd_us=scaled_fwd, scaled_fwd_speedup=bf16_fwd / scaled_fwd,
        bf16_peak_mib=bf16_peak, scaled_peak_mib=scaled_peak, peak_mem_ratio=scaled_peak / bf16_peak,
        micro_batches=mb, torchao_e2e_us=ao_e2e, torchao_fwd_us=ao_fwd,
        scaled_vs_torchao_e2e=ao_e2e / scaled_e2e if ao_e2e else None,
    )


def bench_moe_layer(recipe: str, backend: str, reps: int, tokens: int = 16384, dim: int = 4096,
                    hidden: int = 2048, experts: int = 8, top_k: int = 2) -> Optional[dict]:
    """One MoE layer (router + top-k + permute + SwiGLU experts via torch._grouped_mm + unpermute),
    forward+backward, bf16 vs the same module converted with mxmoe.convert."""
    import copy

    import mxmoe
    from mxmoe.demo.model import MoE, MoEModelArgs  # the demo's TorchTitan-style MoE layer

    dev = torch.device("cuda")
    torch.manual_seed(0)
    layer = MoE(MoEModelArgs(dim=dim, moe_hidden=hidden, num_experts=experts, top_k=top_k))
    layer.init_weights(0.02)
    layer = layer.to(dev, torch.bfloat16)
    mx_layer = mxmoe.convert(copy.deepcopy(layer), recipe=recipe, backend=backend)
    x = torch.randn(tokens, dim, device=dev, dtype=torch.bfloat16, requires_grad=True)

    def step(mod):
        def run():
            x.grad = None
            for p in mod.parameters():
                p.grad = None
            mod(x.view(1, tokens, dim)).float().square().mean().backward()
            touch_weights(*mod.parameters())  # a new optimizer step each time (both sides)
        return run

    bf16_us, mx_us = _time_us(step(layer), reps), _time_us(step(mx_layer), reps)
    return {"layer": f"MoE tokens={tokens} dim={dim} hidden={hidden} experts={experts} top{top_k}",
            "recipe": recipe, "bf16_us": bf16_us, "scaled_us": mx_us, "speedup": bf16_us / mx_us}


def profile_step(shape, recipe: Optional[str], backend: str, out_dir: str) -> str:
    """Per-kernel CUDA time of one forward+backward (bf16 torch._grouped_mm when recipe is None):
    the breakdown that explains a ratio."""
    import mxmoe
    from torch.profiler import ProfilerActivity, profile

    m, n, k, g, jagged = shape
    dev = torch.device("cuda")
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16, requires_grad=True)
    w = torch.randn(g, n, k, device=dev, dtype=torch.bfloat16).mul_(k**-0.5).requires_grad_(True)
    dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
    offs = _offsets(m, g, jagged, dev)

    def step():
        a.grad = w.grad = None
        if recipe is None:
            y = torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
        else:
            y = mxmoe.grouped_mm(a, w.transpose(-2, -1), offs, recipe=recipe, backend=backend)
        y.backward(dy)

    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    title = f"per-kernel CUDA time, 5 steps, {(m, n, k, g)} {recipe or 'bf16'}"
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=14, max_name_column_width=70)
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"profile-{m}-{n}-{k}-{g}-{recipe or 'bf16'}.txt"), "w") as f:
        f.write(title + "\n" + table)
    return title + "\n" + table


def _fmt(col: str, v) -> str:
    if v is None:
        return "-"
    if col.endswith("speedup") or col in ("peak_mem_ratio", "scaled_vs_torchao_e2e"):
        return f"{v:.3f}x"
    return f"{v:.1f}" if isinstance(v, float) else str(v)


def _table(rows: List[dict], cols: List[str]) -> str:
    cells = [[_fmt(c, r[c]) for c in cols] for r in rows]
    widths = [max([len(c)] + [len(x[i]) for x in cells]) for i, c in enumerate(cols)]
    line = lambda xs: "  ".join(x.ljust(w) for x, w in zip(xs, widths))
    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(x) for x in cells])


def _script_main(name: str, argv: List[str]) -> int:
    """bench/<name>.py, next to this file."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent / f"{name}.py"
    if not path.is_file():
        print(f"{path} not found")
        return 2
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module.main(argv)


def _host_main(argv: List[str]) -> int:
    return _script_main("bench_host", argv)


def main(args) -> int:
    if args.host is not None:
        return _host_main(args.host)
    if args.moe is not None:
        return _script_main("bench_moe", args.moe)
    if not torch.cuda.is_available():
        print("mxmoe bench needs a CUDA device (benchmarks run on the GPU machine)")
        return 2
    env = _env()
    print(f"device {env['device']}, torch {torch.__version__}, commit {env['commit']}, {env['date']}")
    modes = {"all": ["eager", "compiled", "cuda_graph"], "both": ["eager", "compiled"], "eager": ["eager"],
             "compiled": ["compiled"], "graph": ["cuda_graph"], "graph-mb": ["cuda_graph_mb"]}[args.compile]
    rows = []
    for name in args.shapes.split(","):
        for shape in SHAPES[name]:
            for recipe in args.recipes.split(","):
                for mode in modes:
                    try:
                        row = bench_grouped_mm(shape, recipe, args.backend, mode, args.reps, args.micro_batches)
                    except Exception as e:  # report and keep going: one failing case must not hide the rest
                        print(f"FAILED {shape} {recipe} {mode}: {type(e).__name__}: {e}")
                        continue
                    row.date, row.commit, row.device = env["date"], env["commit"], env["device"]
                    rows.append(asdict(row))
                    print(_table([rows[-1]], list(rows[-1])[:10]).splitlines()[-1], flush=True)
                    torch.cuda.empty_cache()
    layers = []
    if not args.no_moe_layer:
        for recipe in args.recipes.split(","):
            try:
                layers.append(bench_moe_layer(recipe, args.backend, args.reps))
            except Exception as e:
                print(f"FAILED MoE layer {recipe}: {type(e).__name__}: {e}")
    for spec in filter(None, args.profile.split(",")):
        name, _, g = spec.partition(":")
        for shape in SHAPES[name]:
            if g and shape[3] != int(g):
                continue
            for recipe in [None] + args.recipes.split(","):
                try:
                    print(profile_step(shape, recipe, args.backend, args.out))
                except Exception as e:
                    print(f"FAILED profile {shape} {recipe}: {type(e).__name__}: {e}")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "e2e.json"), "w") as f:
        json.dump({"rows": rows, "moe_layer": layers, **env}, f, indent=1)
    cols = ["A_shape", "B_shape", "recipe", "mode", "micro_batches", "bf16_e2e_us", "scaled_e2e_us", "scaled_e2e_speedup",
            "bf16_fwd_us", "scaled_fwd_us", "scaled_fwd_speedup", "peak_mem_ratio", "torchao_e2e_us",
            "scaled_vs_torchao_e2e"]
    print()
    print(_table(rows, cols) if rows else "no rows")
    for layer in layers:
        print(f"{layer['layer']} {layer['recipe']}: bf16 {layer['bf16_us']:.0f} us, mxmoe {layer['scaled_us']:.0f} us, "
              f"{layer['speedup']:.3f}x")
    return 0


if __name__ == "__main__":
    import sys

    _parser = argparse.ArgumentParser(prog="bench_e2e.py", description=__doc__.splitlines()[1])
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
