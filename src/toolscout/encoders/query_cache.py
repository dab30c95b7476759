"""The embeddings of recent queries: agents repeat tasks, and a query vector depends on nothing but the
text and the encoder, so a repeated task skips the encoder entirely."""

from __future__ import annotations

import threading
from typing import Callable, Hashable, Sequence

import numpy as np

from ..lru import LRU


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

    def vectors(self, texts: Sequence[str], key: Hashable, compute: Callable[[list[str]], np.ndarray]) -> np.ndarray:
        """The vector of each text: cached ones as they are, the others from `compute(missing texts)`."""
        if self.entries.size == 0:
            return compute(list(texts))
        with self._lock:
            if key != self._key:
                self.entries.clear()
                self._key = key
        found = [self.entries.get(text) for text in texts]
        missing = list(dict.fromkeys(t for t, v in zip(texts, found) if v is None))
        if missing:
            fresh = dict(zip(missing, compute(missing)))
            with self._lock:
                if key == self._key:  # the encoder did not change while these were computed
                    for text, vector in fresh.items():
                        self.entries.put(text, vector)
            found = [fresh[t] if v is None else v for t, v in zip(texts, found)]
        return np.stack(found).astype(np.float32, copy=False)
