"""Expert weights quantized once per optimizer step.

A weight changes only when the optimizer (or the user) writes it, but every micro-batch's forward
used to re-quantize it: at 64 experts that pass alone costs more than bf16's whole forward. The
backends ask this cache for a weight's quantized forms instead; an entry is reused while the weight
is provably unchanged and recomputed otherwise.

When an entry is valid. It is keyed by the weight's root tensor (the Parameter a ``W.transpose``
view comes from), the view's geometry and the recipe's form, and it holds the state it was computed
from: data pointer, dtype, device and the tensor's **version counter**. Every in-place write through
torch bumps that counter: optimizer steps (``torch.optim`` updates parameters in place under
no_grad), ``load_state_dict`` (``param.copy_``), ``with torch.no_grad(): W.mul_(2)``, writes through
views or ``.detach()`` aliases. ``module.to(...)`` / ``.cuda()`` / ``.half()`` replace the data (new
pointer, dtype or device). Any difference means a miss, so a changed weight is never served stale.
Optimizers: torch's fused AdamW/Adam/SGD kernels (``fused=True``, TorchTitan's default) write the
parameters without bumping their version counters, and FSDP2 runs the forward on unsharded copies
that it refills in reused storage, so the counter alone would serve a stale entry after a step.
Every ``torch.optim`` optimizer's ``step()`` therefore drops all entries (a global optimizer step
post-hook, registered at import): the cache then lives exactly from one optimizer step to the next,
its purpose. Under FSDP2, call ``mxmoe.refresh_weights()`` after loading weights into a sharded
model (a checkpoint load is not an optimizer step). The one
write torch does not count otherwise is through ``.data`` (``W.data.add_(...)``, hand-written
updates): ``.data`` has its own version counter by design. After such writes call
``mxmoe.refresh_weights()``.

Under torch.compile the backends ask through one opaque op, ``torch.ops.mxmoe.weight_forms``
(``forms`` below): Dynamo records the call, not the weight pass, and the op's body does the same
lookup each time the compiled graph runs (a compiled graph gets the Parameter itself, with its
version counter). The cached forms are read only by mxmoe's own ops inside a graph, so Inductor never
writes into them (it reuses an extern op's output buffer only for a pointwise kernel that reads it).

CUDA graphs (``torch.cuda.graph`` / ``make_graphed_callables`` around eager code). A replay runs no
host code, so nothing can re-check a weight between replays. By default the weight pass is captured
and runs in every replay, and the cache works *within* one capture: a capture (named by the CUDA
runtime's capture id, mxmoe::capture_id) has entries of its own (keyed as above): the first use of a
weight in the capture records its weight pass, later uses in the same capture reuse those forms
while the weight's state is unchanged at capture time, and a write to the weight recorded in between
(an optimizer step or any in-place op captured in the same graph bumps the version as it is
recorded) records a new pass. So a graph of one optimizer step (N micro-batches' fwd+bwd, then the
step) quantizes each weight once per replay, as eager code does once per step. The capture's entries
are dropped at the next lookup outside it (their tensors belong to the graph's memory pool; the graph
keeps using that memory in its replays). For a graph of one micro-batch replayed N times, capture it
inside ``graph_weight_cache()``: the pass is then recorded under a conditional graph node and runs
only in the first replay after an optimizer step or ``refresh_weights()`` (that class says what it
asks of the caller).

Where it is off (the forms are computed on every call, as without a cache): in compiled code with
torch.compile's CUDA graphs (mode="reduce-overhead": they warm up and record on their own stream into
a private memory pool, which must not keep an entry; the op computes the forms whenever it runs off
the device's default stream), for inference-mode tensors (no version counter), and everywhere with
``mxmoe.set_weight_cache(False)`` or env ``MXMOE_WEIGHT_CACHE=0``.

Memory: between steps an entry keeps the weight's quantized forms (tile128: FP8 codes in both
orientations + scales, about W's bf16 bytes; exact recipes: the bf16 round trip + FP8 along N, about
1.5x). ``mxmoe.weight_cache_info()`` reports it. An entry is freed with its weight.
"""
from __future__ import annotations

