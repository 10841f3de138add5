#!/usr/bin/env python3
"""FSDP2 MX all-gather: what each rank pays per optimizer step to send expert weights as MX tiles.

For each BENCH.md MoE config (gate_up (E_loc, 2I, H) and down (E_loc, H, I) of one rank's shard,
E_loc = experts / --ranks), on one GPU:
  pack_us      fsdp_pre_all_gather's work: quantize the local shard into 128x128 tiles (FP8 codes
               along K) and pack one E8M0 scale byte per tile (mxmoe/distributed/fsdp.py: _tile_codes);
               once per optimizer step (the weight cache serves the backward's re-gather)
  unpack_us    fsdp_post_all_gather's work on the gathered (E, N, K) codes: the transposed codes and
               both scale layouts (MXGatheredWeight); once per all-gather
  copy_bf16_us FSDP2's own copy-in of the bf16 shard (what the default path does instead of pack_us)
  requant_us   what the gathered bf16 weight costs without the MX all-gather: ops.sm90_tile128_weight
               on the whole (E, N, K) weight, per forward and again per backward re-gather
  bytes_ratio  all-gathered bytes (codes + tile scales) / bf16 bytes of the same weight
Timing: CUDA events around --reps back-to-back calls after --warmup, median of 5 such runs.

  python3 bench/bench_distributed.py [--ranks 8] [--configs NAMES] [--out bench/results/distributed.json]
  python3 bench/bench_distributed.py --device cpu --configs tiny   (smoke test)

A benchmark, not a test: nothing here asserts a time.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ (bench_meta)
from bench_meta import commit_id  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))  # the source tree's mxmoe first (as bench_models.py)

CONFIGS = {  # name: (hidden H, expert intermediate I, experts E) from BENCH.md "MoE layer configs"
    "qwen3-30b-a3b": (2048, 768, 128),
    "deepseek-v3": (7168, 2048, 256),
    "llama4-scout": (5120, 8192, 16),
    "mixtral-8x7b": (4096, 14336, 8),
    "tiny": (128, 128, 8),
}


def _time_us(fn, device, reps, warmup):
    for _ in range(warmup):
        fn()
    runs = []
    for _ in range(5):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            end.synchronize()
            runs.append(start.elapsed_time(end) * 1e3 / reps)
        else:
            t = time.perf_counter()
            for _ in range(reps):
                fn()
            runs.append((time.perf_counter() - t) * 1e6 / reps)
    return statistics.median(runs)


def measure(name, ranks, device, reps, warmup):
    from mxmoe import ops
    from mxmoe.distributed.fsdp import MXGatheredWeight, _tile_codes

    H, I, E = CONFIGS[name]
    e_loc = max(1, E // ranks)
    rows = []
    for weight, (n, k) in (("gate_up", (2 * I, H)), ("down", (H, I))):
        w = (torch.randn(e_loc, n, k, device=device) * 0.02).to(torch.bfloat16)
        codes, grid = _tile_codes(w, 0)
        full_codes = codes.repeat(ranks, 1, 1)  # stands in for the gathered (E, N, K) codes
        full_grid = grid.repeat(ranks, 1, 1)
        full = w.repeat(ranks, 1, 1)
        flat = torch.empty(w.numel(), dtype=w.dtype, device=device)
        row = {
            "config": name, "weight": weight, "ranks": ranks, "local_shape": [e_loc, n, k],
            "pack_us": _time_us(lambda: _tile_codes(w, 0), device, reps, warmup),
            "unpack_us": _time_us(lambda: MXGatheredWeight(full_codes.view(torch.float8_e4m3fn), full_grid, 0,
                                                           torch.bfloat16), device, reps, warmup),
            "copy_bf16_us": _time_us(lambda: flat.copy_(w.view(-1)), device, reps, warmup),
            "requant_us": _time_us(lambda: ops.sm90_tile128_weight(full, 0), device, reps, warmup),
            "bytes_ratio": (codes.numel() + grid.numel()) / (2 * w.numel()),
        }
        rows.append(row)
        del w, full, full_codes, full_grid
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _commit():
    return commit_id("unknown")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--configs", default="qwen3-30b-a3b,deepseek-v3,llama4-scout,mixtral-8x7b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--out", default=os.path.join("bench", "results", "distributed.json"))
    args = p.parse_args(argv)
    device = torch.device(args.device)
    rows = []
    for name in args.configs.split(","):
        if name not in CONFIGS:
            raise SystemExit(f"--configs: unknown {name!r}; expected some of {', '.join(CONFIGS)}")
        rows += measure(name, args.ranks, device, args.reps, args.warmup)
    meta = {"date": datetime.date.today().isoformat(), "commit": _commit(),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "what": "FSDP2 MX all-gather per-rank cost (bench/bench_distributed.py)"}
    print(f"MX all-gather cost per rank ({meta['device']}, {meta['commit']}, {args.ranks} ranks)")
    print(f"{'config':15} {'weight':8} {'local (E,N,K)':>20} {'pack us':>9} {'unpack us':>10} {'bf16 copy':>10} "
          f"{'requant us':>11} {'bytes':>6}")
    for r in rows:
        print(f"{r['config']:15} {r['weight']:8} {str(tuple(r['local_shape'])):>20} {r['pack_us']:9.1f} "
              f"{r['unpack_us']:10.1f} {r['copy_bf16_us']:10.1f} {r['requant_us']:11.1f} {r['bytes_ratio']:6.3f}")
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"meta": meta, "mx_all_gather": rows}, f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
