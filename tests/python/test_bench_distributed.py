"""bench/bench_distributed.py (the MX all-gather's per-rank cost) end to end on the CPU: it runs, writes
its JSON, and the bytes ratio is the MX all-gather's (codes + one scale byte per 128x128 tile)."""
import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
SCRIPT = os.path.join(ROOT, "bench", "bench_distributed.py")


def test_bench_distributed_runs_on_cpu(tmp_path):
    import mxmoe

    out = tmp_path / "distributed.json"
    r = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--configs", "tiny", "--ranks", "2", "--reps", "1",
                        "--warmup", "0", "--out", str(out)], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "MXMOE_OPS_LIBRARY": mxmoe.library_path()})
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.load(open(out))
    rows = rep["mx_all_gather"]
    assert [(x["config"], x["weight"]) for x in rows] == [("tiny", "gate_up"), ("tiny", "down")]
    H, I, E = 128, 128, 8
    assert rows[0]["local_shape"] == [E // 2, 2 * I, H] and rows[1]["local_shape"] == [E // 2, H, I]
    for x in rows:
        e, n, k = x["local_shape"]
        tiles = e * -(-n // 128) * -(-k // 128)
        assert x["bytes_ratio"] == (e * n * k + tiles) / (2 * e * n * k)
        assert all(x[f] > 0 for f in ("pack_us", "unpack_us", "copy_bf16_us", "requant_us"))
    assert rep["meta"]["device"] == "cpu" and "MX all-gather cost per rank" in r.stdout
