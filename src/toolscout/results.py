"""Batched search results and search filters, shared by retrievers, stores, rerankers and servers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np

from .errors import InvalidRequest, listed


@dataclass(frozen=True)
class Filter:
    """Restricts a search. `namespaces`: only tools in these namespaces (None = any; a tool with no
    namespace matches only when `None`-namespace is listed as ""). `ids`: only these tool ids.
    `exclude_ids`: never these ids. All given conditions must hold. Each takes a list (or any collection) of
    strings; a lone string is refused, as `search(namespaces=)` refuses it, since Python would read it one
    character at a time."""

    namespaces: frozenset[str] | None = None
    ids: frozenset[str] | None = None
    exclude_ids: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        for field in ("namespaces", "ids", "exclude_ids"):
            value = getattr(self, field)
            if value is not None and not isinstance(value, frozenset):
                object.__setattr__(self, field, frozenset(listed(value, f"Filter {field}")))

    @classmethod
    def make(cls, namespaces: Iterable[str] | None = None, ids: Iterable[str] | None = None,
             exclude_ids: Iterable[str] = ()) -> "Filter | None":
        if namespaces is None and ids is None and not exclude_ids:
            return None
        return cls(
            namespaces=None if namespaces is None else frozenset(namespaces),
            ids=None if ids is None else frozenset(ids),
            exclude_ids=frozenset(exclude_ids),
        )

    @classmethod
    def restrict(cls, flt: "Filter | None", namespaces: Iterable[str] | None) -> "Filter | None":
        """`flt` further limited to `namespaces` (None: no further limit); namespaces intersect, so a caller
        restricted to some namespaces cannot widen its view by asking for others."""
        if flt is not None and not isinstance(flt, Filter):
            raise InvalidRequest(f"filter: give a toolscout.Filter (Filter(namespaces=[...], ids=[...], "
                                 f"exclude_ids=[...])), not {type(flt).__name__}")
        if namespaces is None:
            return flt
        allowed = frozenset(listed(namespaces, "namespaces"))
        if flt is None:
            return cls(allowed)
        return cls(allowed if flt.namespaces is None else allowed & flt.namespaces, flt.ids, flt.exclude_ids)

    def allows(self, tool_id: str, namespace: str | None) -> bool:
        if self.namespaces is not None and (namespace or "") not in self.namespaces:
            return False
        if self.ids is not None and tool_id not in self.ids:
            return False
        return tool_id not in self.exclude_ids


@dataclass(frozen=True)
class Degraded:
    """What a search could not do for one task: its `stage` (e.g. "LLM reranker") failed on it, so the task
    got the ranking of the stage before (a reranker's fallback keeps the first stage's list). `reason`: why,
    in words fit for any caller (no URL, server body or setting names: `llm.public_reason`); `detail`: the
    stage's first error in full, for the server's log and a local user (the CLI); "" when `reason` says all.
    Every remote interface shows it as `to_dict()`, `{"stage": ..., "reason": ...}`."""

    stage: str
    reason: str
    detail: str = ""

    @property
    def described(self) -> str:
        """The full account: the detail when there is one, else the reason."""
        return self.detail or self.reason

    def to_dict(self) -> dict[str, str]:
        """What a remote caller is told: the stage and the coarse reason, never the detail."""
        return {"stage": self.stage, "reason": self.reason}


@dataclass(frozen=True)
class Results:
    """Ranked hits for a batch of queries: `ids[q]` (str array) and `scores[q]` (float32 array),
    best first. Lists may be shorter than k (small catalogs, filters). `degraded`: per query, None or what a
    stage could not do for it (`Degraded`); None for the whole batch when its maker says nothing of it."""

    ids: tuple[np.ndarray, ...]
    scores: tuple[np.ndarray, ...]
    degraded: tuple[Degraded | None, ...] | None = None

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.scores):
            raise ValueError("Results: ids and scores must have one entry per query")
        if self.degraded is not None and len(self.degraded) != len(self.ids):
            raise ValueError("Results: degraded must have one entry per query")

    def degraded_at(self, q: int) -> Degraded | None:
        """What a stage could not do for query `q` (None: nothing said)."""
        return None if self.degraded is None else self.degraded[q]

    @classmethod
    def from_lists(cls, ids: Sequence[Sequence[str]], scores: Sequence[Sequence[float]]) -> "Results":
        return cls(
            tuple(np.asarray(list(i), dtype=object) for i in ids),
            tuple(np.asarray(list(s), dtype=np.float32) for s in scores),
        )

    @classmethod
    def empty(cls, n_queries: int) -> "Results":
        return cls.from_lists([[] for _ in range(n_queries)], [[] for _ in range(n_queries)])

    def __len__(self) -> int:
        return len(self.ids)

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        return iter(zip(self.ids, self.scores))

    def __getitem__(self, q: int) -> tuple[np.ndarray, np.ndarray]:
        return self.ids[q], self.scores[q]

    def top(self, k: int) -> "Results":
        return Results(tuple(i[:k] for i in self.ids), tuple(s[:k] for s in self.scores), self.degraded)

    def as_lists(self) -> list[list[str]]:
        return [list(i) for i in self.ids]


def top_k_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest entries of each row of `scores`, best first (ties: lower index first)."""
    n = scores.shape[1]
    k = min(k, n)
    if k <= 0:
        return np.zeros((scores.shape[0], 0), dtype=np.int64)
    if k < n:
        part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    else:
        part = np.tile(np.arange(n), (scores.shape[0], 1))
    part_scores = np.take_along_axis(scores, part, axis=1)
    if k < n:
        # argpartition keeps an arbitrary subset of the rows tied with the k-th score; where some were
        # left out, redo that query's selection so the lower indices win the tie
        kth = part_scores.min(axis=1, keepdims=True)
        split = np.flatnonzero((scores == kth).sum(axis=1) > (part_scores == kth).sum(axis=1))
        for q in split:  # no sort needed here: the lexsort below orders the chosen k
            better = np.flatnonzero(scores[q] > kth[q, 0])
            tied = np.flatnonzero(scores[q] == kth[q, 0])[: k - len(better)]
            part[q] = np.concatenate([better, tied])
            part_scores[q] = scores[q, part[q]]
    # stable sort on (-score, index) so equal scores keep catalog order: deterministic across runs
    order = np.lexsort((part, -part_scores), axis=1)
    return np.take_along_axis(part, order, axis=1)
