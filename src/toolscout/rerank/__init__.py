"""Second stage: rerankers that reorder a first stage's top candidates (cross-encoder, ToolRefiner, LLM)."""

from .base import DEFAULT_DEPTH, REGISTRY, Reranker, load_reranker, reranker_class

__all__ = ["Reranker", "REGISTRY", "DEFAULT_DEPTH", "load_reranker", "reranker_class"]
