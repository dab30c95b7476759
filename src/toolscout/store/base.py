"""The store contract: everything a retriever asks of the vectors it keeps. Local stores (numpy, FAISS)
and the PostgreSQL store (`pgvector.py`) implement it; the PostgreSQL catalog around a tenant's vectors
(documents, versions, the change log, feedback: `pg_catalog.py`) is not part of this contract."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from ..results import Filter, Results


@runtime_checkable
class VectorStore(Protocol):
    """Unit vectors keyed by tool id, each tagged with the tool's namespace for filtered search.

    Scores are inner products (cosine similarity for unit vectors), higher is better.
    """

    dim: int

    def upsert(self, ids: Sequence[str], vectors: np.ndarray, namespaces: Sequence[str | None] | None = None) -> None:
        """Insert or replace the vectors of `ids` with their namespaces (None: no namespace)."""

    def update_vectors(self, ids: Sequence[str], vectors: np.ndarray) -> None:
        """Replace the vectors of ids already stored, keeping their namespaces; KeyError (and nothing
        changed) when an id is not stored."""

    def delete(self, ids: Sequence[str]) -> None:
        """Remove `ids`; unknown ids are ignored."""

    def search(self, vectors: np.ndarray, k: int, filter: Filter | None = None) -> Results:
        """The k best ids for each query vector, restricted by `filter`."""

    def get(self, ids: Sequence[str]) -> np.ndarray:
        """The stored vectors of `ids`, in order (KeyError for an unknown id)."""

    def __len__(self) -> int:
        """How many vectors are stored."""

    def save(self, folder: Path) -> dict:
        """Write the store's files into `folder`; return the config entries needed to load it."""

    @classmethod
    def load(cls, folder: Path, config: dict) -> "VectorStore":
        """The store `save` wrote into `folder`, given the config entries it returned."""


def as_array(value: Any) -> np.ndarray:
    """A vector as a database driver returns it (pgvector's type, a list, an array), as float32 numpy."""
    if isinstance(value, np.ndarray):
        return value.astype(np.float32, copy=False)
    return np.asarray(value.to_numpy() if hasattr(value, "to_numpy") else value, dtype=np.float32)


def checked_vectors(ids: Sequence[str], vectors: np.ndarray, dim: int, action: str) -> np.ndarray:
    """`vectors` as a contiguous float32 (len(ids), dim) array; ValueError for a wrong shape, a count that
    does not match `ids`, or an id given twice (`action` names the call in the message)."""
    vectors = np.ascontiguousarray(vectors, dtype=np.float32)
    if vectors.ndim != 2 or vectors.shape[1] != dim:
        raise ValueError(f"expected vectors of shape (n, {dim}), got {vectors.shape}")
    if len(ids) != len(vectors):
        raise ValueError(f"{len(ids)} ids but {len(vectors)} vectors")
    if len(set(ids)) != len(ids):
        raise ValueError(f"{action}: duplicate ids in one call")
    return vectors
