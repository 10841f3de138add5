"""`python -m mxmoe train`: train an MoE language model twice -- bf16 expert GEMMs, then MXFP8 experts
through mxmoe's fused expert layer -- from the same init and data order, and compare the loss curves.

Models (--model):
  demo      the project's TorchTitan-style MoE transformer (mxmoe/demo/model.py); its MoE layers are
            switched over by mxmoe.convert (the fused layer on the experts' own w1 / w3 / w2)
  hf-qwen3  a transformers Qwen3-MoE (Qwen3MoeForCausalLM) from a config, random init
            (mxmoe/demo/hf_qwen3.py): the bf16 run uses transformers' own experts
            (experts_implementation="grouped_mm"), the MXFP8 run experts_implementation="mxmoe"

What differs between the two runs is only the expert GEMMs:
  bf16   the model's `torch._grouped_mm` calls take bf16 operands (fp32 accumulation) and give bf16
         results. On CUDA these are real bf16 GEMMs. On CPU torch's bf16 grouped GEMM is ~75x slower
         than fp32, so they are emulated: fp32 GEMMs on bf16-rounded operands, rounded back to bf16
         (the same numerics up to fp32 summation order). The rounding is part of the autograd graph,
         so the output grad and the dgrad/wgrad results are rounded too: backward is bf16 as well.
  mxfp8  each MoE layer's experts run as `mxmoe.moe_experts(..., recipe=...)`: the fused layer
         (dispatch + quantize, FP8 GEMMs with SwiGLU + quantize between them, combine; forward, dgrad
         and wgrad on MXFP8 operands) on the experts' own weights.
The rest of the model runs in fp32 on CPU and, on CUDA, under bf16 autocast (demo) or in bf16
(hf-qwen3: its parameters are bf16, as transformers' grouped_mm experts compute in the weights'
dtype), identically in both runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from .. import _lib
from ..backends import BACKENDS
from ..conversion import convert
from ..recipes import RECIPES, get_recipe
from .data import SyntheticLanguage, make_batches
from .model import MoEModelArgs, MoETransformer

BASELINE = "bf16"


@dataclass
class TrainConfig:
    steps: int = 300
    batch_size: int = 8
    seq_len: int = 128
    dim: int = 128
    n_layers: int = 2
    n_heads: int = 4
    num_experts: int = 8
    top_k: int = 2
    moe_hidden: int = 256
    lr: float = 2e-3
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    seed: int = 0
    recipe: str = "mxfp8_rceil"
    backend: str = "auto"
    device: str = "auto"
    eval_batches: int = 8
    tolerance: float = 0.02  # MXFP8 training loss within 1-2% of bf16 (docs/design/mx-format.md)
    model: str = "demo"  # "demo" | "hf-qwen3"
    kv_heads: int = 0  # hf-qwen3: key/value heads (0: heads // 4)
    compile: bool = False  # torch.compile the model (both runs)
    timing_warmup: int = 2  # steps left out of tokens/s (allocator warm-up, lazy init, compilation)
    fsdp: bool = False  # torchrun: FSDP2 (MX all-gather of tile128 expert weights in the MXFP8 run)
    ep: bool = False  # torchrun: expert parallel over all ranks (FP8 dispatch), the rest FSDP2

    @property
    def distributed(self) -> bool:
        return self.fsdp or self.ep

    def model_args(self, vocab_size: int) -> MoEModelArgs:
        return MoEModelArgs(
            vocab_size=vocab_size, dim=self.dim, n_layers=self.n_layers, n_heads=self.n_heads,
            max_seq_len=self.seq_len, num_experts=self.num_experts, top_k=self.top_k,
            moe_hidden=self.moe_hidden,
        )


@dataclass
class RunResult:
    name: str
    precision: str
    losses: list[float] = field(default_factory=list)  # training loss at every step
    eval_loss: float = float("nan")  # held-out loss after training
    tokens_per_s: float = float("nan")
    wall_s: float = float("nan")
    expert_load: list[list[float]] = field(default_factory=list)  # per layer, fraction per expert
    peak_mem_bytes: float = float("nan")  # CUDA: peak allocated during training
    params: int = 0


# -- precision of the expert GEMMs ----------------------------------------------------------------------


def _round_bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(t.dtype)


class Bf16GroupedMM(TorchFunctionMode):
    """Runs every `torch._grouped_mm` in bf16 (see the module docstring), leaving other ops alone."""

    def __init__(self, emulate: bool):
        super().__init__()
        self.emulate = emulate

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not torch._grouped_mm:
            return func(*args, **kwargs)
        a, b, *rest = args
        if self.emulate:
            return _round_bf16(func(_round_bf16(a), _round_bf16(b), *rest, **kwargs))
        return func(a.to(torch.bfloat16), b.to(torch.bfloat16), *rest, **kwargs).to(a.dtype)


def baseline_description(device: torch.device) -> str:
    if device.type == "cuda":
        return "bf16 expert GEMMs (torch._grouped_mm in bf16); rest of the model under bf16 autocast"
    return (
        "bf16 expert GEMMs emulated on CPU: fp32 torch._grouped_mm on bf16-rounded operands, outputs "
        "and grads rounded to bf16 (= bf16 GEMM numerics; real CPU bf16 GEMMs are ~75x slower); "
        "rest of the model fp32"
    )


def _backend_description(backend: str, device: torch.device) -> str:
    from ..backends import resolve_backend

    resolved = resolve_backend(backend, device)
    return backend if resolved == backend else f"{backend} -> {resolved}"


# -- training -------------------------------------------------------------------------------------------


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    return torch.device(name)


def cpu_threads(requested: int = 0) -> int:
    """requested > 0: that many. Otherwise torch's default, except 1 when other processes already keep
    the cores busy: torch's OpenMP threads then wait on each other, measured here 10-20x slower per
    step (2 threads, load average 6 on 2 cores) than one thread."""
    if requested > 0:
        return requested
    default = torch.get_num_threads()
    try:
        busy = os.getloadavg()[0] >= (os.cpu_count() or 1) - 0.5
    except OSError:  # no load average on this platform
        busy = False
    return 1 if busy else default


def _lr_lambda(cfg: TrainConfig):
    def f(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        t = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))

    return f


def _loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    logits = model(batch[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten())


MODELS = ("demo", "hf-qwen3")


def build_model(name: str, cfg: TrainConfig, vocab_size: int, device: torch.device):
    """(model, precision, gemm_ctx, amp) of one run: name is BASELINE or an MXFP8 recipe."""
    torch.manual_seed(cfg.seed)
    if device.type == "cuda":
        amp = lambda: torch.autocast("cuda", dtype=torch.bfloat16)  # noqa: E731
    else:
        amp = contextlib.nullcontext
    if cfg.model == "hf-qwen3":
        from .hf_qwen3 import HFQwen3MoE, qwen3_moe_config

        impl = "grouped_mm" if name == BASELINE else "mxmoe"
        conf = qwen3_moe_config(vocab_size=vocab_size, dim=cfg.dim, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                                num_experts=cfg.num_experts, top_k=cfg.top_k, moe_hidden=cfg.moe_hidden,
                                max_seq_len=cfg.seq_len, kv_heads=cfg.kv_heads or None,
                                experts_implementation=impl, mxmoe_recipe=None if name == BASELINE else name)
        model = HFQwen3MoE(conf)
        if device.type == "cuda":
            model = model.to(device, torch.bfloat16)
            amp = contextlib.nullcontext
        else:
            model = model.to(device)
        model.start_load_counters()
        if name == BASELINE:
            if device.type == "cuda":
                precision = ("transformers' grouped_mm experts (bf16 torch._grouped_mm); model parameters and "
                             "activations bf16")
                gemm_ctx = contextlib.nullcontext
            else:
                precision = baseline_description(device) + " (transformers' grouped_mm experts)"
                gemm_ctx = lambda: Bf16GroupedMM(emulate=True)  # noqa: E731
        else:
            precision = (f"experts_implementation='mxmoe' (fused layer, recipe {name!r}) on transformers' "
                         f"gate_up_proj / down_proj" + ("; model bf16" if device.type == "cuda" else ""))
            gemm_ctx = contextlib.nullcontext
        return model, precision, gemm_ctx, amp
    model = MoETransformer(cfg.model_args(vocab_size)).to(device)
    if name == BASELINE:
        precision = baseline_description(device)
        gemm_ctx = lambda: Bf16GroupedMM(emulate=device.type != "cuda")  # noqa: E731
    else:
        precision = (f"MXFP8 fused expert layer: mxmoe.convert(model, recipe={name!r}) -> mxmoe.moe_experts on "
                     f"the experts' own w1/w3/w2 ({_backend_description(cfg.backend, device)})")
        convert(model, recipe=name, backend=cfg.backend)
        gemm_ctx = contextlib.nullcontext
    return model, precision, gemm_ctx, amp


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """AdamW; on CUDA its fused kernel (as TorchTitan's default): the foreach one spends ~8 ms a step
    over a 0.6B model in a dozen passes, the same in both runs, which only dilutes the comparison."""
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.95),
                             fused=device.type == "cuda")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_one(
    name: str,
    cfg: TrainConfig,
    vocab_size: int,
    batches: torch.Tensor,
    eval_batches: torch.Tensor,
    device: torch.device,
    progress: bool = True,
) -> RunResult:
    """One training run. name is BASELINE or an MXFP8 recipe; the init depends only on cfg.seed."""
    model, precision, gemm_ctx, amp = build_model(name, cfg, vocab_size, device)
    dist_run = cfg.distributed
    if dist_run:  # mxmoe/distributed/launch.py: this rank's slice of every batch, the model sharded
        from ..distributed import launch

        n, r = launch.world(), launch.rank()
        if cfg.batch_size % n:
            raise SystemExit(f"--batch-size ({cfg.batch_size}) must be a multiple of the world size ({n})")
        decisions = launch.shard(model, ep=cfg.ep, recipe=None if name == BASELINE else name)
        precision += f"; {'EP, the rest FSDP2' if cfg.ep else 'FSDP2'} over {n} ranks"
        if decisions:
            n_mx = sum(v == "mx" for v in decisions.values())
            precision += f" ({n_mx} of {len(decisions)} expert weights all-gathered as MX tiles)"
        batches = batches.chunk(n, dim=1)[r]
        eval_batches = eval_batches.chunk(n, dim=1)[r]
    step_model = torch.compile(model) if cfg.compile else model

    opt = make_optimizer(model, cfg, device)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _lr_lambda(cfg))
    losses = torch.zeros(cfg.steps, device=device)  # kept on the device: no per-step host sync
    load = [torch.zeros(cfg.num_experts, device=device) for _ in model.moe_layers()]
    batches = batches.to(device)

    # Throughput excludes the first steps (allocator warm-up, lazy init, compilation).
    timed_from = min(cfg.timing_warmup, cfg.steps - 1)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    aux = getattr(model, "aux_loss", None)
    bar = _progress(cfg.steps, name, progress)
    t_start = t_timed = time.perf_counter()
    model.train()
    for step in range(cfg.steps):
        if step == timed_from:
            _sync(device)
            t_timed = time.perf_counter()
        with gemm_ctx(), amp():
            loss = _loss(step_model, batches[step])
            total = loss if aux is None else loss + aux()
        # Backward outside the mode: autograd replays the recorded (already rounded) graph.
        opt.zero_grad(set_to_none=True)
        total.backward()
        if dist_run:
            launch.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        else:
            torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        sched.step()
        for acc, moe in zip(load, model.moe_layers()):
            if dist_run:  # every rank balances with the global counts
                launch.all_reduce_sum_(moe.tokens_per_expert)
            acc.add_(moe.tokens_per_expert)
        model.update_expert_bias()
        losses[step] = loss.detach()
        if bar is not None:
            bar.update(1)
            if step % 10 == 0 or step == cfg.steps - 1:
                bar.set_postfix(loss=f"{loss.item():.3f}")
    _sync(device)
    t_end = time.perf_counter()
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else float("nan")
    if bar is not None:
        bar.close()

    model.eval()
    with torch.no_grad(), gemm_ctx(), amp():
        eval_loss = torch.stack([_loss(step_model, b) for b in eval_batches.to(device)]).mean()
    if dist_run:
        losses, eval_loss = launch.all_reduce_mean(losses), launch.all_reduce_mean(eval_loss)
    eval_loss = eval_loss.item()

    timed_steps = cfg.steps - timed_from
    tokens = timed_steps * cfg.batch_size * cfg.seq_len
    return RunResult(
        name=name,
        precision=precision,
        losses=losses.cpu().tolist(),
        eval_loss=eval_loss,
        tokens_per_s=tokens / max(t_end - t_timed, 1e-9),
        wall_s=t_end - t_start,
        expert_load=[(acc / acc.sum()).cpu().tolist() for acc in load],
        peak_mem_bytes=peak,
        params=sum(p.numel() for p in model.parameters()),
    )


def _progress(total: int, desc: str, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm.auto import tqdm
    except ImportError:  # progress bar is a nicety, not a requirement
        return None
    return tqdm(total=total, desc=f"{desc:>20}", unit="step", dynamic_ncols=True, mininterval=0.5)


def run_comparison(cfg: TrainConfig, progress: bool = True, log=print) -> dict:
    """Both runs on the same data; returns the report dict (also what --out's JSON holds)."""
    device = resolve_device(cfg.device)
    if cfg.distributed:
        from ..distributed import launch

        device = launch.init(device.type)
        if launch.rank() != 0:
            progress, log = False, (lambda *a, **k: None)
    lang = SyntheticLanguage()
    batches, entropy = make_batches(lang, cfg.steps, cfg.batch_size, cfg.seq_len, seed=cfg.seed)
    # Held-out text: same language, a sampling seed no training run uses.
    eval_batches, _ = make_batches(lang, cfg.eval_batches, cfg.batch_size, cfg.seq_len,
                                   seed=cfg.seed + 1_000_003)
    header = _header(cfg, device, lang.vocab_size, entropy)
    log(header)
    runs = [train_one(name, cfg, lang.vocab_size, batches, eval_batches, device, progress)
            for name in (BASELINE, cfg.recipe)]
    return {"header": header, **_summarize(cfg, device, lang.vocab_size, entropy, runs)}


# -- report ---------------------------------------------------------------------------------------------


def _header(cfg: TrainConfig, device: torch.device, vocab: int, entropy: float) -> str:
    return "\n".join([
        "mxmoe train demo: bf16 vs MXFP8 expert GEMMs, same model init and data order",
        f"  model   {_model_name(cfg)}: {cfg.n_layers} layer{'s' * (cfg.n_layers != 1)}, dim {cfg.dim}, "
        f"{cfg.n_heads} heads, "
        f"{cfg.num_experts} experts (top-{cfg.top_k}, SwiGLU hidden {cfg.moe_hidden}) per layer, vocab {vocab}",
        f"  data    synthetic grammar language, {cfg.steps} steps x {cfg.batch_size} x {cfg.seq_len} "
        f"tokens, seed {cfg.seed}; source entropy {entropy:.3f} nats/token (best reachable loss)",
        f"  device  {_device_name(device)}, torch {torch.__version__}",
        *_parallel_lines(cfg),
        *_run_lines(cfg, device),
    ])


def _parallel_lines(cfg: TrainConfig) -> list[str]:
    if not cfg.distributed:
        return []
    from ..distributed import launch

    n, mx = launch.world(), get_recipe(cfg.recipe).w_tile128
    if cfg.ep:
        return [f"  ranks   {n} ({launch.backend()}): EP over {n} ranks, {cfg.num_experts // n} experts each; tokens "
                "dispatched as FP8 + E8M0 scales in the MXFP8 run (bf16 in the bf16 run); the other parameters FSDP2"]
    gather = ("expert weights all-gathered as MX tiles in the MXFP8 run" if mx else
              f"expert weights all-gathered in bf16 ({cfg.recipe} has no MX all-gather)")
    return [f"  ranks   {n} ({launch.backend()}): FSDP2 over {n} ranks ({gather})"]


def _model_name(cfg: TrainConfig) -> str:
    if cfg.model == "hf-qwen3":
        return "transformers Qwen3-MoE (Qwen3MoeForCausalLM, random init)"
    return "demo MoE transformer (TorchTitan-style)"


def _run_lines(cfg: TrainConfig, device: torch.device) -> list[str]:
    compiled = " (torch.compile)" if cfg.compile else ""
    if cfg.model == "hf-qwen3":
        base = ("transformers' experts_implementation='grouped_mm' " +
                ("(bf16 torch._grouped_mm), model in bf16" if device.type == "cuda" else
                 "with bf16 GEMM numerics emulated in fp32 (see mxmoe/demo/train.py)"))
        mx = f"experts_implementation='mxmoe', config mxmoe_recipe={cfg.recipe!r} (the fused expert layer)"
    else:
        base = baseline_description(device)
        mx = (f"mxmoe.convert(model, recipe={cfg.recipe!r}): the fused expert layer, backend={cfg.backend!r}: "
              f"{_backend_description(cfg.backend, device)}")
    return [f"  {BASELINE:<7} {base}{compiled}", f"  {'mxfp8':<7} {mx}{compiled}"]


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    n = torch.get_num_threads()
    return f"cpu ({n} thread{'s' if n > 1 else ''})"


def _smooth_width(steps: int) -> int:
    return max(1, steps // 30)


def _centered_mean(losses: list[float], width: int) -> list[float]:
    """Moving average centered on each step (no lag), for the plot."""
    h = width // 2
    return [sum(losses[max(0, i - h):i + h + 1]) / len(losses[max(0, i - h):i + h + 1])
            for i in range(len(losses))]


def _window_mean(losses: list[float], end: int, width: int) -> float:
    lo = max(0, end - width)
    chunk = losses[lo:end]
    return sum(chunk) / len(chunk)


def checkpoints(steps: int, n: int = 10) -> list[int]:
    """About n evenly spaced steps (1-based), always including the first and the last."""
    pts = sorted({1, steps} | {round(steps * i / n) for i in range(1, n + 1)})
    return [p for p in pts if p >= 1]


def _summarize(cfg, device, vocab, entropy, runs: list[RunResult]) -> dict:
    base, mx = runs
    width = max(1, cfg.steps // 10)
    final_train = {r.name: _window_mean(r.losses, cfg.steps, width) for r in runs}
    rel_eval = (mx.eval_loss - base.eval_loss) / base.eval_loss
    rel_train = (final_train[mx.name] - final_train[base.name]) / final_train[base.name]
    # Largest gap between the smoothed curves, for information: mid-training the two runs can learn a
    # piece of the grammar a few steps apart, which shows here but not in the final losses.
    sw = _smooth_width(cfg.steps)
    gaps = [(_window_mean(mx.losses, s, sw) / _window_mean(base.losses, s, sw) - 1, s)
            for s in range(1, cfg.steps + 1)]
    max_gap, max_gap_step = max(gaps, key=lambda g: abs(g[0]))
    return {
        "config": asdict(cfg),
        "device": _device_name(device),
        "torch": torch.__version__,
        "vocab_size": vocab,
        "source_entropy": entropy,
        "final_train_window": width,
        "runs": {
            r.name: {
                "precision": r.precision,
                "loss": r.losses,
                "final_train_loss": final_train[r.name],
                "eval_loss": r.eval_loss,
                "tokens_per_s": r.tokens_per_s,
                "wall_s": r.wall_s,
                "expert_load": r.expert_load,
                "peak_mem_bytes": r.peak_mem_bytes,
                "params": r.params,
            }
            for r in runs
        },
        "baseline": base.name,
        "mxfp8": mx.name,
        "rel_diff_eval": rel_eval,
        "rel_diff_train": rel_train,
        "max_rel_diff_curve": max_gap,
        "max_rel_diff_step": max_gap_step,
        "within_tolerance": abs(rel_eval) <= cfg.tolerance and abs(rel_train) <= cfg.tolerance,
    }


def format_report(rep: dict) -> str:
    base, mx = rep["baseline"], rep["mxfp8"]
    rb, rm = rep["runs"][base], rep["runs"][mx]
    steps = len(rb["loss"])
    width = _smooth_width(steps)
    col = max(len(mx), 10)
    lines = [
        "",
        f"training loss (mean over the {width} steps up to each step)",
        f"  {'step':>6}  {base:>{col}}  {mx:>{col}}  {'rel diff':>9}",
    ]
    for s in checkpoints(steps):
        lb, lm = _window_mean(rb["loss"], s, width), _window_mean(rm["loss"], s, width)
        lines.append(f"  {s:>6}  {lb:>{col}.4f}  {lm:>{col}.4f}  {100 * (lm - lb) / lb:>+8.2f}%")
    tol = rep["config"]["tolerance"]
    verdict = "PASS" if rep["within_tolerance"] else "FAIL"
    final = f"final train loss ({rep['final_train_window']}-step mean)"
    lw = max(24, len(final) + 2)

    def row(label: str, b: str, m: str, tail: str = "") -> str:
        return f"  {label:<{lw}}{b:>{col}}  {m:>{col}}  {tail}".rstrip()

    lines += [
        "",
        row("", base, mx, f"{'rel diff':>9}"),
        row(final, f"{rb['final_train_loss']:.4f}", f"{rm['final_train_loss']:.4f}",
            f"{100 * rep['rel_diff_train']:>+8.2f}%"),
        row("held-out loss", f"{rb['eval_loss']:.4f}", f"{rm['eval_loss']:.4f}",
            f"{100 * rep['rel_diff_eval']:>+8.2f}%"),
        row("source entropy", f"{rep['source_entropy']:.4f}", ""),
        row("tokens/s", f"{rb['tokens_per_s']:,.0f}", f"{rm['tokens_per_s']:,.0f}",
            f"{rm['tokens_per_s'] / rb['tokens_per_s']:>8.2f}x"),
        row("wall time (s)", f"{rb['wall_s']:.1f}", f"{rm['wall_s']:.1f}"),
        *([row("peak memory (GiB)", f"{rb['peak_mem_bytes'] / 2**30:.2f}", f"{rm['peak_mem_bytes'] / 2**30:.2f}",
               f"{rm['peak_mem_bytes'] / rb['peak_mem_bytes']:>8.2f}x")]
          if rb.get("peak_mem_bytes", float("nan")) == rb.get("peak_mem_bytes") else []),
        row("expert load min/max", _load_range(rb), _load_range(rm),
            f"(share of routed tokens, all steps, worst layer; ideal {100 / len(rb['expert_load'][0]):.1f}%)"),
        "",
        f"largest gap between the curves: {100 * rep['max_rel_diff_curve']:+.2f}% at step "
        f"{rep['max_rel_diff_step']} ({width}-step means)",
        f"{verdict}: MXFP8 final losses within {100 * tol:.0f}% of bf16 "
        f"(train {100 * rep['rel_diff_train']:+.2f}%, held-out {100 * rep['rel_diff_eval']:+.2f}%)",
    ]
    return "\n".join(lines)


def _load_range(run: dict) -> str:
    lo = min(min(layer) for layer in run["expert_load"])
    hi = max(max(layer) for layer in run["expert_load"])
    return f"{100 * lo:.1f}/{100 * hi:.1f}%"


def write_outputs(rep: dict, out_dir: str) -> list[str]:
    """train_curves.json (everything, per-step losses included), train_curves.png, train_report.txt."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, f) for f in ("train_curves.png", "train_curves.json", "train_report.txt")]
    plot_curves(rep, paths[0])
    with open(paths[1], "w") as f:
        json.dump(rep, f, indent=1)
    with open(paths[2], "w") as f:
        f.write(rep["header"] + "\n" + format_report(rep) + "\n")
    return paths


def plot_curves(rep: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display needed
    import matplotlib.pyplot as plt

    width = _smooth_width(len(rep["runs"][rep["baseline"]]["loss"]))
    fig, (ax, ax_rel) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True,
                                     gridspec_kw={"height_ratios": [3, 1]})
    smooth = {}
    # The curves nearly coincide: draw MXFP8 dashed on top of a wider bf16 line so both stay visible.
    styles = ((rep["baseline"], "tab:blue", "-", 2.6), (rep["mxfp8"], "tab:orange", "--", 1.6))
    for name, color, linestyle, lw in styles:
        loss = rep["runs"][name]["loss"]
        steps = list(range(1, len(loss) + 1))
        smooth[name] = _centered_mean(loss, width)
        ax.plot(steps, loss, color=color, alpha=0.2, linewidth=0.8)
        ax.plot(steps, smooth[name], color=color, linestyle=linestyle, linewidth=lw,
                label=f"{name} (held-out {rep['runs'][name]['eval_loss']:.3f})")
    ax.axhline(rep["source_entropy"], color="gray", linestyle="--", linewidth=1,
               label=f"source entropy {rep['source_entropy']:.3f}")
    ax.set_ylabel(f"training loss (nats/token; {width}-step mean)")
    ax.set_title(f"mxmoe demo: bf16 vs {rep['mxfp8']} expert GEMMs ({rep['device']})")
    ax.legend()
    ax.grid(alpha=0.3)
    b, m = smooth[rep["baseline"]], smooth[rep["mxfp8"]]
    ax_rel.plot(range(1, len(b) + 1), [100 * (y - x) / x for x, y in zip(b, m)], color="tab:red")
    tol = 100 * rep["config"]["tolerance"]
    for y in (tol, -tol):
        ax_rel.axhline(y, color="gray", linestyle=":", linewidth=1)
    ax_rel.axhline(0, color="black", linewidth=0.5)
    ax_rel.set_ylabel("MXFP8 vs bf16 (%)")
    ax_rel.set_xlabel("step")
    ax_rel.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# -- CLI ------------------------------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = TrainConfig()
    p.add_argument("--model", default=d.model, choices=MODELS,
                   help="demo: the project's TorchTitan-style model; hf-qwen3: a transformers Qwen3-MoE from a "
                        "config (needs transformers) (default %(default)s)")
    p.add_argument("--steps", type=int, default=d.steps, help="training steps per run (default %(default)s)")
    p.add_argument("--recipe", default=d.recipe, choices=sorted(RECIPES),
                   help="MXFP8 recipe of the second run (default %(default)s)")
    p.add_argument("--backend", default=d.backend, choices=["auto", *sorted(BACKENDS)],
                   help="mxmoe backend of the MXFP8 run (default %(default)s)")
    p.add_argument("--device", default=d.device, choices=("auto", "cpu", "cuda"),
                   help="auto: cuda when available, else cpu (default %(default)s)")
    p.add_argument("--out", default=os.path.join("out", "train"),
                   help="directory for train_curves.png/.json and train_report.txt (default %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="model init and data sampling seed")
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--dim", type=int, default=d.dim, help="model width (multiple of 32)")
    p.add_argument("--layers", dest="n_layers", type=int, default=d.n_layers)
    p.add_argument("--heads", dest="n_heads", type=int, default=d.n_heads)
    p.add_argument("--experts", dest="num_experts", type=int, default=d.num_experts)
    p.add_argument("--top-k", type=int, default=d.top_k)
    p.add_argument("--hidden", dest="moe_hidden", type=int, default=d.moe_hidden,
                   help="expert SwiGLU hidden size (multiple of 32)")
    p.add_argument("--kv-heads", type=int, default=d.kv_heads, help="hf-qwen3: key/value heads (0: heads // 4)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model in both runs")
    p.add_argument("--timing-warmup", type=int, default=d.timing_warmup,
                   help="steps left out of tokens/s (default %(default)s; raise it with --compile)")
    p.add_argument("--fsdp", action="store_true",
                   help="under torchrun: FSDP2 on both runs; the MXFP8 run all-gathers tile128 expert weights as "
                        "FP8 + E8M0 tiles")
    p.add_argument("--ep", action="store_true",
                   help="under torchrun (demo model): experts sharded over all ranks, FP8 token dispatch "
                        "(bf16 in the bf16 run); the other parameters FSDP2")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--eval-batches", type=int, default=d.eval_batches)
    p.add_argument("--tolerance", type=float, default=d.tolerance,
                   help="allowed relative final-loss difference (default %(default)s)")
    p.add_argument("--strict", action="store_true", help="exit with status 1 when outside --tolerance")
    p.add_argument("--threads", type=int, default=0,
                   help="CPU threads for torch; default: torch's choice, or 1 when the machine is busy")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def config_from_args(args: argparse.Namespace) -> TrainConfig:
    names = TrainConfig.__dataclass_fields__
    return TrainConfig(**{k: v for k, v in vars(args).items() if k in names})


def main(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    if cfg.dim % 32 or cfg.moe_hidden % 32:
        raise SystemExit("--dim and --hidden must be multiples of 32 (MX blocks are 32 wide)")
    if cfg.dim % (2 * cfg.n_heads):
        raise SystemExit("--dim must be a multiple of 2 x --heads (even head size for rotary embeddings)")
    if cfg.steps < 1 or cfg.eval_batches < 1 or not 1 <= cfg.top_k <= cfg.num_experts:
        raise SystemExit("need --steps >= 1, --eval-batches >= 1 and 1 <= --top-k <= --experts")
    if cfg.model == "hf-qwen3":
        try:
            import transformers  # noqa: F401
        except ImportError:
            raise SystemExit("--model hf-qwen3 needs transformers (pip install 'transformers>=5.17')")
        kv = cfg.kv_heads or max(1, cfg.n_heads // 4)
        if cfg.n_heads % kv:
            raise SystemExit(f"--heads ({cfg.n_heads}) must be a multiple of --kv-heads ({kv})")
    try:  # fail now rather than after the bf16 run when the op library is missing or stale
        _lib.build_info()
    except (OSError, RuntimeError, AttributeError) as e:
        raise SystemExit(f"mxmoe train: cannot load the mxmoe core library: {e}")
    if resolve_device(cfg.device).type == "cpu":
        torch.set_num_threads(cpu_threads(args.threads))
    if cfg.distributed and "RANK" not in os.environ:
        raise SystemExit("--fsdp / --ep: launch with torchrun, e.g. torchrun --nproc-per-node 2 -m mxmoe train --fsdp")
    if cfg.ep and cfg.model != "demo":
        raise SystemExit("--ep: the expert-parallel launch runs the demo model (--model demo)")
    rep = run_comparison(cfg, progress=not args.no_progress)
    if cfg.distributed:
        from ..distributed import launch

        is_rank0 = launch.rank() == 0
        launch.finish()
        if not is_rank0:
            return 0
    print(format_report(rep))
    print("wrote " + ", ".join(write_outputs(rep, args.out)))
    return 1 if args.strict and not rep["within_tolerance"] else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m mxmoe.demo.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
