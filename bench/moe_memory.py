"""Where one MoE layer's fwd+bwd holds its memory.

Without a GPU (default): the layer runs under FakeTensorMode (shapes only, no data, no kernels), and
every op output's storage is tracked from the op that made it until it is freed. Prints the peak of
the live op outputs and what is alive there. The inputs (x, the weights, dout) are not counted;
op-internal temporaries are not seen (a GPU's peak also holds them), and no allocator rounding.

On a GPU (--device cuda): bench --moe's step itself (bench_moe.Case: the weights written first, grads
set to None, a warm-up step before), with the CUDA caching allocator's history recorded over the
measured step. Prints the step's peak above what was allocated before it (bench --moe's peak_mib), the
blocks allocated before the step and freed before the peak (the previous step's weight forms, say),
and the blocks the step allocated that are alive at the peak, with the Python line that allocated
them: op-internal temporaries included.

  python3 bench/moe_memory.py [--config qwen3-30b-a3b] [--tokens 16384] [--impl mxmoe_tile128] [--top 12]
  python3 bench/moe_memory.py --device cuda [--config ...] [--impl ...]     (on the GPU machine)
"""
import argparse
import os
import sys
import warnings
import weakref

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_moe  # noqa: E402


class LiveOutputs(TorchDispatchMode):
    """The op outputs alive after each op, at their storages' current sizes (a storage the layer released
    early, h at its last read, counts 0 from then); the largest total seen and its contents."""

    def __init__(self, skip, skip_ops=()):
        super().__init__()
        self.skip, self.skip_ops, self.live, self.peak, self.at, self.contents = skip, skip_ops, {}, 0, None, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                if id(st) not in self.skip and id(st) not in self.live and not any(o in str(func) for o in self.skip_ops):
                    self.live[id(st)] = (weakref.ref(st), str(func), tuple(t.shape), t.dtype)
                    weakref.finalize(st, self.live.pop, id(st), None)
        now = [(r().nbytes(), f, s, d) for r, f, s, d in self.live.values() if r() is not None]
        total = sum(v[0] for v in now)
        if total > self.peak:
            self.peak, self.at, self.contents = total, str(func), sorted(now, key=lambda v: -v[0])
        return out


def _alloc_site(frames) -> str:
    """The innermost frame in mxmoe or the benchmark (else the innermost frame) as file:line function."""
    frames = frames or []
    # Skip the op wrappers (ops.py, torch's dispatch): the line that asked for the op is the useful one.
    mine = [f for f in frames if ("/mxmoe/" in f["filename"] or "/bench/" in f["filename"])
            and not f["filename"].endswith("/mxmoe/ops.py")]
    f = (mine or frames or [{"filename": "?", "line": 0, "name": "?"}])[0]
    return f"{os.path.basename(f['filename'])}:{f['line']} {f['name']}"