import os
import threading
import weakref
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from . import ops

_lock = threading.Lock()
_enabled = os.environ.get("MXMOE_WEIGHT_CACHE", "1") not in ("0", "")
_entries: Dict[tuple, "_Entry"] = {}
_stats = {"hits": 0, "misses": 0}
# The CUDA-graph capture that _captured holds entries for (its id; 0: none), and those entries.
_capture: Dict[str, object] = {"id": 0, "entries": {}}


class _Entry:
    __slots__ = ("root", "state", "forms")

    def __init__(self, root: Tuple[weakref.ref, ...], state: tuple, forms: Tuple[Tensor, ...]):
        self.root = root
        self.state = state
        self.forms = forms


def _state(w: Tensor) -> tuple:
    return (w.data_ptr(), w._version, w.dtype, w.device)


def _usable(w: Tensor) -> bool:
    return _enabled and not torch.compiler.is_compiling() and not w.is_inference()


def _capture_id(parts) -> int:
    """The id of the CUDA-graph capture the current stream of the parts' device records (0: none).
    From the CUDA runtime (mxmoe::capture_id): it names raw stream captures and torch's alike."""
    t = next((t for t in parts if t.device.type == "cuda"), None)
    if t is None or not torch.cuda.is_current_stream_capturing():
        return 0
    return ops.capture_id(t.device.index)


def _end_capture_entries(capture: int = 0) -> None:
    """Drop the entries of a capture other than ``capture`` (called with _lock held)."""
    if _capture["id"] and _capture["id"] != capture:
        _capture["id"] = 0
        _capture["entries"] = {}


def _valid(entry, roots, state) -> bool:
    """An entry serves these roots in this state (its roots alive and the same, its state equal)."""
    return entry is not None and all(ref() is r for ref, r in zip(entry.root, roots)) and entry.state == state


def _drop(key):
    def callback(_ref):
        with _lock:
            _entries.pop(key, None)

    return callback


def _root(w: Tensor) -> Tensor:
    return w._base if w._base is not None else w


def quantized(w, form: tuple, compute: Callable) -> Tuple[Tensor, ...]:
    """The quantized forms of weight ``w`` for ``form`` (a hashable description, e.g. the op and its
    scale mode): cached while ``w`` is unchanged, else ``compute(w)`` (and stored).

    ``w`` may also be a tuple of tensors that together make one operand (TorchTitan's separate gate
    and up weights w1, w3, concatenated by ``compute``): the entry is then valid while every one of
    them is unchanged, and is freed with the first of them."""
    parts = w if isinstance(w, tuple) else (w,)
    if all(hasattr(t, "mxmoe_forms") for t in parts):
        return _given_forms(parts, form)
    if not all(_usable(t) for t in parts):
        return compute(w)
    roots = tuple(_root(t) for t in parts)
    key = (tuple(id(r) for r in roots), form, tuple((tuple(t.shape), t.stride(), t.storage_offset()) for t in parts))
    state = tuple(_state(t) for t in parts)
    capture = _capture_id(parts)
    if capture:
        return _captured(w, roots, key, state, form, compute, capture)
    with _lock:
        _end_capture_entries()
        entry = _entries.get(key)
        if _valid(entry, roots, state):
            _stats["hits"] += 1
            return entry.forms
    forms = compute(w)
    # The state is read again: the version must be the one the forms were computed from (compute
    # reads w and writes nothing to it, so it is unchanged unless another thread wrote w).
    if tuple(_state(t) for t in parts) == state:
        with _lock:
            _stats["misses"] += 1
            _entries[key] = _Entry(tuple(weakref.ref(r, _drop(key)) for r in roots), state, tuple(forms))
    return forms


