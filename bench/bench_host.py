#!/usr/bin/env python3
"""Host enqueue time and eager-vs-graph device time of one grouped GEMM forward+backward (BENCH.md method).

For each shape and each impl in {bf16 torch._grouped_mm (the peer), mxmoe.grouped_mm recipe
mxfp8_rceil_tile128, mxmoe.grouped_mm recipe mxfp8_rceil}, one step is
    out = grouped_mm(A, W.transpose(-2, -1), offs); out.backward(dY)
(the grads of loss = (out * dY).sum() for a fixed random dY; grads for A and W), and we report
  host_us        host enqueue time of one step: sync, t0, enqueue the step, t1 (time.perf_counter around
                 the Python calls only, no synchronize inside the window; the sync before each step keeps
                 the GPU queue from filling up and blocking the host, which would make host time read as
                 device time); median over --reps steps after warm-up. The impls are interleaved step by
                 step, so drift on the shared machine hits all of them alike.
  torch_host_us  the same for bf16 torch._grouped_mm in the same run (the ratio host_us / torch_host_us)
  eager_us       device time per step in eager mode: --reps steps back to back, one sync at the end
                 (CUDA events around the loop), divided by --reps
  graph_us       the same step captured once in a CUDA graph (warm-up on a side stream, grads set to None
                 before capture so they live in the graph's pool, as torch's CUDA-graph docs do for whole-
                 network capture) and replayed --reps times; null on CPU
Targets (printed per row, PASS/MISS): host_us <= 1.3 x torch_host_us (mxmoe rows); on the fine-grained
shapes eager_us <= 1.1 x graph_us (a gap between eager and graph is host overhead).

Shapes (A (M, K), W (G, N, K), equal groups, multiples of 128 rows, the last group takes the rest, bf16):
  fine_gate_up  M 32768, N 1536, K 1024, G 16     (BENCH.md fine-grained, Qwen3-like gate_up)
  fine_down     M 32768, N 1024, K 768,  G 16     (BENCH.md fine-grained, Qwen3-like down)
  seeds:G       M 16640, N 8192, K 5120, G in 1, 4, 16, 64 (BENCH.md seeds table)
  tiny          M 512,   N 256,  K 256,  G 4      (CPU smoke test)
--shapes takes a comma list of these names and of the groups 'fine' (both fine-grained) and 'seeds'
(all four G); default fine,seeds.

  python3 bench/bench_host.py [--shapes fine,seeds] [--reps 50] [--json PATH]
  python -m mxmoe bench --host [the same arguments]
  python3 bench/bench_host.py --device cpu --shapes tiny --reps 3     (smoke test, no GPU)

Rows go to --json (default $OUT/host.json when OUT is set, else out/bench/host.json) with the fields
shape, impl, host_us, torch_host_us, eager_us, graph_us, date, commit, device (and M, N, K, G, the ratios,
the PASS/MISS marks, and torch_syncs: synchronizing torch calls seen in one step under
torch.cuda.set_sync_debug_mode('warn'), null on CPU). A benchmark, not a test: nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from typing import Callable, Dict, List, Optional, Tuple

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ (bench_meta)
from bench_meta import commit_id  # noqa: E402

# name: (M, N, K, G)
SHAPES: Dict[str, Tuple[int, int, int, int]] = {
    "fine_gate_up": (32768, 1536, 1024, 16),
    "fine_down": (32768, 1024, 768, 16),
    **{f"seeds:{g}": (16640, 8192, 5120, g) for g in (1, 4, 16, 64)},
    "tiny": (512, 256, 256, 4),
}
GROUPS = {"fine": ["fine_gate_up", "fine_down"], "seeds": [f"seeds:{g}" for g in (1, 4, 16, 64)]}
FINE = set(GROUPS["fine"])  # the shapes with the eager-within-10%-of-graph target

PEER = "bf16"
IMPLS = [PEER, "mxfp8_rceil_tile128", "mxfp8_rceil"]  # bf16 torch._grouped_mm, then mxmoe recipes
HOST_TARGET = 1.3  # host_us <= 1.3 x torch_host_us
GRAPH_TARGET = 1.1  # fine-grained: eager_us <= 1.1 x graph_us


def parse_shapes(spec: str) -> List[str]:
    names: List[str] = []
    for s in filter(None, (x.strip() for x in spec.split(","))):
        if s in GROUPS:
            names += GROUPS[s]
        elif s in SHAPES:
            names.append(s)
        else:
            raise SystemExit(f"unknown shape {s!r}; choose from {', '.join(list(GROUPS) + list(SHAPES))}")
    return list(dict.fromkeys(names))


def offsets(m: int, g: int, device) -> torch.Tensor:
    """Equal groups of a multiple of 128 rows; the last group takes the rest (as bench/bench_e2e.py)."""
    base = (m // g) // 128 * 128 if m >= 128 * g else m // g
    sizes = torch.full((g,), base, dtype=torch.long)
    sizes[-1] += m - sizes.sum()
    return torch.cumsum(sizes, 0).to(torch.int32).to(device)


def env_info(device: torch.device) -> dict:
    commit = commit_id("")
    clocks = ""
    if device.type == "cuda":
        try:
            clocks = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem", "--format=csv,noheader",
                                     f"--id={device.index or 0}"], capture_output=True, text=True,
                                    timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "clocks": clocks,
        "torch": torch.__version__,
    }


class Case:
    """Static inputs of one shape and the fwd+bwd step of each impl on them."""

    def __init__(self, shape: Tuple[int, int, int, int], device: torch.device, backend: str):
        m, n, k, g = shape
        gen = torch.Generator(device=device).manual_seed(0)  # on the device: seeds G=64 W is 2.7 G elements
        rand = lambda *size: torch.randn(*size, generator=gen, device=device, dtype=torch.bfloat16)
        self.device = device
        self.backend = backend
        self.a = rand(m, k).requires_grad_(True)
        self.w = rand(g, n, k).mul_(k**-0.5).requires_grad_(True)
        self.dy = rand(m, n)  # the fixed g of loss = (out * g).sum()
        self.offs = offsets(m, g, device)
        self.out: Optional[torch.Tensor] = None

    def forward(self, impl: str) -> Callable[[], torch.Tensor]:
        a, w, offs = self.a, self.w, self.offs
        if impl == PEER:
            return lambda: torch._grouped_mm(a, w.transpose(-2, -1), offs=offs)
        import mxmoe

        backend = self.backend
        return lambda: mxmoe.grouped_mm(a, w.transpose(-2, -1), offs, recipe=impl, backend=backend)

    def step(self, impl: str) -> Callable[[], None]:
        """One fwd+bwd; the grads accumulate into fresh .grad tensors (zero them first with zero_grads)."""
        fwd, dy = self.forward(impl), self.dy

        def run():
            out = fwd()
            out.backward(dy)  # == ((out * dy).sum()).backward(), without the two extra kernels
            self.out = out

        return run

    def zero_grads(self) -> None:
        """Between steps: grads to None, and the weight written as by an optimizer step (a tracked
        in-place op on one element, x * 1 == x bit for bit), so mxmoe re-quantizes it every step as in
        training without gradient accumulation (its weight cache would otherwise serve every rep)."""
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from bench_e2e import touch_weights

        self.a.grad = None
        self.w.grad = None
        self.out = None
        touch_weights(self.w)

    def check(self, impl: str) -> Optional[int]:
        """One step with the grads checked (shapes, finite), so a broken impl fails before it is timed.
        On CUDA the step runs under torch.cuda.set_sync_debug_mode('warn'): returns the number of
        synchronizing torch calls in one step (a sync inside the step makes host time read as device time;
        syncs inside libmxmoe's own CUDA calls are not seen). None on CPU."""
        self.zero_grads()
        syncs = None
        if self.device.type == "cuda":
            self.step(impl)()  # first call (library load, lazy init) outside the count
            self.zero_grads()
            torch.cuda.synchronize(self.device)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    self.step(impl)()
                finally:
                    torch.cuda.set_sync_debug_mode("default")
            syncs = sum("synchroniz" in str(w.message) for w in caught)
        else:
            self.step(impl)()
        for name, t in (("A", self.a), ("W", self.w)):
            if t.grad is None or t.grad.shape != t.shape:
                raise RuntimeError(f"{impl}: no grad of {name} of shape {tuple(t.shape)}")
        if not bool(torch.isfinite(self.out).all()):
            raise RuntimeError(f"{impl}: non-finite output")
        self.zero_grads()
        return syncs


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host_times_us(case: Case, impls: List[str], reps: int, warmup: int) -> Dict[str, float]:
    """Median host enqueue time of one step per impl, the impls interleaved step by step. Per step:
    zero grads, sync (outside the window), t0, step, t1. GC off in the loop (as timeit does)."""
    steps = {impl: case.step(impl) for impl in impls}
    times: Dict[str, List[float]] = {impl: [] for impl in impls}
    dev = case.device
    gc.collect()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for i in range(warmup + reps):
            for impl, step in steps.items():
                case.zero_grads()
                sync(dev)
                t0 = time.perf_counter()
                step()
                t1 = time.perf_counter()
                if i >= warmup:
                    times[impl].append(t1 - t0)
        sync(dev)
    finally:
        if gc_was_enabled:
            gc.enable()
    case.zero_grads()
    return {impl: statistics.median(ts) * 1e6 for impl, ts in times.items()}


def eager_us(case: Case, impl: str, reps: int, warmup: int) -> float:
    """Device time per step, --reps steps back to back (grads set to None each step, as a training loop's
    zero_grad(set_to_none=True)), one sync at the end."""
    step, dev = case.step(impl), case.device

    def loop(n):
        for _ in range(n):
            case.zero_grads()
            step()

    loop(warmup)
    sync(dev)
    if dev.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        loop(reps)
        end.record()
        end.synchronize()
        us = start.elapsed_time(end) * 1e3 / reps
    else:
        t0 = time.perf_counter()
        loop(reps)
        us = (time.perf_counter() - t0) * 1e6 / reps
    case.zero_grads()
    return us


def graph_us(case: Case, impl: str, reps: int, warmup: int) -> Optional[float]:
    """The step captured once in a CUDA graph (torch docs, whole-network capture: warm-up on a side stream,
    grads None before capture so backward allocates them from the graph's pool and each replay refills them),
    replayed --reps times back to back, one sync at the end. None on CPU."""
    if case.device.type != "cuda":
        return None
    step = case.step(impl)
    s = torch.cuda.Stream(case.device)
    s.wait_stream(torch.cuda.current_stream(case.device))
    with torch.cuda.stream(s):
        for _ in range(max(3, warmup)):
            case.zero_grads()
            step()
    torch.cuda.current_stream(case.device).wait_stream(s)
    case.zero_grads()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()  # case.out, case.a.grad, case.w.grad: the graph's static outputs
    try:
        for _ in range(max(1, warmup)):
            graph.replay()
        torch.cuda.synchronize(case.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / reps
    finally:
        case.zero_grads()
        del graph


def bench_shape(name: str, device: torch.device, impls: List[str], backend: str, reps: int, warmup: int,
                graph: bool) -> List[dict]:
    m, n, k, g = SHAPES[name]
    case = Case(SHAPES[name], device, backend)
    ok, syncs = [], {}
    for impl in impls:
        try:
            syncs[impl] = case.check(impl)
            ok.append(impl)
        except Exception as e:  # report and keep going: one failing impl must not hide the rest
            print(f"FAILED {name} {impl}: {type(e).__name__}: {e}", flush=True)
            case.zero_grads()
    if PEER not in ok:
        print(f"FAILED {name}: the peer {PEER} does not run; skipping the shape", flush=True)
        return []
    host = host_times_us(case, ok, reps, warmup)
    rows = []
    for impl in ok:
        row = {"shape": name, "impl": impl if impl == PEER else f"mxmoe {impl}", "recipe": None if impl == PEER else impl,
               "M": m, "N": n, "K": k, "G": g, "host_us": host[impl], "torch_host_us": host[PEER],
               "eager_us": None, "graph_us": None, "torch_syncs": syncs[impl]}
        try:
            row["eager_us"] = eager_us(case, impl, reps, warmup)
            row["graph_us"] = graph_us(case, impl, reps, warmup) if graph else None
        except Exception as e:
            print(f"FAILED {name} {impl} (device time): {type(e).__name__}: {e}", flush=True)
            case.zero_grads()
        row["host_ratio"] = row["host_us"] / row["torch_host_us"]
        row["host_target"] = "peer" if impl == PEER else ("PASS" if row["host_ratio"] <= HOST_TARGET else "MISS")
        if row["eager_us"] is not None and row["graph_us"] is not None:
            row["eager_graph_ratio"] = row["eager_us"] / row["graph_us"]
            row["graph_target"] = (("PASS" if row["eager_graph_ratio"] <= GRAPH_TARGET else "MISS")
                                   if name in FINE else "-")
        else:
            row["eager_graph_ratio"] = None
            row["graph_target"] = "n/a"
        rows.append(row)
        print(f"{name} {row['impl']}: host {row['host_us']:.1f} us ({row['host_ratio']:.2f}x bf16), "
              f"eager {_f(row['eager_us'])} us, graph {_f(row['graph_us'])} us", flush=True)
    del case
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def _f(v, fmt="{:.1f}") -> str:
    return "null" if v is None else fmt.format(v)


COLS = [("shape", "shape", "{}"), ("impl", "impl", "{}"), ("host_us", "host_us", "{:.1f}"),
        ("torch_host_us", "torch_host_us", "{:.1f}"), ("host_ratio", "host ratio", "{:.2f}x"),
        ("host_target", "<=1.3x", "{}"), ("eager_us", "eager_us", "{:.1f}"), ("graph_us", "graph_us", "{:.1f}"),
        ("eager_graph_ratio", "eager/graph", "{:.3f}"), ("graph_target", "<=1.1 (fine)", "{}")]


def table(rows: List[dict]) -> str:
    head = [h for _, h, _ in COLS]
    cells = [[_f(r.get(key), fmt) for key, _, fmt in COLS] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(head)]
    line = lambda xs: "  ".join(x.ljust(w) for x, w in zip(xs, widths)).rstrip()
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(c) for c in cells])


