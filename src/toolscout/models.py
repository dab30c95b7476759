"""Trained model directories: what `toolscout train METHOD --out DIR` writes and retrievers load.

A model directory is an artefact (see `artifacts.py`) whose `config.json` has kind `toolscout.model`,
the `method` that trained it, the training run summary, and whatever that method needs to load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .artifacts import CONFIG, POINTER, ArtifactError, check_format, read_json, resolve

MODEL_KIND = "toolscout.model"
FORMAT_VERSION = 1


def model_config(path: str | Path | None, method: str | None = None) -> tuple[Path, dict[str, Any]] | None:
    """(live folder, config) when `path` is a toolscout model directory, else None (a plain encoder name).
    A model directory of a format this toolscout does not read, whose CURRENT names a missing version, or
    whose config.json is not JSON, is an ArtifactError naming it.

    With `method`, a model trained by another method is an error that names both.
    """
    if path is None:
        return None
    root = Path(path)
    if not root.is_dir() or not ((root / POINTER).exists() or (root / CONFIG).exists()):
        return None
    folder = resolve(root)  # a CURRENT naming a missing version is an error that says so
    config = read_json(folder / CONFIG)
    if not isinstance(config, dict) or config.get("kind") != MODEL_KIND:
        return None  # a plain encoder's folder (its config.json is the transformer's)
    # a model saved by a newer toolscout says so ("upgrade toolscout"), not read as an encoder's folder
    check_format(path, config, FORMAT_VERSION)
    if method is not None and config.get("method") != method:
        raise ArtifactError(f"{path}: is a {config.get('method')!r} model, not a {method!r} model; "
                            f"`toolscout eval SET --model {path}` names the flags that use it")
    return folder, config


def model_base(method: str, **extra: Any) -> dict[str, Any]:
    return {"kind": MODEL_KIND, "format_version": FORMAT_VERSION, "method": method, **extra}
