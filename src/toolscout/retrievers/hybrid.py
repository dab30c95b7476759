"""Hybrid first stage: fuse the rankings of several retrievers (e.g. BM25 + dense).

`fusion="rrf"` — reciprocal-rank fusion: score(t) = Σ_r w_r / (rrf_k + rank_r(t)), ranks from 1; robust
because it ignores the retrievers' incomparable score scales. `fusion="max"` — each retriever's scores
are divided by its best score for the query (so 1 is the best match and a tool scores by how close it
comes to it; an encoder's cosines by at least `COSINE_FLOOR`), then summed with weights. `fusion="score"`
— the same with min–max scaling over each retriever's top `depth`, which stretches a list whose scores are
all close (a query no tool fits well) as far as one with a clear winner. A tool a retriever did not
return gets 0 from it. Defaults (max fusion, BM25 : dense = 1 : 3, chosen leaving one training set out at
a time): `toolscout.defaults`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..artifacts import read_json
from ..defaults import HYBRID_FUSION, HYBRID_WEIGHTS
from ..errors import InvalidRequest
from ..query import Query, as_queries
from ..results import Filter, Results
from ..tool import TextView
from .base import (
    Accepts,
    BadSetting,
    Encoding,
    Retriever,
    load_retriever,
    make_retriever,
    write_retriever_config,
)

FUSIONS = ("rrf", "max", "score")
RRF_K = 60  # reciprocal-rank fusion's constant, when not told
DEPTH = 100  # how many of each component's hits are fused, when not told


# Max fusion divides a cosine list by at least this: a best cosine under it is no real match (every training
# task of the dev sets finds a tool above it), and dividing by a best near 0 (a catalog of one or two tools,
# a task nothing fits) made its top a full match and its other tools' scores huge and negative.
COSINE_FLOOR = 0.1


def default_settings(names: Sequence[str]) -> dict[str, Any]:
    """`settings()` of a hybrid over components named `names`, built without fusion settings."""
    return {"weights": [HYBRID_WEIGHTS.get(name, 1.0) for name in names], "fusion": HYBRID_FUSION,
            "rrf_k": RRF_K, "depth": DEPTH}


class HybridRetriever:
    name = "hybrid"
    accepts = Accepts(model=True, trained_by="embed", store=True, view=True, encoder=True)

    def __init__(self, components: Sequence[str | Retriever] = ("bm25", "dense"),
                 weights: Sequence[float] | None = None, fusion: str = HYBRID_FUSION, rrf_k: int = RRF_K,
                 depth: int = DEPTH,
                 component_options: dict[str, dict[str, Any]] | None = None, view: TextView | None = None,
                 **shared_options: Any):
        if fusion not in FUSIONS:
            raise ValueError(f"unknown fusion {fusion!r}; use one of {', '.join(FUSIONS)}")
        if len(components) < 2:
            raise ValueError("a hybrid retriever needs at least two components")
        component_options = component_options or {}
        self.components: list[Retriever] = []
        for comp in components:
            if isinstance(comp, str):
                options = dict(component_options.get(comp, {}))
                if view is not None:  # every component reads the same text view
                    options.setdefault("view", view)
                if comp != "bm25":  # encoder-based components share e.g. --model / encoder=
                    options = {**shared_options, **options}
                try:
                    comp = make_retriever(comp, **options)
                except BadSetting as exc:
                    if exc.key not in shared_options:
                        raise
                    raise BadSetting(exc.key, f"{exc} (the hybrid retriever passes each setting it does not "
                                              "take itself to its encoder components)") from None
            self.components.append(comp)
        if weights is not None and not all(isinstance(w, (int, float)) and not isinstance(w, bool) for w in weights):
            raise InvalidRequest(f"the hybrid retriever: weights are a list of numbers, got {weights!r}")
        self.weights = [float(w) for w in weights] if weights is not None else \
            default_settings([c.name for c in self.components])["weights"]
        if len(self.weights) != len(self.components):
            raise ValueError(f"{len(self.weights)} weights for {len(self.components)} components")
        if not all(0 <= w < math.inf for w in self.weights) or not rrf_k > 0 or not depth >= 1:
            raise InvalidRequest(f"the hybrid retriever: weights are numbers of 0 or more, rrf_k is above 0 and depth "
                                 f"at least 1, got weights={self.weights}, rrf_k={rrf_k!r}, depth={depth!r}")
        self.fusion, self.rrf_k, self.depth = fusion, rrf_k, depth
        # each list's divisor floor, decided once (a protocol check per search cost as much as the fusion)
        self._floors = [COSINE_FLOOR if isinstance(comp, Encoding) else 0.0 for comp in self.components]

    def __len__(self) -> int:
        return len(self.components[0])

    def index(self, tools) -> None:
        for comp in self.components:
            comp.index(tools)

    def add(self, tools) -> None:
        for comp in self.components:
            comp.add(tools)

    def remove(self, ids) -> None:
        for comp in self.components:
            comp.remove(ids)

    def search(self, queries: Sequence[Query | str], k: int = 10, filter: Filter | None = None) -> Results:
        queries = as_queries(queries)  # each task read once, then handed to every component
        depth = max(k, self.depth)
        per_component = [comp.search(queries, depth, filter) for comp in self.components]
        ids_out, scores_out = [], []
        for q in range(len(queries)):
            fused: dict[str, float] = {}
            for weight, results, floor in zip(self.weights, per_component, self._floors):
                ids, scores = results[q]
                for tid, contribution in zip(ids, self._contributions(scores, floor)):
                    fused[tid] = fused.get(tid, 0.0) + weight * contribution
            ranked = sorted(fused.items(), key=lambda item: -item[1])[:k]
            ids_out.append(np.asarray([tid for tid, _ in ranked], dtype=object))
            scores_out.append(np.asarray([s for _, s in ranked], dtype=np.float32))
        return Results(tuple(ids_out), tuple(scores_out))

    def _contributions(self, scores: np.ndarray, floor: float = 0.0) -> np.ndarray:
        if self.fusion == "rrf":
            return 1.0 / (self.rrf_k + np.arange(1, len(scores) + 1))
        if len(scores) == 0:
            return scores
        low, high = float(scores.min()), float(scores.max())
        if self.fusion == "max":  # a list whose best score is not positive (no real match) adds nothing
            return scores / max(high, floor) if high > 0 else np.zeros_like(scores)
        return np.ones_like(scores) if high == low else (scores - low) / (high - low)

    def save(self, folder: Path) -> None:
        names = []
        for i, comp in enumerate(self.components):
            comp.save(folder / f"component{i}")
            names.append(comp.name)
        write_retriever_config(folder, self.name, components=names, **self.settings())

    def settings(self) -> dict[str, Any]:
        """How the components' lists are fused: what `save` records, and what a hybrid over other
        components (`HybridRetriever(parts, **settings)`) needs to rank the same way."""
        return {"weights": list(self.weights), "fusion": self.fusion, "rrf_k": self.rrf_k, "depth": self.depth}

    @classmethod
    def load(cls, folder: Path) -> "HybridRetriever":
        config = read_json(folder / "config.json")
        components = [load_retriever(folder / f"component{i}") for i in range(len(config["components"]))]
        return cls(components, weights=config["weights"], fusion=config["fusion"], rrf_k=config["rrf_k"],
                   depth=config["depth"])
