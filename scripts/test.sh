#!/usr/bin/env bash
# Set everything up, then run the whole test suite (tests needing ../shared/data skip without it).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Three workers, each taking whole files (module fixtures start gateways and servers once): many tests wait on
# subprocesses, timeouts and databases, so a third worker keeps two cores busy while one of the others waits
# (with two, the cores stood partly idle). TOOLSCOUT_TEST_WORKERS=0 runs it in one process (for
# a debugger, or to time one test alone).
python -m pytest -q -rs -n "${TOOLSCOUT_TEST_WORKERS:-3}" --dist loadfile "$@"
