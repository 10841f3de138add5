#!/usr/bin/env python3
"""TorchTitan on mxmoe, measured beside TorchTitan's own bf16 MoE in the same run (H200).

  layer  torchao's reference MoE (TorchTitan's MoE as torchao 0.18 ships it in its wheel) at torchao's
         test size: dim 5120, hidden 8192, 8 routed experts + 1 shared, top-1 sigmoid router,
         score_before_experts=True (and False), a non-zero expert bias, 8 x 2048 tokens, and the same
         model without its shared expert (bf16 in both, as many FLOPs as the routed experts at
         top-1, so it bounds the whole model's ratio), and with it converted too (shared_experts=True: "+shared"
         rows). The bf16 model against
         the same model after mxmoe.convert(recipe=...), eager and torch.compile'd: fwd+bwd ms
         (weights written before every step, so the FP8 weight forms are rebuilt each step),
         SQNR of the output / input grad / parameter grads (torchao's bars: 23 / 27 / 21 dB),
         the load-balancing counts compared bitwise.
  train  TorchTitan 0.3's Trainer on a debug-size MoE model (qwen3 'debugmodel_moe': dim 256, 8 layers,
         64 experts of 768, top-8; or deepseek_v3 'debugmodel'), on the project's synthetic language
         (mxmoe/demo/data.py: nothing downloaded), bf16 against the same config with
         MXMoEConverter in converters=[...]: loss curve, tokens/s, peak memory, expert load (max/mean
         tokens per expert). Each variant runs in its own process (the Trainer owns the process group).

  python bench/bench_torchtitan.py layer --out layer.json
  python bench/bench_torchtitan.py train --steps 300 --out train.json
  python bench/bench_torchtitan.py table layer.json train.json --out bench/results/torchtitan.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bench/ (bench_meta)
from bench_meta import commit_id  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))


def _meta(command: str) -> dict:
    import torch

    commit = commit_id()
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    return {"commit": commit, "date": time.strftime("%Y-%m-%d"), "gpu": gpu, "torch": torch.__version__,
            "command": command}


def _sqnr(a, b) -> float:
    import torch

    a, b = a.float(), b.float()
    return float(20 * torch.log10(b.norm() / (a - b).norm()))


# ---- layer: torchao's reference MoE ------------------------------------------------------------------


def _reference_moe_module():
    import importlib.metadata
    import importlib.util

    path = importlib.metadata.distribution("torchao").locate_file("test/prototype/moe_training/reference_moe.py")
    spec = importlib.util.spec_from_file_location("torchao_reference_moe", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # torch.compile resolves the module's globals through sys.modules
    spec.loader.exec_module(mod)
    return mod


def _time_ms(fn, iters: int, warmup: int = 3) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def bench_layer(args) -> dict:
    import copy

    import torch
    import torch.nn.functional as F

    import mxmoe

    ref_mod = _reference_moe_module()
    dim, hidden, batch, seq = args.dim, args.hidden, args.batch, args.seq
    rows = []
    # (score_before_experts, shared experts): torchao's test model both ways, then without its bf16
    # shared expert (as many FLOPs as the routed experts at top-1), which mxmoe leaves in bf16
    for score_before, n_shared in ((True, 1), (False, 1), (True, 0)):
        margs = ref_mod.MoEArgs(num_experts=8, num_shared_experts=n_shared, use_grouped_mm=True,
                                score_before_experts=score_before, load_balance_coeff=1e-3)
        torch.manual_seed(42)
        base = ref_mod.MoE(margs, dim, hidden).to(torch.bfloat16).cuda()
        base.init_weights(0.02, torch.device("cuda"))
        with torch.no_grad():
            base.expert_bias.copy_(torch.linspace(-0.02, 0.02, 8, device="cuda"))
        x = torch.randn(batch, seq, dim, dtype=torch.bfloat16, device="cuda")
        target = torch.randn_like(x)
        models = {"bf16": base}
        for r in args.recipes:
            models[r] = mxmoe.convert(copy.deepcopy(base), recipe=r)
            if n_shared:  # the shared expert on the fused layer too (opt-in: shared_experts=True)
                models[r + "+shared"] = mxmoe.convert(copy.deepcopy(base), recipe=r, shared_experts=True)
        # correctness against the bf16 model, eager, one step
        outs = {}
        for name, m in models.items():
            m.zero_grad(set_to_none=True)
            m.tokens_per_expert.zero_()
            xi = x.clone().requires_grad_()
            y = m(xi)
            F.mse_loss(y, target).backward()
            outs[name] = (y.detach(), xi.grad, {n: p.grad for n, p in m.named_parameters()},
                          m.tokens_per_expert.clone())
        y0, dx0, g0, c0 = outs["bf16"]
        for mode in ("eager", "compiled"):
            times = {}
            for name, m in models.items():
                run_m = torch.compile(m) if mode == "compiled" else m
                params = [p for p in m.parameters()]

                def step():
                    with torch.no_grad():
                        for p in params:  # weights written before every step (as an optimizer would)
                            p.mul_(1.0)
                    xi = x.detach().requires_grad_()
                    F.mse_loss(run_m(xi), target).backward()
                    for p in params:
                        p.grad = None

                torch.cuda.reset_peak_memory_stats()
                times[name] = (_time_ms(step, args.iters), torch.cuda.max_memory_allocated() / 2**30)
            for name, (ms, peak) in times.items():
                row = {"bench": "layer", "model": "torchao reference MoE", "score_before_experts": score_before,
                       "shared_experts": n_shared,
                       "mode": mode, "impl": name, "tokens": batch * seq, "dim": dim, "hidden": hidden,
                       "ms": ms, "ratio_vs_bf16": times["bf16"][0] / ms, "peak_gib": peak}
                if name != "bf16":
                    y, dx, g, c = outs[name]
                    row.update(out_sqnr=_sqnr(y, y0), input_grad_sqnr=_sqnr(dx, dx0),
                               min_param_grad_sqnr=min(_sqnr(g[n], g0[n]) for n in g0),
                               counts_bitwise_equal=bool(torch.equal(c, c0)))
                rows.append(row)
                print(json.dumps(row), flush=True)
        del models, base
        torch.cuda.empty_cache()
    return {"meta": _meta("python bench/bench_torchtitan.py layer " + " ".join(sys.argv[2:])), "rows": rows}


# ---- train: TorchTitan's Trainer ----------------------------------------------------------------------


def _synthetic_windows(steps, batch, seq, seed):
    from mxmoe.demo.data import SyntheticLanguage, make_batches

    return make_batches(SyntheticLanguage(), steps, batch, seq, seed)[0]


class _Recorder:
    """Loss, step time and expert load (max/mean tokens per expert, mean over the MoE layers) per step."""

    def __init__(self, trainer, moes, counts_attr):
        import torch

        self.losses, self.step_t, self.loads, self.t_last = [], [], [], None
        self.moes, self.attr = moes, counts_attr
        real_log = trainer.metrics_processor.log

        def log(step, loss, max_loss, grad_norm, *a, **k):
            torch.cuda.synchronize()
            now = time.perf_counter()
            if self.t_last is not None:
                self.step_t.append(now - self.t_last)
            self.t_last = now
            self.losses.append(float(loss))
            return real_log(step, loss, max_loss, grad_norm, *a, **k)

        trainer.metrics_processor.log = log
        for m in moes:
            m.register_forward_hook(self._load)

    def _load(self, module, inputs, output):
        c = getattr(module, self.attr).float()
        self.loads.append(float(c.max() / c.mean().clamp_min(1)))

    def row(self, args, model_name, tokens_per_step):
        import torch

        skip = max(5, len(self.step_t) // 10)  # compile and warm-up steps out of the rate
        n = len(self.moes)
        per_step = [statistics.mean(self.loads[i:i + n]) for i in range(0, len(self.loads) - n + 1, n)]
        return {"bench": "train", "model": model_name, "impl": args.variant,
                "mode": "compiled" if args.compile else "eager", "steps": args.steps,
                "tokens_per_step": tokens_per_step,
                "tokens_per_s": tokens_per_step / statistics.median(self.step_t[skip:]),
                "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
                "final_loss": statistics.mean(self.losses[-max(1, len(self.losses) // 10):]), "loss": self.losses,
                "max_mean_load_first": statistics.mean(per_step[:10]),
                "max_mean_load_last": statistics.mean(per_step[-10:]), "moe_layers": n}


def _train_one(args) -> dict:
    import importlib.util

    if importlib.util.find_spec("torchtitan.protocols.model_converter") is not None:
        return _train_one_v02(args)
    return _train_one_v03(args)


def _train_one_v02(args) -> dict:
    """torchtitan 0.2.x: its Trainer from a JobConfig, the model converter listed by name."""
    import dataclasses

    import torch

    import torchtitan
    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.config import ConfigManager
    from torchtitan.models.moe.moe import MoE
    from torchtitan.protocols.train_spec import get_train_spec, register_train_spec
    from torchtitan.train import Trainer

    windows = _synthetic_windows(args.steps, args.batch, args.seq, args.seed)

    class SyntheticLoader(BaseDataLoader):
        def __iter__(self):
            for w in windows:
                yield {"input": w[:, :-1]}, w[:, 1:]

        def state_dict(self):
            return {}

        def load_state_dict(self, state_dict):
            pass

    base = get_train_spec(args.model)
    model_args = dict(base.model_args)
    flavor = args.flavor or ("debugmodel_moe" if args.model == "qwen3" else "debugmodel")
    if args.layers or args.vocab:
        over = {k: v for k, v in (("n_layers", args.layers), ("vocab_size", args.vocab)) if v}
        model_args[flavor] = dataclasses.replace(model_args[flavor], **over)
    if args.score_before is not None:
        moe_args = dataclasses.replace(model_args[flavor].moe_args, score_before_experts=args.score_before)
        model_args[flavor] = dataclasses.replace(model_args[flavor], moe_args=moe_args)
    register_train_spec("mxmoe_bench", dataclasses.replace(
        base, model_args=model_args, build_dataloader_fn=lambda **kw: SyntheticLoader(),
        build_tokenizer_fn=None, build_validator_fn=None))
    cli = ["--model.name", "mxmoe_bench", "--model.flavor", flavor, "--training.steps", str(args.steps),
           "--training.seq_len", str(args.seq), "--training.local_batch_size", str(args.batch),
           "--activation_checkpoint.mode", "none", "--metrics.log_freq", "1", "--debug.seed", str(args.seed),
           "--job.dump_folder", os.path.join(args.workdir, f"{args.variant}-{int(args.compile)}")]
    if args.variant != "bf16":
        import mxmoe.integrations.torchtitan_converter  # noqa: F401  registers "mxmoe.<recipe>"

        cli += ["--model.converters", f"mxmoe.{args.variant}"]
    if args.compile:
        cli += ["--compile.enable"]
    trainer = Trainer(ConfigManager().parse_args(cli))
    moes = [m for part in trainer.model_parts for m in part.modules() if isinstance(m, MoE)]
    rec = _Recorder(trainer, moes, "tokens_per_expert")
    torch.cuda.reset_peak_memory_stats()
    trainer.train()
    row = rec.row(args, f"torchtitan {torchtitan.__version__} {args.model} {flavor}"
                  + (f" {args.layers} layers" if args.layers else ""), args.batch * args.seq)
    row["converted"] = sum("_mxmoe_convert" in m.experts.__dict__ for m in moes)
    row["score_before_experts"] = bool(moes[0].score_before_experts)
    trainer.close()
    return row


def _train_one_v03(args) -> dict:
    """One Trainer run (one variant) in this process; returns its row."""
    from dataclasses import dataclass

    import torch

    from torchtitan.components.dataloader import BaseDataLoader
    from torchtitan.components.tokenizer import BaseTokenizer

    class SyntheticTokenizer(BaseTokenizer):
        """The synthetic language's ids as they are (the data arrives tokenized)."""

        @dataclass(kw_only=True, slots=True)
        class Config(BaseTokenizer.Config):
            vocab_size: int = 2048

        def __init__(self, config, **kwargs):
            super().__init__()
            self.vocab_size = config.vocab_size
            self.eos_id = 0

        def encode(self, *args, **kwargs):
            raise NotImplementedError("the synthetic data arrives as token ids")

        def decode(self, ids, *args, **kwargs):
            return " ".join(map(str, ids))

        def get_vocab_size(self):
            return self.vocab_size

    class SyntheticLoader(BaseDataLoader):
        """Fixed-order windows of the synthetic language (the same for every variant)."""

        @dataclass(kw_only=True, slots=True)
        class Config(BaseDataLoader.Config):
            steps: int = 300
            seed: int = 0

        def __init__(self, config, *, seq_len, local_batch_size, **kwargs):
            self.windows = _synthetic_windows(config.steps, local_batch_size, seq_len, config.seed)

        def __iter__(self):
            for w in self.windows:
                pos = torch.arange(w.shape[1] - 1).repeat(w.shape[0], 1)
                yield {"input": w[:, :-1], "positions": pos}, w[:, 1:]

        def state_dict(self):
            return {}

        def load_state_dict(self, state_dict):
            pass

    from torchtitan.components.metrics import MetricsProcessor
    from torchtitan.config import CompileConfig
    from torchtitan.models.common.moe import MoE

    if args.model == "qwen3":
        from torchtitan.models.qwen3 import model_registry
        from torchtitan.models.qwen3.config_registry import qwen3_moe_debug as base_config
        flavor = "debugmodel_moe"
    else:
        from torchtitan.models.deepseek_v3 import model_registry
        from torchtitan.models.deepseek_v3.config_registry import deepseek_v3_debugmodel as base_config
        flavor = "debugmodel"
    flavor = args.flavor or flavor
    converters = None
    if args.variant != "bf16":
        from mxmoe.integrations.torchtitan_converter import MXMoEConverter

        converters = [MXMoEConverter.Config(recipe=None if args.variant == "mxmoe_bf16" else args.variant)]
    config = base_config()
    config.model_spec = model_registry(flavor, converters=converters)
    config.tokenizer = SyntheticTokenizer.Config(vocab_size=2048)
    config.dataloader = SyntheticLoader.Config(steps=args.steps, seed=args.seed)
    config.training.steps = args.steps
    config.training.seq_len = args.seq
    config.training.local_batch_size = args.batch
    config.activation_checkpoint = None
    config.metrics = MetricsProcessor.Config(log_freq=1)
    config.compile = CompileConfig(enable=args.compile, components=["model", "loss"])
    config.debug.seed = args.seed
    config.dump_folder = os.path.join(args.workdir, f"{args.variant}-{'compiled' if args.compile else 'eager'}")
    trainer = config.build()
    moes = [m for part in trainer.model_parts for m in part.modules() if isinstance(m, MoE)]
    rec = _Recorder(trainer, moes, "tokens_per_expert_E")
    torch.cuda.reset_peak_memory_stats()
    trainer.train()
    row = rec.row(args, f"torchtitan {args.model} {flavor}", args.batch * args.seq)
    row["converted"] = sum(type(m.routed_experts).__name__ == "MXMoERoutedExperts" for m in moes)
    trainer.close()
    return row


