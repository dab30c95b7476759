#!/usr/bin/env bash
# Create .venv-peers (if missing) for benchmarks/peers.py: the alternatives to toolscout, pinned, in their own
# environment so their dependencies cannot disturb toolscout's. torch goes first, pinned, so pip takes the CPU
# build instead of a multi-GB CUDA one. toolscout is not installed here: its systems run in toolscout's own
# environment (the interpreter that runs benchmarks/peers.py).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv-peers/bin/python ]; then
  "$PYTHON" -m venv .venv-peers
fi
stamp=.venv-peers/.peers-installed
if [ ! -f "$stamp" ] || [ benchmarks/peers-requirements.txt -nt "$stamp" ]; then
  .venv-peers/bin/python -m pip install --quiet --upgrade pip
  .venv-peers/bin/python -m pip install --quiet torch==2.13.0
  .venv-peers/bin/python -m pip install --quiet -r benchmarks/peers-requirements.txt
  touch "$stamp"
fi
