#!/usr/bin/env bash
# README's first command: the training demo (bf16 vs MXFP8 experts, side-by-side report + plot).
# Extra arguments go to `python -m mxmoe train` (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m mxmoe train "$@"
