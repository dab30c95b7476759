#!/usr/bin/env bash
# Set everything up, then run the whole test suite (tests needing ../shared/data skip without it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python -m pytest -q -rs "$@"
