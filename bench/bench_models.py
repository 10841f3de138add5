#!/usr/bin/env python3
"""Proof on a real model: a transformers Qwen3-MoE trained with bf16 experts and with mxmoe's, to a plateau.

The model is transformers' own Qwen3MoeForCausalLM built from a config with random init (no
downloads; mxmoe/demo/hf_qwen3.py), trained on the project's synthetic language (mxmoe/demo/data.py)
by the training demo's loop (mxmoe/demo/train.py: AdamW, warm-up + cosine, grad clip, Qwen3's router
aux loss). What differs between the runs is one line: experts_implementation="grouped_mm"
(transformers' bf16 torch._grouped_mm experts, the baseline) or "mxmoe" with config.mxmoe_recipe.
On CUDA the model is bf16 in every run (transformers' grouped_mm experts compute in the weights'
dtype, so fp32 master weights would give the baseline fp32 GEMMs).

For each recipe and seed (the seed sets the init and the data sample) one eager run of --steps
steps gives the loss curve, final train loss (mean of the last 10% of steps), held-out loss (the same
held-out batches for every run), tokens/s and peak memory; then one compiled run per recipe
(torch.compile of the whole model, --compile-steps steps, the first --compile-warmup not timed)
gives compiled tokens/s. --profile adds a per-kernel breakdown (torch.profiler, CUDA time by kernel
class) of a few eager steps per recipe.

Verdicts (printed and in the JSON): loss parity, each MXFP8 recipe's mean held-out loss within 1% of
bf16's mean and inside the bf16 seeds' [min, max]; speed, tokens/s >= 1.3x bf16 eager and compiled.

  python bench/bench_models.py                      # the full proof (H200: about 10 minutes)
  python bench/bench_models.py --recipes bf16 mxfp8_rceil_tile128 --seeds 0 --steps 100   # a part
  python bench/bench_models.py --merge a.json b.json --out bench/results/models.json

Speed preset (--shape qwen3-30b-a3b; BENCH.md "Model configs"): the Qwen3-30B-A3B-shaped model (hidden 2048,
32 / 4 heads of 128, 128 experts of 768 top-8 with norm_topk_prob, 4 layers, vocab 32768; ~2.7B parameters),
seq 4096 x batch 4 (16K tokens a step), bf16, fused AdamW, random init and random tokens: tokens/s and peak
memory only, no loss verdict (the tokens are uniform noise; each row keeps its losses as a sanity check).
Recipes: bf16 (transformers' experts_implementation="grouped_mm", the baseline), mxmoe_bf16
(experts_implementation="mxmoe" with config.mxmoe_recipe="bf16": mxmoe's fused layer without quantization)
and mxfp8_rceil_tile128 (any mxmoe recipe may be named). Each run builds the model from the same seed and
trains --steps steps eager (the first --timing-warmup not timed), then --compile-steps steps of
torch.compile(model) (the first --compile-warmup not timed: they compile); every eager run comes before the
compiled ones, so a run cut short keeps the eager table. The step is the proof's (model, Qwen3's aux loss,
backward, grad clip, fused AdamW step) without the LR schedule and load counters. Ratios vs transformers
bf16 and vs mxmoe bf16 in the same mode; targets: tile128 compiled >= 1.25x bf16 and >= 1.15x mxmoe bf16.
H200 estimate: model build a few s, eager 100-250 ms a step, compile 30-60 s a recipe: about 3-5 minutes.

  python bench/bench_models.py --shape qwen3-30b-a3b --out models-qwen3-30b-a3b.json
  python bench/bench_models.py --shape qwen3-30b-a3b --compile-steps 0         # eager only (about 1 minute)
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import statistics
import sys
import time
from dataclasses import asdict, replace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))
sys.path.insert(0, HERE)

import torch  # noqa: E402

from bench_meta import commit_id  # noqa: E402

BASELINE = "bf16"
DEFAULT_RECIPES = [BASELINE, "mxfp8_rceil_tile128", "mxfp8_rceil"]
SPEED_TARGET, LOSS_TOL = 1.3, 0.01

# ~0.62B parameters: Qwen3-MoE's shape family (head_dim 64, GQA 4:1, fine-grained experts of width
# 768 as Qwen3-30B-A3B, 64 experts top-8), 4 layers; 16 x 1024 tokens per step.
MODEL = dict(dim=1024, n_layers=4, n_heads=16, kv_heads=4, num_experts=64, top_k=8, moe_hidden=768,
             seq_len=1024, batch_size=16)
# For the CPU test of this script (tests/python/test_bench_models.py).
TINY = dict(dim=64, n_layers=1, n_heads=4, kv_heads=2, num_experts=4, top_k=2, moe_hidden=64, seq_len=32,
            batch_size=2)

# The speed preset (--shape): BENCH.md "Model configs". head_dim 128 is not hidden / heads (64).
MODEL_QWEN3_30B = dict(dim=2048, n_layers=4, n_heads=32, kv_heads=4, head_dim=128, num_experts=128, top_k=8,
                       moe_hidden=768, seq_len=4096, batch_size=4, vocab=32768)
SHAPES = {"qwen3-30b-a3b": MODEL_QWEN3_30B}
# --shape with --tiny (the CPU test); head_dim differs from dim / heads here as well.
TINY_SPEED = dict(dim=64, n_layers=1, n_heads=4, kv_heads=2, head_dim=32, num_experts=4, top_k=2, moe_hidden=64,
                  seq_len=32, batch_size=2, vocab=256)
MXMOE_BF16 = "mxmoe_bf16"  # experts_implementation="mxmoe", mxmoe_recipe="bf16": the fused layer, no quantization
SPEED_RECIPES = [BASELINE, MXMOE_BF16, "mxfp8_rceil_tile128"]
# The issue's targets for the preset: (recipe, mode, reference recipe, minimum tokens/s ratio).
SPEED_TARGETS = [("mxfp8_rceil_tile128", "compiled", BASELINE, 1.25),
                 ("mxfp8_rceil_tile128", "compiled", MXMOE_BF16, 1.15)]
MODES = ("eager", "compiled")
SPEED_DATA = "random tokens, uniform over the vocab: speed only, no loss verdict"


def _config(args, seed: int, recipe: str):
    """The training config of one run (a bf16 run's config names the default MXFP8 recipe: unused)."""
    from mxmoe.demo.train import TrainConfig

    return TrainConfig(model="hf-qwen3", device=args.device, steps=args.steps, seed=seed, lr=args.lr,
                       warmup_steps=args.warmup, recipe=TrainConfig.recipe if recipe == BASELINE else recipe,
                       eval_batches=args.eval_batches,
                       **{**args.shape, **({"batch_size": args.batch_size} if args.batch_size else {})})


def _batches(args, seeds):
    from mxmoe.demo.data import SyntheticLanguage, make_batches

    lang = SyntheticLanguage()
    out = {}
    for s in seeds:
        t = time.perf_counter()
        steps = max(args.steps, args.compile_steps, 16 if args.profile or args.profile_compiled else 0)
        out[s] = make_batches(lang, steps, args.batch_size or args.shape["batch_size"], args.shape["seq_len"], seed=s)
        print(f"data: seed {s}, {steps} steps in {time.perf_counter() - t:.1f} s", flush=True)
    ev, _ = make_batches(lang, args.eval_batches, args.batch_size or args.shape["batch_size"], args.shape["seq_len"],
                         seed=1_000_003)
    return lang, out, ev


_KINDS = [("fp8/bf16 GEMM", ("gemm", "cutlass", "xmma", "nvjet", "sm90_", "wgmma")),
          ("mxmoe quantize", ("quant", "tile_kernel", "mxmoe")),
          ("attention", ("flash", "fmha", "attention", "sdpa")),
          ("elementwise/reduce", ("elementwise", "reduce", "vectorized", "copy", "cat", "index", "scatter", "gather",
                                  "softmax", "norm", "sort", "radix", "cub"))]


def _kind(name: str) -> str:
    n = name.lower()
    for kind, keys in _KINDS:
        if any(k in n for k in keys):
            return kind
    return "other"


def _profile(model_builder, steps: int = 4):
    """CUDA time per kernel class and the top kernels over `steps` steps (after 3 warm-up steps, which
    also compile a compiled model)."""
    from torch.profiler import ProfilerActivity, profile

    run = model_builder()
    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            run()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", None)
        if t is None:
            t = e.cuda_time_total
        if t > 0:
            rows.append((e.key, t / steps, e.count // steps))
    rows.sort(key=lambda r: -r[1])
    kinds = {}
    for name, us, _ in rows:
        kinds[_kind(name)] = kinds.get(_kind(name), 0.0) + us
    return {"per_step_us_by_kind": kinds, "top": [{"kernel": n[:120], "us_per_step": us, "calls_per_step": c}
                                                 for n, us, c in rows[:15]]}


def _step_fn(cfg, name, lang, batches, device):
    """A closure running one training step (for the profiler)."""
    from mxmoe.demo.train import _loss, build_model, make_optimizer

    model, _, gemm_ctx, amp = build_model(name, cfg, lang.vocab_size, device)
    opt = make_optimizer(model, cfg, device)
    b = batches[0].to(device)
    step_model = torch.compile(model) if cfg.compile else model

    def run():
        with gemm_ctx(), amp():
            loss = _loss(step_model, b) + model.aux_loss()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return run


def _save_partial(args, runs) -> None:
    """The runs so far (args.out + '.partial'), for a run that the device's time limit cuts short."""
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        speed = {"shape": args.shape_name, "model": args.shape, "seeds": args.seeds[:1],
                 "tokens_per_step": (args.batch_size or args.shape["batch_size"]) * args.shape["seq_len"],
                 "params_b": runs[0]["params"] / 1e9, "date": time.strftime("%Y-%m-%d"),
                 "commit": commit_id("?"), "torch": torch.__version__,
                 "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
                 "data": SPEED_DATA} if getattr(args, "shape_name", None) and runs else {}
        with open(args.out + ".partial", "w") as f:
            json.dump({"runs": runs, "profiles": {}, **speed}, f)


def run(args) -> dict:
    from mxmoe.demo.train import train_one

    seeds = args.seeds
    lang, data, ev = _batches(args, seeds)
    runs = []
    for s in seeds if args.steps else []:  # seed-major: a run cut short still holds whole seeds
        for recipe in args.recipes:
            cfg = _config(args, s, recipe)
            batches, entropy = data[s]
            t = time.perf_counter()
            r = train_one(recipe, cfg, lang.vocab_size, batches, ev, torch.device(args.device), progress=False)
            n = len(r.losses)
            w = max(1, n // 10)
            rec = {"recipe": recipe, "seed": s, "mode": "eager", "steps": n, "precision": r.precision,
                   "final_train_loss": sum(r.losses[-w:]) / w, "eval_loss": r.eval_loss,
                   "tokens_per_s": r.tokens_per_s, "peak_mem_gib": r.peak_mem_bytes / 2**30, "params": r.params,
                   "wall_s": r.wall_s, "source_entropy": entropy, "loss": r.losses,
                   "expert_load_minmax": [min(min(x) for x in r.expert_load), max(max(x) for x in r.expert_load)]
                   if r.expert_load else None}
            # Plateau: the drop of the 10%-of-steps mean over the last 20% of the run.
            if n >= 20:
                prev = sum(r.losses[-2 * w:-w]) / w
                rec["last_decile_drop"] = (prev - rec["final_train_loss"]) / prev
            runs.append(rec)
            _save_partial(args, runs)
            print(f"{recipe:>22} seed {s} eager: train {rec['final_train_loss']:.4f} held-out {r.eval_loss:.4f} "
                  f"{r.tokens_per_s:,.0f} tok/s peak {rec['peak_mem_gib']:.1f} GiB ({time.perf_counter() - t:.0f} s)",
                  flush=True)
    if args.compile_steps:
        for recipe in args.recipes:
            s = seeds[0]
            cfg = replace(_config(args, s, recipe), compile=True,
                          steps=args.compile_steps, timing_warmup=args.compile_warmup, eval_batches=1)
            t = time.perf_counter()
            torch._dynamo.reset()
            r = train_one(recipe, cfg, lang.vocab_size, data[s][0][:args.compile_steps], ev[:1], torch.device(args.device),
                          progress=False)
            runs.append({"recipe": recipe, "seed": s, "mode": "compiled", "steps": args.compile_steps,
                         "timed_steps": args.compile_steps - args.compile_warmup, "tokens_per_s": r.tokens_per_s,
                         "peak_mem_gib": r.peak_mem_bytes / 2**30, "wall_s": r.wall_s, "precision": r.precision,
                         "params": r.params})
            _save_partial(args, runs)
            print(f"{recipe:>22} compiled: {r.tokens_per_s:,.0f} tok/s ({time.perf_counter() - t:.0f} s incl. compile)",
                  flush=True)
    profiles = {}
    for compiled in ([False] if args.profile else []) + ([True] if args.profile_compiled else []):
        for recipe in args.recipes:
            cfg = replace(_config(args, seeds[0], recipe), compile=compiled)
            torch._dynamo.reset()
            key = recipe + (" compiled" if compiled else "")
            profiles[key] = _profile(lambda: _step_fn(cfg, recipe, lang, data[seeds[0]][0], torch.device(args.device)))
    return {"runs": runs, "profiles": profiles}


# ---- the speed preset (--shape) ------------------------------------------------------------------


def speed_impl(recipe: str):
    """(experts_implementation, config.mxmoe_recipe) of a speed-preset recipe."""
    if recipe == BASELINE:
        return "grouped_mm", None
    if recipe == MXMOE_BF16:
        return "mxmoe", "bf16"  # the integration runs "bf16" as recipe None: the fused layer unquantized
    from mxmoe.recipes import get_recipe

    return "mxmoe", get_recipe(recipe).name


def _speed_model(args, recipe: str, device: torch.device):
    from mxmoe.demo.hf_qwen3 import HFQwen3MoE, qwen3_moe_config

    sh = args.shape
    impl, mx = speed_impl(recipe)
    conf = qwen3_moe_config(vocab_size=sh["vocab"], dim=sh["dim"], n_layers=sh["n_layers"], n_heads=sh["n_heads"],
                            num_experts=sh["num_experts"], top_k=sh["top_k"], moe_hidden=sh["moe_hidden"],
                            max_seq_len=sh["seq_len"], kv_heads=sh["kv_heads"], head_dim=sh["head_dim"],
                            experts_implementation=impl, mxmoe_recipe=mx)
    torch.manual_seed(args.seeds[0])  # the same init in every run
    with device:  # built on the device (a 2.7B fp32 init on the host takes longer than the timed steps)
        model = HFQwen3MoE(conf)
    if device.type == "cuda":
        model = model.to(torch.bfloat16)
    what = ("transformers' experts_implementation='grouped_mm' (torch._grouped_mm)" if impl == "grouped_mm" else
            f"experts_implementation='mxmoe', config.mxmoe_recipe={mx!r} (mxmoe's fused expert layer"
            + (", no quantization)" if mx == "bf16" else ")"))
    return model, what + ("; model bf16" if device.type == "cuda" else "; model fp32 (CPU)")


def _speed_data(args, device: torch.device) -> torch.Tensor:
    """Random tokens, uniform over the vocab: (steps, batch, seq_len + 1)."""
    g = torch.Generator().manual_seed(1_000_003 + args.seeds[0])
    n = max(args.steps, args.compile_steps, 1)
    b = args.batch_size or args.shape["batch_size"]
    return torch.randint(0, args.shape["vocab"], (n, b, args.shape["seq_len"] + 1), generator=g).to(device)


def _speed_one(args, recipe: str, mode: str, data: torch.Tensor, device: torch.device) -> dict:
    """One timed run: build the model, `steps` training steps, the first `warm` untimed."""
    from mxmoe.demo.train import TrainConfig, _loss, make_optimizer

    steps, warm = (args.steps, args.timing_warmup) if mode == "eager" else (args.compile_steps, args.compile_warmup)
    warm = max(0, min(warm, steps - 1))
    cuda = device.type == "cuda"
    torch._dynamo.reset()
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    at_start = torch.cuda.memory_allocated(device) if cuda else math.nan  # > 0: an earlier run not freed
    t_build = time.perf_counter()
    model, precision = _speed_model(args, recipe, device)
    opt = make_optimizer(model, TrainConfig(lr=args.lr), device)  # AdamW, fused on CUDA (the proof's)
    step_model = torch.compile(model, backend=args.compile_backend) if mode == "compiled" else model
    model.train()
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    losses = torch.zeros(steps, device=device)
    t0 = t_timed = time.perf_counter()
    for i in range(steps):
        if i == warm:
            if cuda:
                torch.cuda.synchronize(device)
            t_timed = time.perf_counter()
        loss = _loss(step_model, data[i % len(data)])
        total = loss + model.aux_loss()
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses[i] = loss.detach()
    if cuda:
        torch.cuda.synchronize(device)
    t_end = time.perf_counter()
    tokens_per_step = data.shape[1] * (data.shape[2] - 1)
    timed = steps - warm
    row = {"shape": args.shape_name, "recipe": recipe, "mode": mode, "seed": args.seeds[0], "steps": steps,
           "timed_steps": timed, "tokens_per_step": tokens_per_step,
           "tokens_per_s": timed * tokens_per_step / max(t_end - t_timed, 1e-9),
           "step_ms": 1000 * (t_end - t_timed) / timed,
           "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if cuda else math.nan,
           "allocated_at_start_gib": at_start / 2**30, "warmup_s": t_timed - t0, "build_s": t0 - t_build,
           "wall_s": t_end - t_build, "precision": precision,
           "compile_backend": args.compile_backend if mode == "compiled" else None,
           "params": sum(p.numel() for p in model.parameters()), "loss": losses.cpu().tolist()}
    del model, opt, step_model, losses, loss, total
    torch._dynamo.reset()
    return row


def run_speed(args) -> dict:
    device = torch.device(args.device)
    data = _speed_data(args, device)
    runs = []
    modes = [m for m, n in zip(MODES, (args.steps, args.compile_steps)) if n]
    for mode in modes:  # every eager run first: a run that the time limit cuts short keeps the eager table
        for recipe in args.recipes:
            r = _speed_one(args, recipe, mode, data, device)
            runs.append(r)
            _save_partial(args, runs)
            print(f"{recipe:>22} {mode:>8}: {r['tokens_per_s']:,.0f} tok/s, {r['step_ms']:.1f} ms/step, peak "
                  f"{r['peak_mem_gib']:.1f} GiB, loss {r['loss'][0]:.3f} -> {r['loss'][-1]:.3f} (build "
                  f"{r['build_s']:.0f} s, {r['warmup_s']:.0f} s untimed, {r['wall_s']:.0f} s in all)", flush=True)
    return {"runs": runs, "profiles": {}}


def summarize_speed(rep: dict) -> dict:
    """Per recipe and mode: mean tokens/s and peak memory, and the ratios to transformers bf16 and to mxmoe
    bf16 in the same mode (nan where the reference or the run is missing)."""
    runs = rep["runs"]
    out = {}
    for rc in dict.fromkeys(r["recipe"] for r in runs):
        s = out[rc] = {}
        for mode in MODES:
            rs = [r for r in runs if r["recipe"] == rc and r["mode"] == mode]
            s[f"tokens_per_s_{mode}"] = _mean([r["tokens_per_s"] for r in rs])
            s[f"step_ms_{mode}"] = _mean([r["step_ms"] for r in rs])
            s[f"peak_mem_gib_{mode}"] = _mean([r["peak_mem_gib"] for r in rs])
    for s in out.values():
        for mode in MODES:
            for ref, key in ((BASELINE, "vs_bf16"), (MXMOE_BF16, "vs_mxmoe_bf16")):
                base = out.get(ref, {}).get(f"tokens_per_s_{mode}", math.nan)
                s[f"{key}_{mode}"] = s[f"tokens_per_s_{mode}"] / base if base == base and base else math.nan
            base = out.get(BASELINE, {}).get(f"peak_mem_gib_{mode}", math.nan)
            s[f"peak_vs_bf16_{mode}"] = s[f"peak_mem_gib_{mode}"] / base if base == base and base else math.nan
    return out


def speed_targets(summary: dict) -> list:
    """The issue's targets, each with the measured ratio and met (None where not measured)."""
    out = []
    for rc, mode, ref, need in SPEED_TARGETS:
        key = ("vs_bf16_" if ref == BASELINE else "vs_mxmoe_bf16_") + mode
        x = summary.get(rc, {}).get(key, math.nan)
        out.append({"recipe": rc, "mode": mode, "vs": ref, "target": need, "ratio": x,
                    "met": (x >= need) if x == x else None})
    return out


def _ref_name(ref: str) -> str:
    return "transformers bf16" if ref == BASELINE else "mxmoe bf16"


def table_speed(rep: dict) -> str:
    m, summ = rep.get("model") or {}, rep["summary"]
    f = lambda v, fmt: format(v, fmt) if isinstance(v, (int, float)) and v == v else "-"  # noqa: E731
    x = lambda v: f(v, ".2f") + "x" if isinstance(v, (int, float)) and v == v else "-"  # noqa: E731
    lines = [f"Qwen3-MoE ({rep.get('shape')} shape: hidden {m.get('dim')}, {m.get('n_heads')}/{m.get('kv_heads')} "
             f"heads of {m.get('head_dim')}, {m.get('num_experts')} experts of {m.get('moe_hidden')} top-"
             f"{m.get('top_k')}, {m.get('n_layers')} layers, vocab {m.get('vocab')}; "
             f"{rep.get('params_b', math.nan):.2f}B params, random init and tokens: speed only, no loss verdict), "
             f"{rep.get('tokens_per_step', 0):,} tokens a step; {rep.get('device', '?')}",
             f"{'recipe':>22} {'mode':>8} {'tok/s':>10} {'ms/step':>8} {'vs transformers bf16':>20} "
             f"{'vs mxmoe bf16':>13} {'peak GiB':>8} {'x bf16':>6}"]
    for mode in MODES:
        for rc, s in summ.items():
            if s[f"tokens_per_s_{mode}"] != s[f"tokens_per_s_{mode}"]:
                continue
            lines.append(f"{rc:>22} {mode:>8} {f(s[f'tokens_per_s_{mode}'], ',.0f'):>10} "
                         f"{f(s[f'step_ms_{mode}'], '.1f'):>8} {x(s[f'vs_bf16_{mode}']):>20} "
                         f"{x(s[f'vs_mxmoe_bf16_{mode}']):>13} {f(s[f'peak_mem_gib_{mode}'], '.1f'):>8} "
                         f"{x(s[f'peak_vs_bf16_{mode}']):>6}")
    for t in rep.get("targets", []):
        verdict = "not measured" if t["met"] is None else ("met" if t["met"] else "NOT met")
        lines.append(f"target: {t['recipe']} {t['mode']} >= {t['target']:.2f}x {_ref_name(t['vs'])}: "
                     f"{x(t['ratio'])}, {verdict}")
    return "\n".join(lines)


# ---- summary -------------------------------------------------------------------------------------


def summarize(rep: dict) -> dict:
    runs = rep["runs"]
    eager = [r for r in runs if r["mode"] == "eager"]
    recipes = list(dict.fromkeys(r["recipe"] for r in runs))
    out = {}
    for rc in recipes:
        ev = [r["eval_loss"] for r in eager if r["recipe"] == rc]
        tr = [r["final_train_loss"] for r in eager if r["recipe"] == rc]
        tps = [r["tokens_per_s"] for r in eager if r["recipe"] == rc]
        comp = [r["tokens_per_s"] for r in runs if r["recipe"] == rc and r["mode"] == "compiled"]
        mem = [r["peak_mem_gib"] for r in eager if r["recipe"] == rc]
        out[rc] = {"seeds": len(ev), "eval_mean": _mean(ev), "eval_min": min(ev, default=math.nan),
                   "eval_max": max(ev, default=math.nan), "eval_std": statistics.pstdev(ev) if len(ev) > 1 else 0.0,
                   "train_mean": _mean(tr), "tokens_per_s_eager": _mean(tps),
                   "tokens_per_s_compiled": _mean(comp), "peak_mem_gib": _mean(mem),
                   "last_decile_drop": _mean([r.get("last_decile_drop", math.nan) for r in eager if r["recipe"] == rc])}
    base = out.get(BASELINE)
    if base:
        for rc, s in out.items():
            if rc == BASELINE:
                continue
            s["rel_eval_vs_bf16"] = s["eval_mean"] / base["eval_mean"] - 1
            s["inside_bf16_spread"] = base["eval_min"] <= s["eval_mean"] <= base["eval_max"]
            s["loss_parity"] = abs(s["rel_eval_vs_bf16"]) <= LOSS_TOL and s["inside_bf16_spread"]
            s["speedup_eager"] = s["tokens_per_s_eager"] / base["tokens_per_s_eager"]
            s["speedup_compiled"] = s["tokens_per_s_compiled"] / base["tokens_per_s_compiled"]
            s["speed_target_met"] = s["speedup_eager"] >= SPEED_TARGET and s["speedup_compiled"] >= SPEED_TARGET
            s["peak_mem_vs_bf16"] = s["peak_mem_gib"] / base["peak_mem_gib"]
    return out


def _mean(xs):
    xs = [x for x in xs if x == x]
    return sum(xs) / len(xs) if xs else math.nan


def table(rep: dict) -> str:
    summ = rep["summary"]
    lines = [f"Qwen3-MoE ({rep.get('params_b', math.nan):.2f}B params, random init), {rep.get('steps')} steps x "
             f"{rep.get('tokens_per_step', 0):,} tokens, seeds {rep.get('seeds')}; {rep.get('device', '?')}",
             f"{'recipe':>22} {'held-out mean':>13} {'[min, max]':>17} {'vs bf16':>8} {'parity':>6} "
             f"{'tok/s eager':>11} {'x':>5} {'tok/s compiled':>14} {'x':>5} {'peak GiB':>8} {'x':>5}"]
    for rc, s in summ.items():
        f = lambda k, fmt: format(s[k], fmt) if k in s and s[k] == s[k] else "-"  # noqa: E731
        evaluated = s["eval_mean"] == s["eval_mean"]  # no eager run (compiled / profile only): no held-out loss
        par = "-" if rc == BASELINE or not evaluated else ("yes" if s.get("loss_parity") else "NO")
        spread = "[%.4f, %.4f]" % (s["eval_min"], s["eval_max"]) if evaluated else "-"
        rel = ("%+.2f%%" % (100 * s["rel_eval_vs_bf16"])) if evaluated and "rel_eval_vs_bf16" in s else "-"
        mean = f"{s['eval_mean']:.4f}" if evaluated else "-"
        lines.append(f"{rc:>22} {mean:>13} {spread:>17} {rel:>8} "
                     f"{par:>6} {f('tokens_per_s_eager', ',.0f'):>11} {f('speedup_eager', '.2f'):>5} "
                     f"{f('tokens_per_s_compiled', ',.0f'):>14} {f('speedup_compiled', '.2f'):>5} "
                     f"{f('peak_mem_gib', '.1f'):>8} {f('peak_mem_vs_bf16', '.2f'):>5}")
    for rc, p in rep.get("profiles", {}).items():
        kinds = ", ".join(f"{k} {v / 1000:.2f} ms" for k, v in sorted(p["per_step_us_by_kind"].items(),
                                                                        key=lambda kv: -kv[1]))
        lines.append(f"  profile {rc}: per step {sum(p['per_step_us_by_kind'].values()) / 1000:.2f} ms GPU: {kinds}")
    return "\n".join(lines)


def _env(args) -> dict:
    from bench_host import env_info

    return env_info(torch.device(args.device))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", dest="shape_name", choices=sorted(SHAPES), default=None,
                   help="the speed preset of that model shape (default: the loss-parity proof)")
    p.add_argument("--recipes", nargs="+", default=None,
                   help="default: %s; --shape: %s" % (" ".join(DEFAULT_RECIPES), " ".join(SPEED_RECIPES)))
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="--shape: the first only")
    p.add_argument("--steps", type=int, default=None,
                   help="eager steps per run (0: compiled runs / profile only); default 1000, --shape 30")
    p.add_argument("--timing-warmup", type=int, default=5, help="--shape: eager steps not timed (default 5)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--warmup", type=int, default=50)
    p.add_argument("--batch-size", type=int, default=0, help="default: %d" % MODEL["batch_size"])
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--compile-steps", type=int, default=None, help="0: no compiled runs; default 40, --shape 30")
    p.add_argument("--compile-warmup", type=int, default=10, help="compiled steps not timed (default 10)")
    p.add_argument("--compile-backend", default="inductor", help=argparse.SUPPRESS)  # aot_eager: the CPU test
    p.add_argument("--profile", action="store_true", help="per-kernel CUDA time of eager steps per recipe")
    p.add_argument("--profile-compiled", action="store_true", help="the same of compiled steps")
    p.add_argument("--merge", nargs="+", help="merge these JSON outputs (runs and profiles) instead of running")
    p.add_argument("--out", default=None)
    p.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # cpu: the script's own test
    p.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # a tiny model (the test)
    args = p.parse_args(argv)
    speed = args.shape_name is not None
    if speed:
        args.shape = TINY_SPEED if args.tiny else SHAPES[args.shape_name]
        args.shape_name += "-tiny" if args.tiny else ""
    else:
        args.shape = TINY if args.tiny else MODEL
    args.recipes = args.recipes or (SPEED_RECIPES if speed else DEFAULT_RECIPES)
    args.steps = (30 if speed else 1000) if args.steps is None else args.steps
    args.compile_steps = (30 if speed else 40) if args.compile_steps is None else args.compile_steps
    if speed and (args.profile or args.profile_compiled):
        p.error("--profile / --profile-compiled: the proof only (not with --shape)")
    if args.merge:
        parts = [json.load(open(f)) for f in args.merge]
        if len({q.get("shape") for q in parts}) > 1:
            p.error("--merge: the files are of different shapes (or proof and speed preset)")
        rep = {**parts[0], "runs": [r for q in parts for r in q["runs"]],
               "profiles": {k: v for q in parts for k, v in q.get("profiles", {}).items()}}
    elif speed:
        if args.device == "cuda" and not torch.cuda.is_available():
            print("bench_models: needs a CUDA device", file=sys.stderr)
            return 2
        for rc in args.recipes:  # an unknown recipe fails now, not after the first runs
            try:
                speed_impl(rc)
            except (KeyError, ValueError) as e:
                p.error(f"--recipes: {rc!r}: {e} (or {BASELINE}, {MXMOE_BF16})")
        import mxmoe  # noqa: F401  (registers the experts implementation)
        import transformers

        t0 = time.perf_counter()
        rep = run_speed(args)
        params = next((r["params"] for r in rep["runs"]), 0)
        rep.update({"shape": args.shape_name, "date": time.strftime("%Y-%m-%d"),
                    "commit": commit_id("?"),
                    "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                    "torch": torch.__version__, "transformers": transformers.__version__, "model": args.shape,
                    "params_b": params / 1e9, "steps": args.steps, "timing_warmup": args.timing_warmup,
                    "compile_steps": args.compile_steps, "compile_warmup": args.compile_warmup,
                    "seeds": args.seeds[:1], "lr": args.lr,
                    "tokens_per_step": (args.batch_size or args.shape["batch_size"]) * args.shape["seq_len"],
                    "data": SPEED_DATA,
                    "command": "python bench/bench_models.py " + " ".join(sys.argv[1:] if argv is None else argv),
                    "env": _env(args), "wall_s": time.perf_counter() - t0})
    else:
        if args.device == "cuda" and not torch.cuda.is_available():
            print("bench_models: needs a CUDA device", file=sys.stderr)
            return 2
        import mxmoe  # noqa: F401  (registers the experts implementation)
        import transformers

        t0 = time.perf_counter()
        rep = run(args)
        params = next((r["params"] for r in rep["runs"] if "params" in r), 0)
        rep.update({"date": time.strftime("%Y-%m-%d"), "commit": commit_id("?"),
                    "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                    "torch": torch.__version__, "transformers": transformers.__version__, "model": args.shape,
                    "params_b": params / 1e9,
                    "steps": args.steps, "seeds": args.seeds, "lr": args.lr,
                    "tokens_per_step": (args.batch_size or args.shape["batch_size"]) * args.shape["seq_len"],
                    "env": _env(args), "wall_s": time.perf_counter() - t0})
    if rep.get("shape"):
        rep["summary"] = summarize_speed(rep)
        rep["targets"] = speed_targets(rep["summary"])
        print(table_speed(rep))
    else:
        rep["summary"] = summarize(rep)
        print(table(rep))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(rep, f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
