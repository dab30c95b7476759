"""ONNX exports that ship inside a packaged model, so that it encodes with onnxruntime and tokenizers alone:
no torch, no sentence-transformers, no base-model package (a lean install: docs/install.md).

A packaged model's folder (`toolscout/data/models/NAME/`, `encoders.packaged`) may hold one folder per
exported variant, e.g. `onnx-int8/`:

    model.onnx      the graph, exactly as `Encoder` exports it on a machine with torch (`onnx_export`: fused,
                    quantised, checked against the torch model), with its fused layer norms already split
                    (`onnx_runtime.runtime_graph`), so running it needs no `onnx` package
    tokenizer.json  the model's fast tokenizer (HF `tokenizers`)
    meta.json       the export's settings (pooling, inputs, lengths), as in the export cache
    export.json     what it was exported from (the SHA-256 of the packaged layers, of the base weights and of
                    the assembled weights), the SHA-256 of model.onnx, the libraries that built it, the
                    command that rebuilds it

An export serves only the packaged model it was exported from: after the model is rebuilt (other layers),
the old export is ignored, with a warning, and the encoder exports again (with torch) or says that it
cannot. Whether `auto` runs the int8 variant is still the model's recorded quality check
(`encoders/quality.py`), and where this machine's int8 kernels give other vectors than the checked ones, it
says so (`Encoder`). Writing an export is a release step: `toolscout.train.packaging.package_onnx`
(scripts/build_onnx_export.sh).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from .onnx_export import ONNX_EXPORT_FORMAT
from .packaged import LAYERS, WEIGHTS, file_sha256, manifest, package_folder

logger = logging.getLogger(__name__)

VARIANTS = ("onnx-int8", "onnx")
EXPORT_INFO = "export.json"
MODEL_FILE = "model.onnx"


def shipped_variants(folder: Path) -> list[str]:
    """The variants whose export ships in the packaged model's folder `folder` (current or not)."""
    return [variant for variant in VARIANTS if (Path(folder) / variant / EXPORT_INFO).is_file()]


def shipped_export(model_path: str | Path, variant: str) -> Path | None:
    """The shipped export folder of `variant` for the model in `model_path` (a packaged model, assembled or
    run from its package folder), or None: not a packaged model, no such export, or one exported from
    other weights (logged)."""
    source = package_folder(model_path)
    if source is None or not (source / variant / EXPORT_INFO).is_file():
        return None
    info = export_info(source / variant)
    problem = export_problem(source, info)
    if problem is not None:
        logger.warning("the shipped %s export of %s is not used: %s", variant, source.name, problem)
        return None
    return source / variant


def export_info(folder: Path) -> dict[str, Any]:
    return json.loads((Path(folder) / EXPORT_INFO).read_text(encoding="utf-8"))


def export_problem(source: Path, info: dict[str, Any]) -> str | None:
    """Why an export (its export.json `info`) cannot serve the packaged model in `source` now; None if it can."""
    if info.get("format") != ONNX_EXPORT_FORMAT:
        return f"it is export format {info.get('format')}, this toolscout reads {ONNX_EXPORT_FORMAT}"
    if info.get("layers_sha256") != file_sha256(source / LAYERS):
        return "it was exported from other trained layers (rebuild it: scripts/build_onnx_export.sh)"
    if info.get("base_sha256") != manifest(source).get("base_sha256"):
        return "it was exported over another base model (rebuild it: scripts/build_onnx_export.sh)"
    return None


def weights_sha256(model_path: str | Path) -> str | None:
    """SHA-256 of the model's weights file (what a static query table is fitted to): the file itself, or
    for a packaged model run from its package folder, what its shipped export recorded of the weights it
    was exported from; None when neither is there."""
    path = Path(model_path) / WEIGHTS
    if path.is_file():
        return file_sha256(path)
    source = package_folder(model_path)
    for variant in shipped_variants(source) if source is not None else []:
        if shipped_export(source, variant) is not None:
            return export_info(source / variant).get("assembled_sha256")
    return None


def tokenizer_file(model_path: str | Path) -> Path | None:
    """The model's fast tokenizer file: in its folder, or in a shipped export of a packaged model run from
    its package folder; None when neither is there."""
    path = Path(model_path) / "tokenizer.json"
    if path.is_file():
        return path
    source = package_folder(model_path)
    for variant in shipped_variants(source) if source is not None else []:
        if shipped_export(source, variant) is not None:
            return source / variant / "tokenizer.json"
    return None
