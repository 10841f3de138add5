"""Where one MoE layer's fwd+bwd holds its memory, without a GPU: the layer runs under FakeTensorMode
(shapes only, no data, no kernels), and every op output's storage is tracked from the op that made it
until it is freed. Prints the peak of the live op outputs and what is alive there. The inputs (x, the
weights, dout) are not counted; op-internal temporaries are not seen (a GPU's peak also holds them),
and no allocator rounding. For the GPU's number, `python -m mxmoe bench --moe` (peak_mib).

  python3 bench/moe_memory.py [--config qwen3-30b-a3b] [--tokens 16384] [--impl mxmoe_tile128] [--top 12]
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
    """The op outputs alive after each op; the largest total seen and its contents."""

    def __init__(self, skip, skip_ops=()):
        super().__init__()
        self.skip, self.skip_ops, self.live, self.peak, self.at, self.contents = skip, skip_ops, {}, 0, None, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                if id(st) not in self.skip and id(st) not in self.live and not any(o in str(func) for o in self.skip_ops):
                    self.live[id(st)] = (st.nbytes(), str(func), tuple(t.shape), t.dtype)
                    weakref.finalize(st, self.live.pop, id(st), None)
        total = sum(v[0] for v in self.live.values())
        if total > self.peak:
            self.peak, self.at, self.contents = total, str(func), sorted(self.live.values(), key=lambda v: -v[0])
        return out


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
    a = p.parse_args()
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
