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
SETS=(apibank gorilla_torchhub metatool rotbench sealtools toollens taskbench_dailylifeapis_corpus
      taskbench_huggingface_corpus taskbench_multimedia_corpus tool2vec_aws_corpus tool2vec_numpy_corpus
      tool2vec_pandas_corpus)
for s in "${SETS[@]}"; do
  [ -d "$DATA/$s" ] || { echo "build_fast_queries: $DATA/$s is missing (need the dev data beside the repo)" >&2; exit 2; }
done
"$PY" -m toolscout.train.static_queries --data "${SETS[@]/#/$DATA/}" --out src/toolscout/data/static/toolscout-tools
du -sh src/toolscout/data/static/toolscout-tools