def _captured(w, roots, key, state, form, compute, capture: int) -> Tuple[Tensor, ...]:
    """``quantized`` during a CUDA-graph capture: the capture's own entries (module docstring). An
    entry holds the forms recorded earlier in this capture, valid while the weight's state at capture
    time is the one they were recorded from; no stats (they count the eager cache). Inside
    ``graph_weight_cache()`` a weight's first pass in the capture is recorded under a conditional
    node instead (``_kept_forms``)."""
    with _lock:
        _end_capture_entries(capture)
        entry = _capture["entries"].get(key)
        if _valid(entry, roots, state):
            return entry.forms
    forms = None
    if entry is None and _keep["depth"]:
        forms = _kept_forms(w, roots, key, form, capture)
    elif entry is not None:
        # Written earlier in this capture, after a use: this replay recomputes here, and a kept entry
        # of this capture is flagged for the next replay (its first pass read the weight before the
        # write).
        kept = _kept.get((key, capture))
        if kept is not None:
            _keep["flags"][kept.device][kept.slot].fill_(1)
    if forms is None:
        forms = tuple(compute(w))
    with _lock:
        _capture["id"] = capture
        _capture["entries"][key] = _Entry(tuple(weakref.ref(r) for r in roots), state, forms)
    return forms


# ---- graph_weight_cache(): forms kept across CUDA-graph replays ----------------------------------
# A kept entry (one per weight and capture) owns the forms its capture recorded and a device flag
# "stale" (one int32 of a per-device flag pool, set when allocated). The pass is recorded under a
# conditional node on that flag (mxmoe::weight_forms_if): a replay runs it only when the flag is
# set, and clears it. The flag is set by every optimizer step (the step post-hook, eager or recorded
# in a graph), by refresh_weights(), and by a write recorded later in the same capture (_captured).
_keep: Dict[str, object] = {"depth": 0, "flags": {}, "free": {}}
_kept: Dict[tuple, "_Kept"] = {}
_FLAG_SLOTS = 4096
_FORM_CODES = {"sm90_tile128": 0, "sm90_exact": 1}  # weight_forms_if's form argument


class _Kept:
    __slots__ = ("root", "forms", "slot", "device")

    def __init__(self, root, forms, slot, device):
        self.root, self.forms, self.slot, self.device = root, forms, slot, device


def _drop_kept(kkey):
    def callback(_ref):
        with _lock:
            k = _kept.pop(kkey, None)
            if k is not None:
                _keep["free"][k.device].append(k.slot)

    return callback


def _kept_forms(w, roots, key, form, capture: int):
    """The weight pass recorded under a conditional node on a new kept entry's stale flag; None
    where it cannot be (a form without a conditional op, no flag pool on this device, pool full)."""
    name, mode = form if isinstance(form, tuple) and len(form) == 2 else (None, None)
    device = roots[0].device
    with _lock:
        if name not in _FORM_CODES or device not in _keep["flags"] or not _keep["free"][device]:
            return None
        slot = _keep["free"][device].pop()
    flag = _keep["flags"][device][slot : slot + 1]
    forms = tuple(ops.weight_forms_if(flag, joined(w), _FORM_CODES[name], mode))
    kkey = (key, capture)
    with _lock:
        _kept[kkey] = _Kept(tuple(weakref.ref(r, _drop_kept(kkey)) for r in roots), forms, slot, device)
    return forms


def _mark_kept_stale() -> None:
    """Every kept entry's next replayed pass recomputes (one fill per device, on the current stream:
    eager, or recorded where the caller is being captured)."""
    for flags in _keep["flags"].values():
        flags.fill_(1)


