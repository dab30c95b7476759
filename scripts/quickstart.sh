#!/usr/bin/env bash
# Set everything up, then index the bundled sample catalog and answer example tasks.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1
toolscout demo --out .toolscout-demo "$@"
