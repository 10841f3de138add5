"""bench/bench_models.py (the real-model proof) end to end on a tiny Qwen3-MoE on the CPU: runs, JSON,
summary verdicts computed from the runs, and --merge of partial runs."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(ROOT, "bench", "bench_models.py")


def _env():
    # The script puts the source tree first on sys.path; it loads the op library this process uses.
    import mxmoe

    return {**os.environ, "MXMOE_OPS_LIBRARY": mxmoe.library_path()}


def _run(tmp_path, name, *args):
    out = tmp_path / f"{name}.json"
    r = subprocess.run([sys.executable, SCRIPT, "--tiny", "--device", "cpu", "--steps", "6", "--warmup", "2",
                        "--eval-batches", "1", "--compile-steps", "0", "--out", str(out), *args],
                       capture_output=True, text=True, timeout=600, cwd=str(tmp_path), env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    return json.load(open(out)), r.stdout


def test_bench_models_runs_summarizes_and_merges(tmp_path):
    a, _ = _run(tmp_path, "a", "--recipes", "bf16", "mxfp8_rceil_tile128", "--seeds", "0")
    b, _ = _run(tmp_path, "b", "--recipes", "bf16", "mxfp8_rceil_tile128", "--seeds", "1")
    for rep in (a, b):
        assert [r["recipe"] for r in rep["runs"]] == ["bf16", "mxfp8_rceil_tile128"]
        assert all(len(r["loss"]) == 6 and r["tokens_per_s"] > 0 for r in rep["runs"])
    out = tmp_path / "merged.json"
    r = subprocess.run([sys.executable, SCRIPT, "--merge", str(tmp_path / "a.json"), str(tmp_path / "b.json"),
                        "--out", str(out)], capture_output=True, text=True, timeout=300, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.load(open(out))
    s = m["summary"]
    assert s["bf16"]["seeds"] == 2 and s["mxfp8_rceil_tile128"]["seeds"] == 2
    ev = sorted(x["eval_loss"] for x in m["runs"] if x["recipe"] == "bf16")
    assert (s["bf16"]["eval_min"], s["bf16"]["eval_max"]) == (ev[0], ev[1])
    mx = s["mxfp8_rceil_tile128"]
    assert mx["rel_eval_vs_bf16"] == pytest.approx(mx["eval_mean"] / s["bf16"]["eval_mean"] - 1)
    assert mx["loss_parity"] == (abs(mx["rel_eval_vs_bf16"]) <= 0.01 and ev[0] <= mx["eval_mean"] <= ev[1])
    assert "held-out mean" in r.stdout and "mxfp8_rceil_tile128" in r.stdout
