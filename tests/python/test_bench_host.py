"""Smoke test of bench/bench_host.py (host enqueue time / eager vs CUDA graph benchmark): the CPU tiny mode
runs in-process and writes JSON rows with every field. Asserts the script works, never a time."""
import importlib.util
import json
from pathlib import Path

BENCH_HOST = Path(__file__).resolve().parents[2] / "bench" / "bench_host.py"
FIELDS = ["shape", "impl", "host_us", "torch_host_us", "eager_us", "graph_us", "date", "commit", "device"]


def _load():
    spec = importlib.util.spec_from_file_location("bench_host", BENCH_HOST)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bench_host_cpu_tiny(tmp_path, capsys):
    bench_host = _load()
    out = tmp_path / "host.json"
    rc = bench_host.main(["--device", "cpu", "--shapes", "tiny", "--reps", "2", "--warmup", "1", "--json", str(out)])
    assert rc == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["impl"] for r in rows] == ["bf16", "mxmoe mxfp8_rceil_tile128", "mxmoe mxfp8_rceil"]
    for r in rows:
        for f in FIELDS:
            assert f in r, f"missing field {f} in {r}"
        assert r["shape"] == "tiny" and r["device"] == "cpu"
        assert r["host_us"] > 0 and r["torch_host_us"] > 0 and r["eager_us"] > 0
        assert r["graph_us"] is None  # no CUDA graph on CPU
    assert rows[0]["host_us"] == rows[0]["torch_host_us"]  # the bf16 row is the peer
    table = capsys.readouterr().out
    assert "torch_host_us" in table and "eager/graph" in table


def test_bench_host_shapes():
    bench_host = _load()
    assert bench_host.parse_shapes("fine,seeds") == ["fine_gate_up", "fine_down", "seeds:1", "seeds:4", "seeds:16",
                                                     "seeds:64"]
    assert bench_host.SHAPES["fine_gate_up"] == (32768, 1536, 1024, 16)  # BENCH.md fine-grained (M, N, K, G)
    assert bench_host.SHAPES["fine_down"] == (32768, 1024, 768, 16)
    offs = bench_host.offsets(16640, 16, "cpu")
    assert offs[-1] == 16640 and all(int(x) % 128 == 0 for x in offs[:-1])
