"""A few fwd+bwd steps of one MoE layer config, nothing timed: the target for profilers (ncu, nsys)
on the GPU machine, with the same inputs, routing and weight writes as bench_moe.py.

  python3 bench/moe_step.py [--config qwen3-30b-a3b] [--tokens 16384] [--impl mxmoe_tile128] [--steps 3]
  ncu -k regex:grouped_k_kernel --launch-skip 4 -c 1 --section SourceCounters -o REPORT \\
      python3 bench/moe_step.py
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_moe  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="qwen3-30b-a3b", choices=sorted(bench_moe.CONFIGS))
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--impl", default="mxmoe_tile128", choices=sorted(bench_moe.RECIPES))
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("moe_step.py: needs a CUDA GPU (it is a profiler target)")
    cfg = bench_moe.CONFIGS[a.config]
    activation, layout = ("gpt_oss", "interleaved") if cfg.gpt_oss else ("swiglu", "concatenated")
    case = bench_moe.Case(cfg, a.tokens, torch.device("cuda"))
    run = case.step(case.forward(a.impl, None, activation, layout))
    for _ in range(a.steps):
        run()
    torch.cuda.synchronize()
    print(f"{a.steps} steps of {cfg.name} T={a.tokens} {a.impl}")


if __name__ == "__main__":
    main()
