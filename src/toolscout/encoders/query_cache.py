"""The embeddings of recent queries: agents repeat tasks, and a query vector depends on nothing but the
query and the encoder, so a repeated task skips the encoder entirely."""

from __future__ import annotations

import threading
from typing import Callable, Hashable, Sequence

import numpy as np

from ..lru import LRU
from ..query import Query


class QueryCache:
    """At most `size` vectors, least recently used out first; safe from many threads. `key` tags every
    entry (what the encoder's output depends on besides the text): a new key empties the cache."""

    def __init__(self, size: int = 4096):
        self.entries = LRU(size)
        self._key: Hashable = None
        self._lock = threading.Lock()

    @property
    def hits(self) -> int:
        return self.entries.hits

    @property
    def misses(self) -> int:
        return self.entries.misses

    def clear(self) -> None:
        """Forget every vector (a system timed cold: `toolscout eval`)."""
        self.entries.clear()

    def vectors(self, queries: Sequence[Query], key: Hashable,
                compute: Callable[[list[Query]], np.ndarray]) -> np.ndarray:
        """The vector of each query: cached ones as they are, the others from `compute(missing queries)`.
        A query's entry is its `cache_key` (a request cut from a task: the task and the span too)."""
        if self.entries.size == 0:
            return compute(list(queries))
        with self._lock:
            if key != self._key:
                self.entries.clear()
                self._key = key
        keys = [query.cache_key for query in queries]
        found = [self.entries.get(k) for k in keys]
        missing: dict[Hashable, Query] = {}  # entry -> its first query
        for k, query, vector in zip(keys, queries, found):
            if vector is None:
                missing.setdefault(k, query)
        if missing:
            fresh = dict(zip(missing, compute(list(missing.values()))))
            with self._lock:
                if key == self._key:  # the encoder did not change while these were computed
                    for k, vector in fresh.items():
                        self.entries.put(k, vector)
            found = [fresh[k] if v is None else v for k, v in zip(keys, found)]
        return np.stack(found).astype(np.float32, copy=False)