def summary(rows: List[dict]) -> str:
    mx = [r for r in rows if r["impl"] != PEER]
    host = [r for r in mx if r["host_target"] in ("PASS", "MISS")]
    fine = [r for r in mx if r["graph_target"] in ("PASS", "MISS")]
    return (f"mxmoe rows: host target PASS {sum(r['host_target'] == 'PASS' for r in host)}/{len(host)}; "
            f"fine-grained eager-vs-graph target PASS {sum(r['graph_target'] == 'PASS' for r in fine)}/{len(fine)}")


def host_breakdown(case: Case, impl: str, steps: int = 20, top: int = 8) -> dict:
    """Where one step's host time goes: the torch profiler's self CPU time per op (dispatcher ops:
    mxmoe's C++ ops, aten allocations and kernels' launches), per step, and the rest of the step's wall
    time (Python: grouped_mm's checks, autograd.Function, the autograd engine). The profiler adds its
    own overhead to each op, so the split is a guide and host_us above is the measurement."""
    from torch.profiler import ProfilerActivity, profile

    step = case.step(impl)
    for _ in range(3):
        case.zero_grads()
        step()
    sync(case.device)
    def profiled(run_step: bool):
        """Per-op (self us, calls) totals over `steps` iterations of zero_grads (+ the step), and the
        steps' wall time. One profile for all iterations: a profile per step would add the profiler's
        start-up to every step."""
        wall = 0.0
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                case.zero_grads()
                sync(case.device)
                if run_step:
                    t0 = time.perf_counter()
                    step()
                    wall += time.perf_counter() - t0
                sync(case.device)
        return {e.key: (e.self_cpu_time_total, e.count) for e in prof.key_averages()}, wall

    with_step, wall = profiled(True)
    # zero_grads' own ops (the optimizer-style weight write between steps, outside host_us) measured
    # alone and subtracted, so the split covers the step only.
    between, _ = profiled(False)
    ops = []
    for k, (us, n) in with_step.items():
        b_us, b_n = between.get(k, (0.0, 0))
        if "synchroniz" not in k.lower() and n - b_n > 0:
            ops.append((k, max(us - b_us, 0.0) / steps, (n - b_n) / steps))
    ops.sort(key=lambda r: -r[1])
    in_ops = sum(r[1] for r in ops)
    wall_us = wall * 1e6 / steps
    return {"impl": impl, "wall_us": wall_us, "ops_self_us": in_ops, "python_us": max(wall_us - in_ops, 0.0),
            "top": [{"op": k, "self_us": round(us, 2), "calls": c} for k, us, c in ops[:top]]}


