"""A small least-recently-used map, safe from many threads, that counts its hits and misses."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Hashable


class LRU:
    """At most `size` entries (0: keeps nothing); the least recently used goes first."""

    def __init__(self, size: int):
        self.size = max(0, int(size))
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        """The value under `key`, or None (counted as a miss)."""
        with self._lock:
            value = self._entries.get(key)
            if value is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: Hashable, value: Any) -> None:
        if self.size == 0:
            return
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
