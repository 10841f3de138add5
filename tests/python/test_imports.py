"""The package's import structure: every module imports alone, the imports form a DAG, and modules use
each other through public names only.

The package is the one `import mxmoe` resolves to (as in the rest of the suite; found without
importing it here).

Import graph (built statically with `ast`, nothing imported): an edge a -> b for every `import mxmoe.b`,
`from mxmoe.b import ...`, `from .b import ...` or `from . import b` in a, wherever it stands: at module
level, inside a function (the lazy imports through which the old circles ran, e.g.
backends.resolve_backend importing sm90) or under a condition. `from p import name` is an edge to the
submodule p.name when there is one, else to p. Not edges: the import of a module's parent packages that
Python performs implicitly before the module itself (every `p.__init__` that imports its submodules
would otherwise be a circle; only the explicit imports in a module's text count), and imports by
string (importlib.import_module: mxmoe/__main__.py's command table).
"""
from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

PACKAGE = "mxmoe"
ROOT = Path(importlib.util.find_spec(PACKAGE).submodule_search_locations[0])
# Modules whose import needs an optional third-party package; skipped (not failed) when it is missing.
OPTIONAL = {"torchtitan", "transformers", "torchao", "matplotlib"}


def _modules() -> dict:
    """module name -> (path, is_package) for every .py file of the package."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = [PACKAGE, *rel.parts]
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_pkg)
    return out


MODULES = _modules()


def _imports(name: str, path: Path, is_pkg: bool):
    """(line, module, imported name or None) for every import of the package in `name`'s text:
    `import m` gives (line, m, None), `from m import a` (line, m, a), relative imports resolved."""
    package = name if is_pkg else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, None
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            for alias in node.names:
                yield node.lineno, mod, alias.name


def _ours(mod: str) -> bool:
    return mod == PACKAGE or mod.startswith(PACKAGE + ".")


def _module_of(mod: str) -> str:
    """The longest prefix of mod that is a module of the package."""
    while mod and mod not in MODULES:
        mod = mod.rpartition(".")[0]
    return mod


def _edges(name: str, path: Path, is_pkg: bool) -> set:
    """The package modules `name` imports (see the module docstring)."""
    found = set()
    for _, mod, what in _imports(name, path, is_pkg):
        if _ours(mod):
            sub = f"{mod}.{what}"
            found.add(sub if what is not None and sub in MODULES else _module_of(mod))
    return found - {name, ""}


def import_graph() -> dict:
    return {name: _edges(name, path, is_pkg) for name, (path, is_pkg) in MODULES.items()}


def find_cycle(graph: dict):
    """A list [a, b, ..., a] of modules that import each other in a circle, or None."""
    state = {}  # 1: on the DFS stack, 2: done
    stack = []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            cycle = visit(node)
            if cycle:
                return cycle
    return None


def test_the_graph_sees_function_level_imports():
    # The checker itself: a lazy import inside a function is an edge, and a circle through it is found.
    assert "mxmoe.backends" in import_graph()["mxmoe.backends.sm90"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycle():
    graph = import_graph()
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle in the mxmoe package: " + " -> ".join(cycle)


def test_backend_registry_imports_no_backend():
    backends = {m for m in MODULES if m.startswith("mxmoe.backends.")}
    assert not import_graph()["mxmoe.backends"] & backends
    # and the fused layer picks its path through the registry, never a backend module by name
    for layer in ("mxmoe.moe", "mxmoe.moe.layer", "mxmoe.moe.functional", "mxmoe.moe.activation"):
        assert not {m for m in import_graph()[layer] if m.startswith("mxmoe.backends.")} - {"mxmoe.backends.common"}
    assert not any(m.startswith("mxmoe.distributed") for m in import_graph()["mxmoe.moe.layer"])


def test_no_private_names_across_modules():
    """`from .x import _name` across modules (a private module, such as _lib, is fine: it is a module)."""
    bad = []
    for name, (path, is_pkg) in MODULES.items():
        for line, mod, what in _imports(name, path, is_pkg):
            private = what is not None and what.startswith("_") and not what.startswith("__")
            if _ours(mod) and private and f"{mod}.{what}" not in MODULES:
                bad.append(f"{name}:{line}: from {mod} import {what}")
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


# ---- every module imports alone, in a fresh interpreter --------------------------------------------------


def _import_alone(module: str):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, env=env,
                       timeout=300)
    return r.returncode, r.stderr


@pytest.fixture(scope="module")
def imported_alone():
    """module -> (returncode, stderr) of `python -c "import module"`, all modules run concurrently."""
    names = sorted(MODULES)
    with ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
        return dict(zip(names, pool.map(_import_alone, names)))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_imports_alone(imported_alone, module):
    code, err = imported_alone[module]
    if code != 0:
        last = err.strip().splitlines()[-1] if err.strip() else ""
        missing = last.partition("No module named ")[2].strip("'\"").split(".")[0]
        if last.startswith("ModuleNotFoundError") and missing in OPTIONAL:
            pytest.skip(f"{module} needs {missing}, which is not installed")
    assert code == 0, f"`import {module}` failed in a fresh interpreter:\n{err[-3000:]}"
