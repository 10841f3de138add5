"""`python -m mxmoe <command>`.

Each command lives in its own module, imported only when that command runs, which provides
`add_arguments(parser)` and `main(args) -> exit status`. To add a command (e.g. `bench`), add a line to
COMMANDS.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": ("mxmoe.train", "train a small MoE LM with bf16 and with MXFP8 experts and compare the losses"),
    "bench": ("mxmoe.bench", "benchmark MXFP8 grouped GEMMs against bf16 (GPU)"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m mxmoe", description="mxmoe command line")
    sub = parser.add_subparsers(dest="command", metavar="command", required=True)
    # Only the chosen command's module is imported (its help and arguments included).
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        if name == chosen:
            importlib.import_module(module).add_arguments(p)
    args = parser.parse_args(argv)
    module = importlib.import_module(COMMANDS[args.command][0])
    return int(module.main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