class graph_weight_cache:
    """Context for capturing CUDA graphs (``torch.cuda.graph``, ``make_graphed_callables``) that keep
    the expert weights' quantized forms across replays: a graph of one micro-batch then quantizes a
    weight only in the first replay after it changed, as eager code does once per optimizer step.

    Inside it, a capture records each weight's first pass under a conditional graph node on a device
    flag (mxmoe::weight_forms_if; one kept entry per weight and capture). The flag is set (the next replay
    recomputes) by every ``torch.optim`` step, eager or itself captured (the step post-hook), by
    ``mxmoe.refresh_weights()``, and by a write to the weight recorded later in the same capture. A
    replay runs no host code, so **other writes between replays** (``load_state_dict``, a manual
    in-place edit, FSDP2 refilling unsharded weights, and a write recorded in a graph after the
    weight's last use in it) **need ``mxmoe.refresh_weights()``** before the next replay; ``set_weight_cache(False)`` does it too. Enter it before the capture (it allocates
    the flags, 4096 per device, set; beyond them captures fall back to the rule without it); the
    memory of the kept forms is in ``weight_cache_info()`` (``kept_entries``, ``kept_bytes``; freed
    with the weight, not with the graph). The sm90 backend's forms (tile128 and exact recipes)."""

    def __init__(self, device=None):
        self.device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
        if self.device.type != "cuda":
            raise ValueError(f"graph_weight_cache: device must be a CUDA device, got {self.device}")
        if self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())

    def __enter__(self):
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("graph_weight_cache: enter it before the capture (it initializes device flags), "
                               "not while the current stream is capturing")
        with _lock:
            if self.device not in _keep["flags"]:
                _keep["flags"][self.device] = torch.ones(_FLAG_SLOTS, dtype=torch.int32, device=self.device)
                _keep["free"][self.device] = list(range(_FLAG_SLOTS - 1, -1, -1))
            _keep["depth"] += 1
        return self

    def __exit__(self, *exc):
        with _lock:
            _keep["depth"] -= 1
        return False


# The recipes' weight passes: form name -> the op computing a (joined) weight's forms from (w, mode).
# Looked up by name at call time (tests count the calls by patching the ops).
_PASSES = {"sm90_tile128": "sm90_tile128_weight", "sm90_exact": "sm90_exact_weight"}


def joined(w):
    """w itself, or the (E, 2I, H) concatenation of a (gate, up) pair (TorchTitan's w1, w3)."""
    return torch.cat(w, dim=1) if isinstance(w, tuple) else w


def _compute(form: str, mode: int):
    op = _PASSES[form]
    return lambda t: getattr(ops, op)(joined(t), mode)


def forms(w, form: str, mode: int) -> Tuple[Tensor, ...]:
    """The quantized forms of weight ``w`` (a tensor, or a (gate, up) pair joined along dim 1) for the
    recipe pass ``form`` ("sm90_tile128": (q, s, qt, st); "sm90_exact": (dq, q, s)) in scale mode
    ``mode``, from the cache (``quantized``). Under torch.compile through the op
    ``mxmoe::weight_forms``, so that the lookup runs when the compiled graph runs."""
    parts = w if isinstance(w, tuple) else (w,)
    if torch.compiler.is_compiling() and not all(hasattr(t, "mxmoe_forms") for t in parts):
        return tuple(torch.ops.mxmoe.weight_forms(parts[0], parts[1] if len(parts) > 1 else None, form, mode))
    return quantized(w, (form, mode), _compute(form, mode))


@torch.library.custom_op("mxmoe::weight_forms", mutates_args=())
def _weight_forms_op(w: Tensor, w_up: Optional[Tensor], form: str, mode: int) -> List[Tensor]:
    if form not in _PASSES:
        raise ValueError(f"mxmoe::weight_forms: form must be one of {sorted(_PASSES)}, got {form!r}")
    key = w if w_up is None else (w, w_up)
    if w.device.type == "cuda" and torch.cuda.current_stream(w.device) != torch.cuda.default_stream(w.device):
        # torch.compile's CUDA graphs (mode="reduce-overhead") warm up and record on a stream of their
        # own, allocating from the graph's private pool: an entry kept from there would be a live
        # allocation the pool does not track. The forms are computed (and captured) instead.
        return list(_compute(form, mode)(key))
    return list(quantized(key, (form, mode), _compute(form, mode)))


