"""Where requests and tasks are compared: the vectors the learned channel matches.

`EncoderSpace` uses the pipeline's own dense encoder (its query embedding, so a task searched costs no
second encoding: the encoder's query cache already holds it). A first stage with no encoder (BM25, a
classifier) gets `HashedSpace`: a bag of hashed word counts, which needs no model.
"""

from __future__ import annotations

import hashlib
import re
from typing import Protocol, Sequence

import numpy as np

from ..encoders.contract import KnowsCase
from ..query import Query, as_queries


class RequestSpace(Protocol):
    name: str
    dim: int
    # whether letter case changes no vector: a request is then embedded as it was written (what it
    # teaches of it), so a task just searched whose text it all teaches comes from the encoder's query
    # cache instead of being encoded again (a request's key, what it is remembered under, ignores case
    # either way)
    case_blind: bool

    def tasks(self, queries: Sequence[Query]) -> np.ndarray:
        """Unit vectors of tasks as searched."""

    def requests(self, texts: Sequence[str]) -> np.ndarray:
        """Unit vectors of remembered requests."""


class EncoderSpace:
    def __init__(self, encoder):
        self.encoder = encoder
        self.name, self.dim = f"encoder:{encoder.name}", int(encoder.dim)

    @property
    def case_blind(self) -> bool:
        # asked each time: the encoder may move to torch (weights trained in place)
        return isinstance(self.encoder, KnowsCase) and self.encoder.case_blind

    def tasks(self, queries: Sequence[Query]) -> np.ndarray:
        return _unit(self.encoder.encode_queries(as_queries(queries)))

    def requests(self, texts: Sequence[str]) -> np.ndarray:
        return _unit(self.encoder.encode_queries(list(texts)))


_WORD = re.compile(r"[a-z0-9]{2,}")


class HashedSpace:
    """Words hashed into `dim` buckets, counted with a logarithm (a repeated word says little more)."""

    case_blind = True  # words are lowercased before they are hashed

    def __init__(self, dim: int = 512):
        self.name, self.dim = f"hashed:{dim}", dim

    def tasks(self, queries: Sequence[Query]) -> np.ndarray:
        return self.requests([q.text for q in as_queries(queries)])

    def requests(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in _WORD.findall(text.lower()):
                out[row, int.from_bytes(hashlib.md5(word.encode()).digest()[:4], "big") % self.dim] += 1.0
        return _unit(np.log1p(out))


def _unit(vectors) -> np.ndarray:
    vectors = np.atleast_2d(np.asarray(vectors, dtype=np.float32))
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms > 0, norms, 1.0)


def space_for(retriever) -> RequestSpace:
    """The pipeline's dense encoder, or hashed words when its first stage has none."""
    from ..retrievers.base import encoding_parts

    parts = encoding_parts(retriever)
    return EncoderSpace(parts[0].encoder) if parts else HashedSpace()
