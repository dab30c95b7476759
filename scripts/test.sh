#!/usr/bin/env bash
# Set everything up, then run the whole test suite (tests needing ../shared/data skip without it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Two workers, each taking whole files (module fixtures start gateways and servers once): most tests wait on
# subprocesses, so two cores run the suite in about two thirds of the time. TOOLSCOUT_TEST_WORKERS=0 runs it
# in one process (for a debugger, or to time one test alone).
python -m pytest -q -rs -n "${TOOLSCOUT_TEST_WORKERS:-2}" --dist loadfile "$@"
