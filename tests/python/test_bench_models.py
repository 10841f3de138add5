"""bench/bench_models.py (the real-model proof) end to end on a tiny Qwen3-MoE on the CPU: runs, JSON,
summary verdicts computed from the runs, and --merge of partial runs; the speed preset (--shape) likewise."""
import json
import math
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


def test_speed_preset_three_recipes_eager_and_compiled(tmp_path):
    """--shape qwen3-30b-a3b on a tiny model of the same make (head_dim != hidden / heads): transformers bf16,
    mxmoe bf16 and tile128, eager then compiled (aot_eager here: Inductor needs a compiler and minutes on a
    CPU); rows, ratios vs both references, the targets and the table (timings are not checked)."""
    out = tmp_path / "speed.json"
    r = subprocess.run([sys.executable, SCRIPT, "--shape", "qwen3-30b-a3b", "--tiny", "--device", "cpu", "--steps", "3",
                        "--timing-warmup", "1", "--compile-steps", "2", "--compile-warmup", "1", "--compile-backend",
                        "aot_eager", "--out", str(out)], capture_output=True, text=True, timeout=600, cwd=str(tmp_path),
                       env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.load(open(out))
    recipes = ["bf16", "mxmoe_bf16", "mxfp8_rceil_tile128"]
    assert [(x["recipe"], x["mode"]) for x in rep["runs"]] == [(rc, m) for m in ("eager", "compiled") for rc in recipes]
    assert rep["shape"] == "qwen3-30b-a3b-tiny" and rep["model"]["head_dim"] == 32 and rep["model"]["vocab"] == 256
    assert rep["tokens_per_step"] == 2 * 32 and "no loss verdict" in rep["data"] and "--shape" in rep["command"]
    assert rep["env"]["torch"] == rep["torch"] and "error" not in rep["env"], rep["env"]  # the host benchmark's env
    runs = {(x["recipe"], x["mode"]): x for x in rep["runs"]}
    for (rc, mode), x in runs.items():
        assert x["shape"] == rep["shape"] and x["tokens_per_step"] == 64 and x["tokens_per_s"] > 0 and x["step_ms"] > 0
        assert (x["steps"], x["timed_steps"]) == ((3, 2) if mode == "eager" else (2, 1))
        assert len(x["loss"]) == x["steps"] and all(math.isfinite(v) for v in x["loss"])
        assert x["params"] == rep["runs"][0]["params"] and "peak_mem_gib" in x
        assert x["compile_backend"] == ("aot_eager" if mode == "compiled" else None)
    assert "grouped_mm" in runs["bf16", "eager"]["precision"]
    assert "mxmoe_recipe='bf16'" in runs["mxmoe_bf16", "eager"]["precision"]
    assert "mxmoe_recipe='mxfp8_rceil_tile128'" in runs["mxfp8_rceil_tile128", "eager"]["precision"]
    # The same init and data in every run; three different expert paths (MXFP8 is not bf16); compiled = eager.
    first = [runs[rc, "eager"]["loss"] for rc in recipes]
    assert first[0][0] == pytest.approx(first[1][0], rel=1e-3) == pytest.approx(first[2][0], rel=1e-3)
    assert first[2] != first[0] and first[2] != first[1]
    for rc in recipes:
        assert runs[rc, "compiled"]["loss"] == pytest.approx(runs[rc, "eager"]["loss"][:2], rel=1e-4)
    s = rep["summary"]
    for mode in ("eager", "compiled"):
        for rc in recipes:
            tps = runs[rc, mode]["tokens_per_s"]
            assert s[rc][f"tokens_per_s_{mode}"] == tps
            assert s[rc][f"vs_bf16_{mode}"] == pytest.approx(tps / runs["bf16", mode]["tokens_per_s"])
            assert s[rc][f"vs_mxmoe_bf16_{mode}"] == pytest.approx(tps / runs["mxmoe_bf16", mode]["tokens_per_s"])
    t = {(x["vs"], x["target"]): x for x in rep["targets"]}
    assert set(t) == {("bf16", 1.25), ("mxmoe_bf16", 1.15)}
    for (ref, need), x in t.items():
        key = "vs_bf16_compiled" if ref == "bf16" else "vs_mxmoe_bf16_compiled"
        assert x["recipe"] == "mxfp8_rceil_tile128" and x["ratio"] == pytest.approx(s["mxfp8_rceil_tile128"][key])
        assert x["met"] == (x["ratio"] >= need)
    assert "vs transformers bf16" in r.stdout and "vs mxmoe bf16" in r.stdout
    assert "target: mxfp8_rceil_tile128 compiled >= 1.25x transformers bf16" in r.stdout
    assert "target: mxfp8_rceil_tile128 compiled >= 1.15x mxmoe bf16" in r.stdout
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    import tables

    md = tables.models(str(out))
    assert "| mxfp8_rceil_tile128 | compiled |" in md and "x mxmoe bf16" in md and "head" in md

    # --merge of parts (e.g. the eager runs and the compiled runs of separate device calls).
    parts = []
    for i, mode in enumerate(("eager", "compiled")):
        parts.append(tmp_path / f"part{i}.json")
        json.dump({**{k: v for k, v in rep.items() if k not in ("summary", "targets")},
                   "runs": [x for x in rep["runs"] if x["mode"] == mode]}, open(parts[-1], "w"))
    r = subprocess.run([sys.executable, SCRIPT, "--merge", *map(str, parts), "--out", str(tmp_path / "m.json")],
                       capture_output=True, text=True, timeout=300, env=_env())
    assert r.returncode == 0, r.stderr[-3000:]
    m = json.load(open(tmp_path / "m.json"))
    assert json.dumps(m["summary"], sort_keys=True) == json.dumps(s, sort_keys=True)  # nan == nan as text
    assert m["targets"] == rep["targets"] and "target: mxfp8_rceil_tile128" in r.stdout
    # The proof's files and the preset's are not merged together.
    json.dump({"runs": [], "profiles": {}}, open(tmp_path / "proof.json", "w"))
    r = subprocess.run([sys.executable, SCRIPT, "--merge", str(parts[0]), str(tmp_path / "proof.json")],
                       capture_output=True, text=True, timeout=300, env=_env())
    assert r.returncode == 2 and "different shapes" in r.stderr
