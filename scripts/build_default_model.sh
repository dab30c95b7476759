#!/usr/bin/env bash
# Rebuild toolscout's packaged default encoder (src/toolscout/data/models/toolscout-tools) from the dev data.
#
#   bash scripts/build_default_model.sh [DATA_DIR] [WORK_DIR]
#
# DATA_DIR: the benchmark folders (default ../shared/data). WORK_DIR: where the training run is written
# (default runs/default-model). Trains Tool-Embed on the train splits of the six dev sets that are not
# kept for zero-shot checks (bfcl and gorilla_huggingface are never trained on), with the recipe chosen
# under the zero-shot protocol (docs/default-model.md), then stores the layers half way between the base's
# and the trained ones (a WiSE-FT blend, a = 0.5: benchmarks/leave_one_out.py), in float16.
# CPU is enough (about 15 minutes on two cores); a GPU is used when torch sees one.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA="${1:-../shared/data}"
WORK="${2:-runs/default-model}"
PY="${PYTHON:-.venv/bin/python}"
source scripts/dev_sets.sh
require_sets build_default_model "$DATA" "${TRAIN_SETS[@]}"
# --model minilm: train from the untrained base (the default encoder is the model this script builds)
"${TOOLSCOUT:-.venv/bin/toolscout}" train embed --model minilm --data "${TRAIN_SETS[@]/#/$DATA/}" --out "$WORK" --no-resume \
  --batch-size 32 --lr 5e-5 --max-steps 50 --eval-every 50 --seed 0 \
  -o trainable='"layers"' -o negatives=1 -o negatives_from='"set"'
"$PY" - "$WORK" <<'PY'
import sys
from pathlib import Path
from toolscout.encoders.packaged import MODELS_DIR
from toolscout.train.packaging import package

info = package(sys.argv[1], MODELS_DIR / "toolscout-tools", name="toolscout-tools", base="minilm", blend=0.5,
               extra={"rebuild": "bash scripts/build_default_model.sh",
                      "recipe_selection": "docs/default-model.md",
                      "blend_selection": "benchmarks/leave_one_out.py: a = 0.5 ties the untrained base on held-out "
                                         "training sets (65.19 vs 65.18 macro nDCG@10, default fusion) where the "
                                         "fully tuned layers lose 0.35; on the 10% validation carve of the six "
                                         "train splits (dense, in-domain) it keeps 60.21 of the tuned layers' "
                                         "62.14 (untrained: 56.85)"})
print(f"packaged toolscout-tools: {info['tensors']} tensors, best validation {info['trained'].get('best_validation')}")
PY
du -sh src/toolscout/data/models/toolscout-tools