def bench_train(args) -> dict:
    rows = []
    env = dict(os.environ, WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29500 + os.getpid() % 1000))
    for compile_ in ([False, True] if args.compiled else [False]):
        for variant in args.variants:
            out = os.path.join(args.workdir, f"row-{variant}-{int(compile_)}.json")
            cmd = [sys.executable, __file__, "_train_one", "--variant", variant, "--steps", str(args.steps),
                   "--seq", str(args.seq), "--batch", str(args.batch), "--model", args.model, "--seed",
                   str(args.seed), "--workdir", args.workdir, "--out", out] + (["--compile"] if compile_ else [])
            for flag, v in (("--flavor", args.flavor), ("--layers", args.layers), ("--vocab", args.vocab)):
                if v:
                    cmd += [flag, str(v)]
            if args.score_before is not None:
                cmd += ["--score-before", str(int(args.score_before))]
            print("run:", " ".join(cmd[2:]), flush=True)
            rc = subprocess.run(cmd, env=env).returncode
            if rc != 0 or not os.path.exists(out):
                rows.append({"bench": "train", "impl": variant, "mode": "compiled" if compile_ else "eager",
                             "error": f"exit {rc}"})
                continue
            rows.append(json.load(open(out)))
    by = {(r["mode"], r["impl"]): r for r in rows if "error" not in r}  # one model per run
    for r in rows:
        b = by.get((r.get("mode"), "bf16"))
        if b and "error" not in r:
            r["ratio_vs_bf16"] = r["tokens_per_s"] / b["tokens_per_s"]
            r["final_loss_vs_bf16"] = r["final_loss"] / b["final_loss"] - 1
            r["peak_vs_bf16"] = r["peak_gib"] / b["peak_gib"]
    return {"meta": _meta("python bench/bench_torchtitan.py train " + " ".join(sys.argv[2:])), "rows": rows}