def gpu_peak(cfg, tokens: int, impl: str, top: int) -> None:
    """bench --moe's peak_mib step with the allocator's history: what is alive at the step's peak."""
    dev = torch.device("cuda")
    activation, layout = ("gpt_oss", "interleaved") if cfg.gpt_oss else ("swiglu", "concatenated")
    case = bench_moe.Case(cfg, tokens, dev)
    run = case.step(case.forward(impl, None, activation, layout))
    run()  # warm: kernels, the weight cache's entries, the allocator's segments
    case.zero_grads()
    torch.cuda.synchronize(dev)
    base = torch.cuda.memory_allocated(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    try:
        run()
        torch.cuda.synchronize(dev)
        snap = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    peak_alloc = torch.cuda.max_memory_allocated(dev) - base
    # Replay the step's events: blocks it allocated (live), blocks from before it that it freed (old).
    live, old_freed, cur, best, at = {}, 0, 0, -1, None
    for ev in snap["device_traces"][torch.cuda.current_device()]:
        if ev["action"] == "alloc":
            live[ev["addr"]] = ev
            cur += ev["size"]
        elif ev["action"] == "free_requested":
            if live.pop(ev["addr"], None) is None:
                old_freed += ev["size"]
            cur -= ev["size"]
        else:
            continue
        if cur > best:
            best, at = cur, (dict(live), old_freed)
    mib = 2**20
    blocks, freed = at if at else ({}, 0)
    print(f"{cfg.name} T={tokens} {impl} on {torch.cuda.get_device_name(dev)}: before the step {base / mib:.0f} MiB; "
          f"peak above it {peak_alloc / mib:.0f} MiB (max_memory_allocated), {best / mib:.0f} MiB from the "
          f"recorded events; at the peak: {sum(e['size'] for e in blocks.values()) / mib:.0f} MiB allocated by the "
          f"step alive, {freed / mib:.0f} MiB from before the step freed")
    for e in sorted(blocks.values(), key=lambda e: -e["size"])[:top]:
        print(f"  {e['size'] / mib:8.1f} MiB  {_alloc_site(e.get('frames'))}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="qwen3-30b-a3b", choices=sorted(bench_moe.CONFIGS))
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--impl", default="mxmoe_tile128",
                   choices=["mxmoe_bf16", "mxmoe_tile128", "mxmoe_exact", bench_moe.BF16_GATHER,
                            bench_moe.BF16_GATHERED])
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--without-weight-forms", action="store_true",
                   help="leave the weights' quantized forms out (bench --moe's peak_mib does: the previous step's "
                        "forms are in its baseline and are replaced by this step's)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="cpu: the FakeTensor trace of op outputs; cuda: the allocator's history on the GPU")
    a = p.parse_args()
    if a.device == "cuda":
        if a.impl not in bench_moe.RECIPES:
            p.error(f"--impl {a.impl}: --device cuda takes {sorted(bench_moe.RECIPES)}")
        gpu_peak(bench_moe.CONFIGS[a.config], a.tokens, a.impl, a.top)
        return
    import mxmoe

    # The CPU's backend takes the bf16 gather GEMMs' paths (their reference ops) Hopper's would take.
    from mxmoe.backends.sm90 import Sm90Backend

    pieces = {bench_moe.BF16_GATHER: mxmoe.backends.BF16_GATHER_PIECES, bench_moe.BF16_GATHERED: frozenset()}
    mxmoe.backends.get_backend(mxmoe.backends.resolve_backend("auto", torch.device("cpu"))).bf16_gather_gemms = \
        pieces.get(a.impl, Sm90Backend().bf16_gather_pieces(bench_moe.CONFIGS[a.config].hidden))
    cfg = bench_moe.CONFIGS[a.config]
    T, H, I, E, k = a.tokens, cfg.hidden, cfg.intermediate, cfg.experts, cfg.top_k
    activation, layout = ("gpt_oss", "interleaved") if cfg.gpt_oss else ("swiglu", "concatenated")
    warnings.filterwarnings("ignore", message=".*data pointer of FakeTensor.*")
    bf16 = torch.bfloat16
    with FakeTensorMode():
        # The CPU's paths take the same branches as Hopper's for these shapes (backends/phases.py).
        x = torch.empty(T, H, dtype=bf16).requires_grad_()
        idx = torch.empty(T, k, dtype=torch.int64)
        w = torch.empty(T, k, dtype=bf16).requires_grad_()
        w13 = torch.empty(E, 2 * I, H, dtype=bf16).requires_grad_()
        w2 = torch.empty(E, H, I, dtype=bf16).requires_grad_()
        b13 = torch.empty(E, 2 * I, dtype=bf16).requires_grad_() if cfg.bias else None
        b2 = torch.empty(E, H, dtype=bf16).requires_grad_() if cfg.bias else None
        dout = torch.empty(T, H, dtype=bf16)
        inputs = [t for t in (x, idx, w, w13, w2, b13, b2, dout) if t is not None]
        track = LiveOutputs({id(t.untyped_storage()) for t in inputs},
                            ("_weight", "weight_forms") if a.without_weight_forms else ())
        with track:
            out = mxmoe.moe_experts(x, idx, w, w13, w2, recipe=bench_moe.RECIPES[a.impl], activation=activation,
                                    layout=layout, bias13=b13, bias2=b2)
            out.backward(dout)
    mib = 2**20
    print(f"{cfg.name} T={T} {a.impl}: inputs {sum(t.untyped_storage().nbytes() for t in inputs) / mib:.0f} MiB; "
          f"peak of the live op outputs {track.peak / mib:.0f} MiB ({track.peak} bytes), after {track.at}")
    for n, f, s, d in track.contents[:a.top]:
        print(f"  {n / mib:8.1f} MiB  {f:45s} {s} {str(d).replace('torch.', '')}")


if __name__ == "__main__":
    main()
