"""The docs as reference, checked so they cannot drift (standard library only; runs on any machine).

1. docs/reference/env.md lists exactly the environment variables the code reads: the library's
   (src/, include/, python/) and the build / device scripts' (scripts/, bench/); the C++/CUDA core
   reads them in one place (src/core/common/env.cpp).
2. BENCHMARKS.md is what `python3 bench/tables.py benchmarks` generates from bench/results/, and is
   under 40 KB.
3. README.md is under 200 lines, keeps its two commands, and names no commit or issue.
4. No commit hash in the comments and strings of src/, include/, python/.
5. No reference from src/, include/, python/ to the archived journals or to files outside the
   repository (../shared, DESIGN.md, MX_SPEC.md, BENCH.md).
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LIBRARY_DIRS = ("src", "include", "python")
CODE_SUFFIXES = {".py", ".c", ".cc", ".cpp", ".h", ".hpp", ".cu", ".cuh"}
NAME = r"([A-Z][A-Z0-9_]*)"

# How the code reads a variable: C/C++ getenv, the core's environment reader (src/core/common/env.cpp:
# var("X", ...)), Python's os.environ / os.getenv forms, and shell expansions in scripts.
READERS = [
    re.compile(r"\b(?:std::)?(?:secure_)?getenv\s*\(\s*\"" + NAME + "\""),
    re.compile(r"\bvar\s*\(\s*\"" + NAME + "\""),
    re.compile(r"\bos\.environ\.get\s*\(\s*[\"']" + NAME + "[\"']"),
    re.compile(r"\bos\.environ\s*\[\s*[\"']" + NAME + r"[\"']\s*\](?!\s*(?:,[^\n=]*)?=(?!=))"),  # not an assignment
    re.compile(r"\bos\.getenv\s*\(\s*[\"']" + NAME + "[\"']"),
    re.compile(r"[\"']" + NAME + r"[\"']\s+(?:not\s+)?in\s+os\.environ\b"),
]
# Any quoted "MXMOE_..." literal in library code is a variable name (a new reader helper cannot hide one).
MXMOE_LITERAL = re.compile(r"[\"'](MXMOE_[A-Z0-9_]+)[\"']")
SHELL_READ = re.compile(r"\$\{?((?:MXMOE|FUZZ)_[A-Z0-9_]+)")


def _files(dirs, suffixes):
    for d in dirs:
        base = ROOT / d
        if base.is_dir():
            for p in sorted(base.rglob("*")):
                if p.is_file() and p.suffix in suffixes:
                    yield p


def _text(p: Path) -> str:
    return p.read_text(encoding="utf-8", errors="replace")


def _library_reads() -> set:
    names = set()
    for p in _files(LIBRARY_DIRS, CODE_SUFFIXES):
        t = _text(p)
        for rx in READERS:
            names.update(rx.findall(t))
        names.update(MXMOE_LITERAL.findall(t))
    return names


def _script_reads() -> set:
    names = set()
    for p in _files(("scripts", "bench"), {".sh", ".py"}):
        t = _text(p)
        names.update(SHELL_READ.findall(t))
        for rx in READERS:
            names.update(n for n in rx.findall(t) if n.startswith(("MXMOE_", "FUZZ_")))
    return names


def _documented() -> tuple:
    """(library names, script names): the backquoted names in the first column of env.md's tables,
    split at the '## Build' heading."""
    text = _text(ROOT / "docs" / "reference" / "env.md")
    lib, _, scripts = text.partition("\n## Build")
    first_col = re.compile(r"^\|\s*`([A-Z][A-Z0-9_]*)`\s*\|", re.M)
    return set(first_col.findall(lib)), set(first_col.findall(scripts))


def test_env_reference_lists_exactly_the_library_variables():
    read, (documented, _) = _library_reads(), _documented()
    assert read, "found no environment reads at all: the patterns are broken"
    assert not read - documented, f"read by src/include/python but missing from docs/reference/env.md: {sorted(read - documented)}"
    assert not documented - read, f"listed in docs/reference/env.md but read nowhere in src/include/python: {sorted(documented - read)}"


def test_core_reads_the_environment_in_one_place():
    """Every MXMOE_* variable of the C++/CUDA core goes through its one reader (parsed once, invalid
    values an error): no getenv elsewhere in src/ or include/."""
    reader = ROOT / "src" / "core" / "common" / "env.cpp"
    assert re.search(r"\bgetenv\s*\(", _text(reader)), "the environment reader no longer calls getenv"
    others = [str(p.relative_to(ROOT)) for p in _files(("src", "include"), CODE_SUFFIXES - {".py"})
              if p != reader and re.search(r"\bgetenv\s*\(", _text(p))]
    assert not others, f"getenv outside src/core/common/env.cpp: {others}"


def test_env_reference_lists_exactly_the_script_variables():
    read, (_, documented) = _script_reads(), _documented()
    assert not read - documented, f"read by scripts/ or bench/ but missing from docs/reference/env.md: {sorted(read - documented)}"
    assert not documented - read, f"listed under scripts in docs/reference/env.md but read nowhere: {sorted(documented - read)}"


def _tables():
    spec = importlib.util.spec_from_file_location("mxmoe_bench_tables", ROOT / "bench" / "tables.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_benchmarks_md_is_generated_and_small():
    path = ROOT / "BENCHMARKS.md"
    assert path.stat().st_size < 40 * 1024, f"BENCHMARKS.md is {path.stat().st_size} bytes (limit 40 KB)"
    want = _tables().benchmarks(str(ROOT / "bench" / "results"))
    assert _text(path) == want, ("BENCHMARKS.md differs from the generator's output: run "
                                 "`python3 bench/tables.py benchmarks --out BENCHMARKS.md`")


def test_benchmarks_generator_renders_unknown_files(tmp_path):
    import json

    (tmp_path / "distributed.json").write_text(json.dumps({
        "meta": {"commit": "c0ffee1", "date": "2026-12-05", "gpu": "GPU X", "command": "python bench/x.py"},
        "rows": [{"config": "debugmodel_moe", "impl": "bf16", "tokens_per_s": 1000.0, "new_key": [1, 2]}]}))
    (tmp_path / "newbench.json").write_text(json.dumps([{"a": 1}]))
    out = _tables().benchmarks(str(tmp_path))
    assert "## Distributed" in out and "`python bench/x.py`" in out and "new_key" in out
    assert "## Other results: newbench" in out and "commit not recorded" in out


def test_readme_is_short_and_keeps_its_promises():
    text = _text(ROOT / "README.md")
    assert len(text.splitlines()) < 200, f"README.md has {len(text.splitlines())} lines (limit 200)"
    for cmd in ("bash scripts/train.sh", "bash scripts/test.sh"):
        assert cmd in text, f"README.md lost `{cmd}`"
    assert not HASH.search(text), f"README.md names a commit: {HASH.search(text).group(0)}"
    assert not re.search(r"\bissues? #?\d+|(?<![\w/])#\d+\b", text, re.I), "README.md names an issue number"


# A commit hash: 7-40 hex digits as a word, with at least one digit and one letter a-f, not a 0x literal.
HASH = re.compile(r"(?<![0-9A-Za-z_.])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![0-9A-Za-z_])")
JOURNAL = re.compile(r"docs/archive|docs/perf|\.\./shared|\b(?:DESIGN|MX_SPEC|BENCH)\.md\b")
# Comments and string literals of C-family and Python code (an approximation good enough for this check).
PROSE = re.compile(r"\"\"\".*?\"\"\"|'''.*?'''|//[^\n]*|/\*.*?\*/|#[^\n]*|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'",
                   re.S)


def _offending(rx) -> list:
    hits = []
    for p in _files(LIBRARY_DIRS, CODE_SUFFIXES):
        t = _text(p)
        for m in PROSE.finditer(t):
            for h in rx.finditer(m.group(0)):
                line = t.count("\n", 0, m.start() + h.start()) + 1
                hits.append(f"{p.relative_to(ROOT)}:{line}: {h.group(0)}")
    return sorted(set(hits), key=lambda s: (s.split(":")[0], int(s.split(":")[1])))


def test_no_commit_hashes_in_code():
    hits = _offending(HASH)
    assert not hits, "commit hashes in src/include/python comments or strings:\n" + "\n".join(hits)


def test_no_references_to_journals_or_outside_files_in_code():
    hits = _offending(JOURNAL)
    assert not hits, "references to docs/archive, docs/perf or files outside the repository:\n" + "\n".join(hits)
