"""Markdown tables for BENCHMARKS.md from the device run's JSON rows.

    python3 bench/tables.py host bench/results/host.json
    python3 bench/tables.py e2e bench/results/e2e.json [more e2e.json ...]
"""
from __future__ import annotations

import json
import sys


def _md(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def host(path: str) -> str:
    d = json.load(open(path))
    rows = []
    for r in d["rows"]:
        ratio = r.get("host_ratio")
        eg = r.get("eager_graph_ratio")
        rows.append([r["shape"], f"({r['M']}, {r['N']}, {r['K']}, G={r['G']})", r["impl"], f"{r['host_us']:.0f}",
                     f"{r['torch_host_us']:.0f}", f"{ratio:.2f}x" if ratio else "-", r.get("host_target", "-"),
                     f"{r['eager_us']:.0f}", f"{r['graph_us']:.0f}" if r.get("graph_us") else "-",
                     f"{eg:.2f}" if eg else "-", r.get("graph_target", "-")])
    head = ["shape", "(M, N, K, G)", "impl", "host_us", "torch_host_us", "host ratio", "<= 1.3x", "eager_us",
            "graph_us", "eager/graph", "<= 1.1 (fine)"]
    text = [f"{d['date']}, commit {d['commit']}, {d['device']} (torch {d['torch']}), reps {d['reps']}", "",
            _md(head, rows)]
    for b in d.get("host_breakdown", []):
        top = ", ".join(f"{t['op']} {t['self_us']:.0f} us (x{t['calls']:g})" for t in b["top"][:6])
        text.append(f"\n- host split, {b['shape']} {b['impl']} (profiler, per step): {b['wall_us']:.0f} us = ops "
                    f"{b['ops_self_us']:.0f} + Python/autograd {b['python_us']:.0f}; top: {top}")
    return "\n".join(text)


def e2e(paths) -> str:
    rows = []
    for path in paths:
        d = json.load(open(path))
        for r in d["rows"]:
            rows.append([r["A_shape"], r["B_shape"], r["recipe"], r["mode"], r.get("micro_batches", 1),
                         f"{r['bf16_e2e_us']:.0f}", f"{r['scaled_e2e_us']:.0f}", f"{r['scaled_e2e_speedup']:.3f}x",
                         f"{r['bf16_fwd_us']:.0f}", f"{r['scaled_fwd_us']:.0f}", f"{r['scaled_fwd_speedup']:.3f}x",
                         f"{r['peak_mem_ratio']:.2f}x"])
    head = ["A_shape", "B_shape", "recipe", "mode", "micro-batches", "bf16_e2e_us", "scaled_e2e_us", "e2e speedup",
            "bf16_fwd_us", "scaled_fwd_us", "fwd speedup", "peak mem vs bf16"]
    return _md(head, rows)


if __name__ == "__main__":
    kind, *files = sys.argv[1:]
    print(host(files[0]) if kind == "host" else e2e(files))
