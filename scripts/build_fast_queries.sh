#!/usr/bin/env bash
# Rebuild the fast tier's static query table (src/toolscout/data/static/toolscout-tools) from the dev data.
#
#   bash scripts/build_fast_queries.sh [DATA_DIR]
#
# Fits the table to the default encoder's vectors of the train-split tasks of the six dev sets that are
# not kept for zero-shot checks (bfcl and gorilla_huggingface are never trained on) and of the tool texts
# of those sets and of the unlabelled corpora (MIT), with early stopping on the validation tasks carved
# from the train splits (toolscout.train.static_queries). CPU only, about 3 minutes on two cores.
# Rebuild it after rebuilding the default encoder: a table only serves the weights it was fitted to.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${1:-../shared/data}"
PY="${PYTHON:-.venv/bin/python}"
source scripts/dev_sets.sh
require_sets build_fast_queries "$DATA" "${DISTIL_SETS[@]}"
"$PY" -m toolscout.train.static_queries --data "${DISTIL_SETS[@]/#/$DATA/}" --out src/toolscout/data/static/toolscout-tools
du -sh src/toolscout/data/static/toolscout-tools
