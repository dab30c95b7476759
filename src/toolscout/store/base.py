"""The store contract. A pgvector (or any database) backend implements the same methods."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

import numpy as np

from ..results import Filter, Results


@runtime_checkable
class VectorStore(Protocol):
    """Unit vectors keyed by tool id, each tagged with the tool's namespace for filtered search.

    Scores are inner products (cosine similarity for unit vectors), higher is better.
    """

    dim: int

    def upsert(self, ids: Sequence[str], vectors: np.ndarray, namespaces: Sequence[str | None]) -> None:
        """Insert or replace the vectors of `ids`."""

    def delete(self, ids: Sequence[str]) -> None:
        """Remove `ids`; unknown ids are ignored."""

    def search(self, vectors: np.ndarray, k: int, filter: Filter | None = None) -> Results:
        """The k best ids for each query vector, restricted by `filter`."""

    def get(self, ids: Sequence[str]) -> np.ndarray:
        """The stored vectors of `ids`, in order (KeyError for an unknown id)."""

    def __len__(self) -> int: ...

    def save(self, folder: Path) -> dict:
        """Write the store's files into `folder`; return the config entries needed to load it."""
