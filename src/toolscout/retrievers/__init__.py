"""First-stage retrievers. Use `make_retriever(name, **options)`; `REGISTRY` lists the names."""

from .base import REGISTRY, Retriever, load_retriever, make_retriever, retriever_class

__all__ = ["Retriever", "REGISTRY", "make_retriever", "load_retriever", "retriever_class"]