def format_breakdown(name: str, b: dict) -> str:
    lines = [f"  {name} {b['impl']}: {b['wall_us']:.1f} us/step under the profiler = ops {b['ops_self_us']:.1f} "
             f"+ python/autograd {b['python_us']:.1f}"]
    for r in b["top"]:
        lines.append(f"      {r['self_us']:8.2f} us  x{r['calls']:<5g} {r['op']}")
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--shapes", default="fine,seeds",
                   help=f"comma list of {', '.join(list(GROUPS) + list(SHAPES))} (default fine,seeds)")
    p.add_argument("--impls", default=",".join(IMPLS),
                   help=f"comma list of {PEER} and mxmoe recipes (the peer {PEER} is always run)")
    p.add_argument("--backend", default="auto", help="mxmoe.grouped_mm backend")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (smoke test: no CUDA graph column)")
    p.add_argument("--reps", type=int, default=50, help="timed steps per measurement (host: median)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps before each measurement")
    p.add_argument("--no-graph", action="store_true", help="skip the CUDA-graph column")
    p.add_argument("--breakdown", default="fine_gate_up",
                   help="comma list of shapes whose host time is split by op with the torch profiler ('' for none)")
    p.add_argument("--json", default=None,
                   help="rows as JSON (default $OUT/host.json when OUT is set, else out/bench/host.json)")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="bench_host.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_host needs a CUDA device (BENCH.md: benchmarks run on the GPU machine); "
              "for a smoke test use --device cpu --shapes tiny --reps 3")
        return 2
    shapes = parse_shapes(args.shapes)
    impls = list(dict.fromkeys([PEER] + [s.strip() for s in args.impls.split(",") if s.strip()]))
    out_json = args.json or os.path.join(os.environ.get("OUT") or "out/bench", "host.json")
    env = env_info(device)
    graph = device.type == "cuda" and not args.no_graph
    rows: List[dict] = []
    for name in shapes:
        try:
            rows += bench_shape(name, device, impls, args.backend, args.reps, args.warmup, graph)
        except Exception as e:  # e.g. out of memory: report and keep going
            print(f"FAILED {name}: {type(e).__name__}: {e}", flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    breakdowns = []
    for name in [b for b in args.breakdown.split(",") if b.strip() and b.strip() in shapes]:
        try:
            case = Case(SHAPES[name], device, args.backend)
            for impl in impls:
                breakdowns.append({"shape": name, **host_breakdown(case, impl)})
            del case
        except Exception as e:
            print(f"FAILED breakdown {name}: {type(e).__name__}: {e}", flush=True)
    for r in rows:
        r.update(date=env["date"], commit=env["commit"], device=env["device"])
    os.makedirs(os.path.dirname(os.path.abspath(out_json)), exist_ok=True)
    with open(out_json, "w") as f:
        json.dump({"rows": rows, "host_breakdown": breakdowns, **env, "reps": args.reps, "warmup": args.warmup,
                   "targets": {"host_us/torch_host_us": HOST_TARGET, "eager_us/graph_us (fine)": GRAPH_TARGET}},
                  f, indent=1)
    print()
    print("== host enqueue time and eager vs CUDA graph, one grouped_mm fwd+bwd (bench/bench_host.py) ==")
    print(f"device {env['device']}{' clocks ' + env['clocks'] if env['clocks'] else ''}, torch {env['torch']}, "
          f"commit {env['commit'] or '?'}, {env['date']}, reps {args.reps}")
    print(f"targets: host_us <= {HOST_TARGET}x torch_host_us (bf16 torch._grouped_mm, same run); "
          f"fine-grained: eager_us <= {GRAPH_TARGET}x graph_us")
    if device.type == "cpu":
        print("(cpu: kernels run synchronously, so host_us is compute time here; a smoke test of the script only)")
    print(table(rows) if rows else "no rows")
    if rows:
        print(summary(rows))
        synced = [f"{r['shape']} {r['impl']}: {r['torch_syncs']}" for r in rows if r["torch_syncs"]]
        if synced:
            print("synchronizing torch calls inside one step (torch.cuda.set_sync_debug_mode):", "; ".join(synced))
    if breakdowns:
        print("host time by op (torch profiler, self CPU time per step; the rest is Python + autograd):")
        for b in breakdowns:
            print(format_breakdown(b["shape"], b))
    print(f"rows: {out_json}")
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
