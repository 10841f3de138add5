"""Spawned torch.distributed ranks for the tests (gloo on the CPU, NCCL at world size 1 on a GPU),
bounded in time: a rank that hangs is killed and the test fails with the rank's traceback.

    spawn("test_module", "_rank_body", world=2)   # runs test_module._rank_body(rank, world, tmp)

The rank bodies live at module level in the test modules (spawn pickles them by name)."""
import contextlib
import datetime
import importlib
import os
import socket
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world, port, module, fn_name, tmp, errors, backend, pg_timeout_s):
    code = 0
    try:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        torch.set_num_threads(1)
        if backend == "nccl":
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=pg_timeout_s))
        try:
            getattr(importlib.import_module(module), fn_name)(rank, world, tmp)
            # No rank tears its connections down while a peer's last collective is still in flight.
            dist.barrier()
        finally:
            dist.destroy_process_group()
    except BaseException:
        errors.put(f"rank {rank}:\n{traceback.format_exc()}")
        code = 1
    # Leave without the interpreter's teardown: a finished gloo rank has now and then aborted in it
    # ("terminate called without an active exception", SIGABRT after the body passed). The result is
    # already reported: the error queue is written synchronously, the exit code is this rank's verdict.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_ranks(module: str, fn_name: str, world: int = 2, backend: str = "gloo", timeout_s: float = TIMEOUT_S,
              pg_timeout_s: float = 60, tmp: str = None):
    """Run module.fn_name(rank, world, tmp) on `world` spawned ranks (tmp: a fresh temporary directory, or
    the one given, e.g. to hand a checkpoint to another run). Returns (exit codes, error messages, ranks
    that were still running after timeout_s and got killed)."""
    ctx = mp.get_context("spawn")
    errors = ctx.SimpleQueue()
    with (contextlib.nullcontext(tmp) if tmp else tempfile.TemporaryDirectory()) as tmp:
        port = free_port()
        procs = [ctx.Process(target=_entry, args=(r, world, port, module, fn_name, tmp, errors, backend,
                                                  pg_timeout_s)) for r in range(world)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout_s
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        alive = [r for r, p in enumerate(procs) if p.is_alive()]
        for r in alive:
            procs[r].kill()
            procs[r].join()
        msgs = []
        while not errors.empty():
            msgs.append(errors.get())
        return [p.exitcode for p in procs], msgs, alive


def spawn(module: str, fn_name: str, world: int = 2, backend: str = "gloo", timeout_s: float = TIMEOUT_S,
          pg_timeout_s: float = 60, tmp: str = None):
    """run_ranks, failing on any rank's exception, a nonzero exit or a rank still running after timeout_s."""
    codes, msgs, alive = run_ranks(module, fn_name, world, backend, timeout_s, pg_timeout_s, tmp)
    assert not alive, f"{fn_name}: ranks {alive} still running after {timeout_s} s (hang)"
    assert not msgs and all(c == 0 for c in codes), "\n".join(msgs) or codes
