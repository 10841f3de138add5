"""`python -m mxmoe <command>`.

Each command lives in its own module, imported only when that command runs, which provides
`add_arguments(parser)` and `main(args) -> exit status`. To add a command, add a line to COMMANDS.
Commands are demo and benchmark code, kept apart from the library: `train` is the package's
mxmoe.demo.train; `bench` is the source tree's bench/bench_e2e.py (not part of the installed package:
it is found next to python/, i.e. in this checkout, or under the working directory).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path

# name -> (module, or a .py file of the source tree; one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("mxmoe.demo.train", "train a small MoE LM with bf16 and with MXFP8 experts and compare the losses"),
    "bench": ("bench/bench_e2e.py", "benchmark MXFP8 grouped GEMMs against bf16 (GPU)"),
}


def _load(target: str):
    if not target.endswith(".py"):
        return importlib.import_module(target)
    for root in (Path(__file__).resolve().parents[2], Path.cwd()):
        path = root / target
        if path.is_file():
            name = path.stem
            loaded = sys.modules.get(name)
            if loaded is not None and getattr(loaded, "__file__", None) == str(path):
                return loaded
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
            return module
    raise SystemExit(f"{target} not found: it is in the source tree, not in the installed package "
                     "(run from the repository root)")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m mxmoe", description="mxmoe command line")
    sub = parser.add_subparsers(dest="command", metavar="command", required=True)
    # Only the chosen command's module is imported (its help and arguments included).
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (target, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            _load(target).add_arguments(p)
    args = parser.parse_args(argv)
    return int(_load(COMMANDS[args.command][0]).main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
