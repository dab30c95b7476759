#!/usr/bin/env bash
# Rebuild the default encoder's query student (src/toolscout/data/models/toolscout-tools-queries) from the dev data.
#
#   bash scripts/build_query_student.sh [DATA_DIR] [WORK_DIR]
#
# Distils layers 0, 2, 4 and 5 of toolscout-tools into a four-layer encoder for tasks
# (toolscout.train.query_student): the teacher's vectors of the train-split tasks of the six dev sets not
# kept for zero-shot checks (bfcl and gorilla_huggingface are never trained on) and of the tool texts of
# those sets and of the unlabelled corpora are the targets, with early stopping on the validation tasks
# carved from the train splits. Then it packages the student (only its four layers and the small embedding
# tensors, float16) and runs its quality check on the dev test splits, recording the verdict in its
# manifest (benchmarks/query_student.py, then scripts/record_quality_check.py): the student tier (--student-queries) serves only
# where that check passed. CPU is enough: about an hour on two cores, plus ten minutes for the check.
# Rebuild it after rebuilding the default encoder: a student serves only the teacher it was distilled from.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${1:-../shared/data}"
WORK="${2:-runs/query-student}"
PY="${PYTHON:-.venv/bin/python}"
source scripts/dev_sets.sh
require_sets build_query_student "$DATA" "${DISTIL_SETS[@]}"
"$PY" -m toolscout.train.query_student --data "${DISTIL_SETS[@]/#/$DATA/}" --out "$WORK" --teacher toolscout-tools
"$PY" - "$WORK" <<'PY'
import json, sys
from pathlib import Path
from toolscout.encoders.packaged import MODELS_DIR
from toolscout.train.packaging import package_student

trained = json.loads((Path(sys.argv[1]) / "toolscout-student.json").read_text())
info = package_student(sys.argv[1], MODELS_DIR / "toolscout-tools-queries", name="toolscout-tools-queries",
                       layers=trained["layers"], teacher="toolscout-tools",
                       extra={"trained": trained, "rebuild": "bash scripts/build_query_student.sh",
                              "selection": "docs/serving.md, 'The query student'"})
print(f"packaged toolscout-tools-queries: {info['tensors']} tensors, layers {info['layers']}")
PY
"$PY" benchmarks/query_student.py --data "$DATA" --json "$WORK/student-check.json"
"$PY" scripts/record_quality_check.py "$WORK/student-check.json" --model toolscout-tools-queries
du -sh src/toolscout/data/models/toolscout-tools-queries
