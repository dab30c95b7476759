"""Vector stores: where dense vectors live and are searched. Local (numpy exact, FAISS) by default."""

from .base import VectorStore
from .local import FaissStore, NumpyStore, load_store, make_store

__all__ = ["VectorStore", "NumpyStore", "FaissStore", "make_store", "load_store"]
