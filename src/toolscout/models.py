"""Trained model directories: what `toolscout train METHOD --out DIR` writes and retrievers load.

A model directory is an artefact (see `artifacts.py`) whose `config.json` has kind `toolscout.model`,
the `method` that trained it, the training run summary, and whatever that method needs to load.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .artifacts import ArtifactError, read_config

MODEL_KIND = "toolscout.model"
FORMAT_VERSION = 1


def model_config(path: str | Path | None, method: str | None = None) -> tuple[Path, dict[str, Any]] | None:
    """(live folder, config) when `path` is a toolscout model directory, else None (a plain encoder name).

    With `method`, a model trained by another method is an error that names both.
    """
    if path is None:
        return None
    root = Path(path)
    if not root.is_dir() or not ((root / "CURRENT").exists() or (root / "config.json").exists()):
        return None
    try:
        folder, config = read_config(root, max_format=FORMAT_VERSION)
    except ArtifactError:
        return None
    if config.get("kind") != MODEL_KIND:
        return None
    if method is not None and config.get("method") != method:
        raise ArtifactError(f"{path}: is a {config.get('method')!r} model, not a {method!r} model; "
                            f"`toolscout eval SET --model {path}` names the flags that use it")
    return folder, config


def model_base(method: str, **extra: Any) -> dict[str, Any]:
    return {"kind": MODEL_KIND, "format_version": FORMAT_VERSION, "method": method, **extra}
