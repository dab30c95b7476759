"""How much a deployment's own evidence is worth: probabilities fitted on what feedback taught it.

Two questions, answered from the deployment's data and nothing else, so that no catalog's habits are
assumed for another:

- `learned`: a new task's vector is `s` (cosine) from the nearest request that taught tool t. How likely is
  t one of the tools it needs? Fitted leave-one-out on the taught requests themselves: each anchor request
  plays a new task against all the others, and whether its own tools are among the three tools its near
  neighbours taught is counted per similarity bin (`by_similarity`, the cautious table: the other near
  tools count as misses). The tools the task's nearest taught request taught have a table of their own
  (`by_nearest`: the same counts, for those tools only): where similar requests need the same tool, the
  nearest request's tool is needed far more often than the second or third nearest at the same similarity.
  It is fitted on taught requests alone, so it says which taught tool a task needs, not how many tasks need
  a tool nobody taught: `channel.py` uses it only against taught tools.
- `base`: how likely is the tool the untaught ranking puts at rank r one of the tools a task needs? Fitted
  from where each taught tool ranked, untaught, for the request that taught it (the self-measurement of
  `scorecard.py` records it before learning).

All are binned counts with `PRIOR` pseudo-misses per bin (little evidence says little) made monotone by
isotonic regression: more similar never means less likely, a lower rank never means more likely.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SIM_BINS = 20  # cosine bins of width 0.05 over [0, 1]; negative similarities share the lowest bin
PRIOR = 2.0  # pseudo-misses per bin (chosen on train-split validation, docs/learning.md)
RANK_EDGES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20, 50, 100)  # upper rank of each bucket; past the last: not found
NEIGHBOUR_TOOLS = 3  # tools per anchor counted in the `learned` tables


def isotonic(values: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence nearest to `values` in weighted least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, length]
    for value, weight in zip(values.astype(float), weights.astype(float)):
        blocks.append([value, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            high, low = blocks.pop(), blocks.pop()
            total = high[1] + low[1]
            mean = (high[0] * high[1] + low[0] * low[1]) / total if total else 0.0
            blocks.append([mean, total, high[2] + low[2]])
    return np.asarray([mean for mean, _w, length in blocks for _ in range(int(length))])


def sim_bin(similarity: float) -> int:
    return min(max(int(similarity * SIM_BINS), 0), SIM_BINS - 1)


def sim_bins(similarities: np.ndarray) -> np.ndarray:
    """`sim_bin` of each similarity (both truncate toward zero)."""
    return np.clip((np.asarray(similarities) * SIM_BINS).astype(np.int64), 0, SIM_BINS - 1)


def rank_bucket(rank: int | None) -> int:
    """The bucket of a 1-based rank (None: not in the untaught ranking's depth)."""
    if rank is None:
        return len(RANK_EDGES)
    for bucket, edge in enumerate(RANK_EDGES):
        if rank <= edge:
            return bucket
    return len(RANK_EDGES)


def bucket_widths() -> np.ndarray:
    lower = (0,) + RANK_EDGES[:-1]
    return np.asarray([edge - low for edge, low in zip(RANK_EDGES, lower)] + [0], dtype=float)


@dataclass
class BinCounts:
    """Hits and trials per bin."""

    hits: np.ndarray
    trials: np.ndarray

    @classmethod
    def zeros(cls, bins: int) -> "BinCounts":
        return cls(np.zeros(bins), np.zeros(bins))

    def rates(self, increasing: bool) -> np.ndarray:
        """hits / (trials + PRIOR) per bin, monotone in the direction asked."""
        raw, weight = self.hits / (self.trials + PRIOR), self.trials + PRIOR
        if increasing:
            return isotonic(raw, weight)
        return isotonic(raw[::-1], weight[::-1])[::-1]


@dataclass(frozen=True)
class Calibration:
    """The fitted tables (module doc); `EMPTY` before any feedback: every probability 0."""

    by_similarity: np.ndarray  # P(needed | one of the nearest taught tools, similarity bin)
    by_nearest: np.ndarray  # P(needed | a tool the nearest taught request taught, similarity bin)
    by_rank: np.ndarray  # P(needed | untaught rank bucket)

    def learned(self, similarity: float, nearest: bool) -> float:
        """`nearest`: the tool is one the task's nearest taught request taught."""
        return float((self.by_nearest if nearest else self.by_similarity)[sim_bin(similarity)])

    def base(self, rank: int | None) -> float:
        return float(self.by_rank[rank_bucket(rank)])

    def to_dict(self) -> dict:
        return {"similarity_bins": SIM_BINS, "by_similarity": [round(float(p), 4) for p in self.by_similarity],
                "by_nearest": [round(float(p), 4) for p in self.by_nearest],
                "rank_edges": list(RANK_EDGES), "by_rank": [round(float(p), 4) for p in self.by_rank]}


EMPTY = Calibration(np.zeros(SIM_BINS), np.zeros(SIM_BINS), np.zeros(len(RANK_EDGES) + 1))


def fit(neighbours: BinCounts, nearest: BinCounts, found: np.ndarray, requests: int) -> Calibration:
    """The tables from the anchors' counts (`neighbours`: their three nearest tools; `nearest`: those of
    them the nearest request taught) and, per rank bucket, how many taught tools the untaught ranking had
    put there (`found`) for `requests` distinct taught requests."""
    trials = bucket_widths() * requests
    by_rank = BinCounts(found.astype(float), trials).rates(increasing=False)
    by_rank[-1] = 0.0  # past the ranking's depth nothing is known: no base probability
    return Calibration(neighbours.rates(increasing=True), nearest.rates(increasing=True), by_rank)
