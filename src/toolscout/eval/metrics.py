"""Per-query ranking metrics at a cut-off k, with binary relevance.

Every function takes the ranked ids (best first), the gold ids and k, and returns a float in [0, 1].
They are plain Python over the top k only (k is small), so one call costs microseconds: an evaluation
of tens of thousands of queries spends its time in retrieval, not here. An id repeated in the ranking
counts once, at its first position, so a buggy system cannot earn more than a perfect one.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Collection, Sequence

METRIC_NAMES = ("ndcg", "recall", "completeness", "mrr")


def _discount(rank: int) -> float:
    return 1.0 / math.log2(rank + 1)


def _check(gold: Collection[str], k: int) -> None:
    if not gold:
        raise ValueError("a query needs at least one gold tool id; got an empty label set")
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")


def hit_ranks(ranked: Sequence[str], gold: Collection[str], k: int) -> list[int]:
    """1-based ranks of the distinct gold ids found in the top k, in rank order."""
    _check(gold, k)
    gold = gold if isinstance(gold, (set, frozenset)) else set(gold)
    found: set[str] = set()
    ranks = []
    for rank, tool_id in enumerate(ranked[:k], 1):
        if tool_id in gold and tool_id not in found:
            found.add(tool_id)
            ranks.append(rank)
    return ranks


@lru_cache(maxsize=1024)  # a pure function of one small int, asked for on every query
def _ideal_dcg(n_ranks: int) -> float:
    return sum(_discount(r) for r in range(1, n_ranks + 1))


def _ndcg(ranks: list[int], n_gold: int, k: int) -> float:
    return sum(_discount(r) for r in ranks) / _ideal_dcg(min(n_gold, k))


def ndcg_at_k(ranked: Sequence[str], gold: Collection[str], k: int) -> float:
    """DCG of the top k with gain 1 per gold id and a log2(rank + 1) discount, over the DCG of
    min(|gold|, k) gold ids ranked first."""
    return _ndcg(hit_ranks(ranked, gold, k), len(set(gold)), k)


def recall_at_k(ranked: Sequence[str], gold: Collection[str], k: int) -> float:
    """Share of the gold ids found in the top k."""
    return len(hit_ranks(ranked, gold, k)) / len(set(gold))


def completeness_at_k(ranked: Sequence[str], gold: Collection[str], k: int) -> float:
    """1 if every gold id is in the top k, else 0: whether the agent got all the tools it needs.
    A query with more gold ids than k can never be complete."""
    return float(len(hit_ranks(ranked, gold, k)) == len(set(gold)))


def mrr_at_k(ranked: Sequence[str], gold: Collection[str], k: int) -> float:
    """1 / rank of the first gold id in the top k, 0 if none is there."""
    ranks = hit_ranks(ranked, gold, k)
    return 1.0 / ranks[0] if ranks else 0.0


def precision_at_k(ranked: Sequence[str], gold: Collection[str], k: int) -> float:
    """Gold ids in the top k over k (a short list is not padded out: the denominator stays k)."""
    return len(hit_ranks(ranked, gold, k)) / k


def metric_keys(k: int) -> tuple[str, ...]:
    """The keys `query_metrics` returns at cut-off k, in report order."""
    return tuple(f"{name}@{k}" for name in METRIC_NAMES)


def query_metrics(ranked: Sequence[str], gold: Collection[str], k: int) -> dict[str, float]:
    """nDCG, Recall, Completeness and MRR at k for one query, from a single pass over the top k."""
    gold = gold if isinstance(gold, (set, frozenset)) else set(gold)
    ranks = hit_ranks(ranked, gold, k)
    n_gold = len(gold)
    return {
        f"ndcg@{k}": _ndcg(ranks, n_gold, k),
        f"recall@{k}": len(ranks) / n_gold,
        f"completeness@{k}": float(len(ranks) == n_gold),
        f"mrr@{k}": 1.0 / ranks[0] if ranks else 0.0,
    }