@_weight_forms_op.register_fake
def _(w, w_up, form, mode):
    return list(_compute(form, mode)(w if w_up is None else (w, w_up)))


def _given_forms(parts, form) -> Tuple[Tensor, ...]:
    """Weights that carry their quantized forms (the FSDP2 MX all-gather's MXGatheredWeight,
    mxmoe/distributed/fsdp.py): no quantization. A (gate, up) pair's forms are joined as the
    concatenated weight's would be (its halves' tiles never straddle: fsdp.py checks I % 128)."""
    forms = [t.mxmoe_forms(form) for t in parts]
    if len(forms) == 1:
        return forms[0]
    (q1, s1, qt1, st1), (q2, s2, qt2, st2) = forms
    return torch.cat([q1, q2], 1), torch.cat([s1, s2], 1), torch.cat([qt1, qt2], 2), torch.cat([st1, st2], 2)


def refresh_weights(module_or_tensor=None) -> int:
    """Drop cached quantized weights: all of them, or those of a module's parameters / one tensor.
    Needed only after writes that bypass torch's version counter (through ``.data``). Returns the
    number of entries dropped."""
    _mark_kept_stale()
    with _lock:
        _end_capture_entries()
        if module_or_tensor is None:
            n = len(_entries)
            _entries.clear()
            return n
        if isinstance(module_or_tensor, Tensor):
            roots = {id(_root(module_or_tensor))}
        else:
            roots = {id(p) for p in module_or_tensor.parameters()}
        drop = [k for k in _entries if roots.intersection(k[0])]
        for k in drop:
            del _entries[k]
        return len(drop)


def _after_optimizer_step(optimizer, args, kwargs) -> None:
    """Global optimizer step post-hook: after any optimizer step every entry is dropped (see the
    module docstring). Not only the stepped parameters' entries: the tensor a forward quantized is
    not always the optimizer's parameter (FSDP2 computes on unsharded copies it refills in place, in
    storage it reuses, without bumping their version counters), and a step is rare enough that
    re-quantizing once after it costs what the cache saves anyway."""
    refresh_weights()


from torch.optim.optimizer import register_optimizer_step_post_hook  # noqa: E402

register_optimizer_step_post_hook(_after_optimizer_step)


def set_weight_cache(enabled: bool) -> None:
    """Turn the cache on or off (off also drops every entry)."""
    global _enabled
    _enabled = bool(enabled)
    if not _enabled:
        refresh_weights()


def weight_cache_info() -> dict:
    """``enabled``, ``entries``, ``bytes`` held by the cached forms, ``hits`` and ``misses`` so far, and
    the entries (and bytes) of the CUDA-graph capture in progress or last recorded
    (``capture_entries``, ``capture_bytes``; memory of that graph's pool, dropped at the next lookup
    outside it), and those kept across replays by ``graph_weight_cache`` (``kept_entries``,
    ``kept_bytes``; freed with their weight)."""
    with _lock:
        live = [e for e in _entries.values() if all(ref() is not None for ref in e.root)]
        nbytes = sum(t.numel() * t.element_size() for e in live for t in e.forms)
        capture = list(_capture["entries"].values())
        capture_bytes = sum(t.numel() * t.element_size() for e in capture for t in e.forms)
        kept = list(_kept.values())
        kept_bytes = sum(t.numel() * t.element_size() for e in kept for t in e.forms)
        return {"enabled": _enabled, "entries": len(live), "bytes": nbytes, **_stats,
                "capture_entries": len(capture), "capture_bytes": capture_bytes,
                "kept_entries": len(kept), "kept_bytes": kept_bytes}