def table(doc: dict) -> str:
    lines = []
    for r in doc["rows"]:
        if r.get("bench") == "layer":
            extra = ""
            if r["impl"] != "bf16":
                extra = (f" | SQNR out {r['out_sqnr']:.1f} / dx {r['input_grad_sqnr']:.1f} / min dW "
                         f"{r['min_param_grad_sqnr']:.1f} | counts equal {r['counts_bitwise_equal']}")
            lines.append(f"layer sbe={r['score_before_experts']!s:5} shared={r.get('shared_experts', 1)} {r['mode']:8} {r['impl']:22} {r['ms']:8.2f} ms "
                         f"{r['ratio_vs_bf16']:.2f}x bf16 | peak {r['peak_gib']:.1f} GiB{extra}")
        elif "error" in r:
            lines.append(f"train {r['mode']:8} {r['impl']:22} FAILED ({r['error']})")
        else:
            lines.append(f"train {r['mode']:8} {r['impl']:22} {r['tokens_per_s']:9.0f} tok/s "
                         f"{r.get('ratio_vs_bf16', 1):.2f}x | final loss {r['final_loss']:.4f} "
                         f"({100 * r.get('final_loss_vs_bf16', 0):+.2f}%) | peak {r['peak_gib']:.2f} GiB | "
                         f"load max/mean {r['max_mean_load_first']:.2f} -> {r['max_mean_load_last']:.2f}")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["layer", "train", "table", "_train_one"])
    p.add_argument("inputs", nargs="*")
    p.add_argument("--out")
    p.add_argument("--recipes", nargs="+", default=["mxfp8_rceil_tile128"])
    p.add_argument("--dim", type=int, default=5120)
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--seq", type=int, default=None)
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--model", choices=["qwen3", "deepseek_v3"], default="qwen3")
    p.add_argument("--variants", nargs="+", default=["bf16", "mxfp8_rceil_tile128"])
    p.add_argument("--variant")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--flavor", help="train: the model flavor (default: the debug MoE model)")
    p.add_argument("--layers", type=int, help="train (torchtitan 0.2): override the flavor's layer count")
    p.add_argument("--vocab", type=int, help="train (torchtitan 0.2): override the flavor's vocabulary size")
    p.add_argument("--score-before", type=lambda v: bool(int(v)), default=None,
                   help="train (torchtitan 0.2): 1/0 sets the MoE's score_before_experts")
    p.add_argument("--compiled", action="store_true", help="train: also run each variant compiled")
    p.add_argument("--workdir", default="/tmp/mxmoe-torchtitan")
    args = p.parse_args()
    os.makedirs(args.workdir, exist_ok=True)
    if args.what == "layer":
        args.batch, args.seq = args.batch or 8, args.seq or 2048
        doc = bench_layer(args)
    elif args.what == "train":
        args.batch, args.seq = args.batch or 4, args.seq or 4096
        doc = bench_train(args)
    elif args.what == "_train_one":
        row = _train_one(args)
        json.dump(row, open(args.out, "w"))
        return
    else:
        docs = [json.load(open(f)) for f in args.inputs]
        doc = {"meta": docs[0]["meta"], "rows": [r for d in docs for r in d["rows"]]}
    print(table(doc))
    if args.out:
        json.dump(doc, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()
