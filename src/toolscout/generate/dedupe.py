"""Near-duplicate detection for generated queries, with no model: character n-gram Jaccard similarity.

Text is normalised (lowercase, punctuation → space, whitespace collapsed) and cut into character
n-grams (n=3 by default, over the words joined by single spaces). Two queries are near duplicates when
the Jaccard similarity of their n-gram sets reaches `threshold`.

Candidates are found with MinHash + banding (LSH, 16 bands × 4 rows) and then checked exactly, so adding
a query costs about the same at 100 or 100,000 queries. A pair at the threshold 0.7 becomes a candidate
with probability ≈ 0.99; pairs below ≈ 0.3 rarely do (the check is exact, so misses are the only error).
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict

import numpy as np

_PRIME = (1 << 31) - 1
_NON_WORD = re.compile(r"[\W_]+", re.UNICODE)


def normalise(text: str) -> str:
    return " ".join(_NON_WORD.sub(" ", text.lower()).split())


def shingles(text: str, n: int = 3) -> frozenset[str]:
    norm = normalise(text)
    if len(norm) <= n:
        return frozenset([norm]) if norm else frozenset()
    return frozenset(norm[i: i + n] for i in range(len(norm) - n + 1))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 1.0
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


def similarity(text_a: str, text_b: str, n: int = 3) -> float:
    """Character n-gram Jaccard similarity of two texts (1.0 for texts equal after normalisation)."""
    return jaccard(shingles(text_a, n), shingles(text_b, n))


class NearDuplicateIndex:
    """Holds accepted texts; `add(text)` accepts a text unless one already held is too similar."""

    def __init__(self, threshold: float = 0.7, n: int = 3, bands: int = 16, rows: int = 4, seed: int = 1):
        if not 0 < threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        self.threshold, self.n, self.bands, self.rows = threshold, n, bands, rows
        rng = np.random.default_rng(seed)
        size = bands * rows
        self._a = rng.integers(1, _PRIME, size=size, dtype=np.uint64)
        self._b = rng.integers(0, _PRIME, size=size, dtype=np.uint64)
        self._buckets: list[dict[bytes, list[int]]] = [defaultdict(list) for _ in range(bands)]
        self._sets: list[frozenset[str]] = []
        self.texts: list[str] = []

    def __len__(self) -> int:
        return len(self.texts)

    def _signature(self, grams: frozenset[str]) -> np.ndarray:
        # 31-bit hashes and a Mersenne prime 2^31-1: a*h + b stays below 2^63, exact in uint64
        hashes = np.fromiter((int.from_bytes(hashlib.blake2b(g.encode("utf-8"), digest_size=4).digest(), "big") & _PRIME
                              for g in grams), dtype=np.uint64, count=len(grams))
        return ((self._a[:, None] * hashes[None, :] + self._b[:, None]) % np.uint64(_PRIME)).min(axis=1)

    def _keys(self, signature: np.ndarray) -> list[bytes]:
        return [signature[i * self.rows:(i + 1) * self.rows].tobytes() for i in range(self.bands)]

    def nearest(self, text: str) -> tuple[int, float] | None:
        """(index, similarity) of the most similar held text at or above the threshold, else None."""
        grams = shingles(text, self.n)
        if not grams or not self.texts:
            return None
        signature = self._signature(grams)
        candidates: set[int] = set()
        for band, key in enumerate(self._keys(signature)):
            candidates.update(self._buckets[band].get(key, ()))
        best = None
        for index in candidates:
            score = jaccard(grams, self._sets[index])
            if score >= self.threshold and (best is None or score > best[1]):
                best = (index, score)
        return best

    def add(self, text: str) -> bool:
        """Hold `text` and return True, or return False (and hold nothing) if it is a near duplicate."""
        grams = shingles(text, self.n)
        if not grams:
            return False
        if self.texts and self.nearest(text) is not None:
            return False
        index = len(self.texts)
        for band, key in enumerate(self._keys(self._signature(grams))):
            self._buckets[band][key].append(index)
        self._sets.append(grams)
        self.texts.append(text)
        return True
