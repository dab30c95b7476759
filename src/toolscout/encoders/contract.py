"""The query-encoder contract: what turns tasks into vectors for a dense retriever.

The encoder itself (`Encoder`), a fast tier distilled from it (the static table, the query student:
`encoders/fast.py`) and ToolCLIP's task tower all honour it, so a dense retriever holds whichever one
encodes its tasks and calls it the same way.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, Sequence, runtime_checkable

import numpy as np

from ..query import Query

if TYPE_CHECKING:
    from .query_cache import QueryCache


@runtime_checkable
class QueryEncoder(Protocol):
    dim: int

    def encode_queries(self, queries: Sequence[Query | str]) -> np.ndarray:
        """One unit row per query (`toolscout.query`: plain strings are read as `Query.of` reads them),
        float32, shape (len(queries), dim)."""
        ...


@runtime_checkable
class CachesQueries(Protocol):
    """A query encoder that keeps the vectors of recent tasks (`QueryCache`): the encoder, its fast tiers."""

    query_cache: "QueryCache"


@runtime_checkable
class KnowsCase(Protocol):
    """An encoder that can say whether letter case changes its vectors (`Encoder.case_blind`); one that
    cannot is taken to read case."""

    @property
    def case_blind(self) -> bool: ...
