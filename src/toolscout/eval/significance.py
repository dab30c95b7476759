"""Paired bootstrap: does system B score differently from system A on the same queries, or is it noise?

Each resample draws queries with replacement and takes the mean of B − A over them. The confidence
interval is the 2.5–97.5 percentile range of those means: two-sided, like the p-value printed beside it.
Both p-values carry the usual +1 correction, so neither is ever exactly 0:

- `p_two_sided`, "B differs from A": twice the smaller tail,
  p = min(1, 2 · (1 + min(#{mean* ≤ 0}, #{mean* ≥ 0})) / (1 + resamples)). It is below 0.05 about exactly
  when the 95% interval leaves out 0, whichever way B differs; identical systems give 1.
- `p_one_sided`, "B is better than A": the share of resampled means ≤ 0, (1 + #{mean* ≤ 0}) / (1 + resamples);
  a system worse on every query gets 1, one better on every query 1 / (1 + resamples).

Fewer than `MIN_RESAMPLES` (40) resamples are refused: each 2.5% tail of the interval would then hold less
than one resample (its ends are the most extreme resamples, whatever the spread), and no two-sided p could
fall below 0.05 (its least is 2 / (1 + resamples)).

`paired_bootstrap` pools the queries of all sets (each query weighs the same, so a large set weighs
more than in the macro mean of the report); `paired_bootstrap_per_set` tests each set on its own.

A query on which a stage of either system failed (an LLM reranker whose calls failed, `SetReport.degraded`)
got that system's first-stage ranking: B is then partly A, and the difference understates (or hides) what the
stage does. `fell_back` counts such queries; `fully_ranked=True` compares the other queries only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .summary import EvalReport

# 2.5% of 40 is one resample, and 2 / (1 + 40) < 0.05: the least a two-sided p can be (module doc)
MIN_RESAMPLES = 40
# indices drawn per chunk: bounds memory (two float64/int64 arrays of this many cells) on large runs
_CELLS_PER_CHUNK = 4_000_000


@dataclass(frozen=True)
class BootstrapResult:
    """B against A on one metric, in points (0–100): `diff` = mean(B) − mean(A), its two-sided 95% CI,
    the two-sided p-value of "B differs from A" and the one-sided one of "B is better than A"."""

    metric: str
    n_queries: int
    mean_a: float
    mean_b: float
    diff: float
    ci_low: float
    ci_high: float
    p_two_sided: float
    p_one_sided: float
    n_resamples: int
    seed: int

    def to_dict(self) -> dict:
        return asdict(self)

    def significant(self, alpha: float = 0.05) -> bool:
        """B differs from A at level `alpha` (two-sided, as the interval; `diff` says which way)."""
        return self.p_two_sided < alpha

    def __str__(self) -> str:
        return self.line(f"{self.n_queries} queries")

    def line(self, over: str) -> str:
        """The result in one line, ending with what it was computed `over` (e.g. "pooled over 40 queries of 2 sets")."""
        return (f"{self.metric}: B − A = {self.diff:+.2f} points (95% CI {self.ci_low:+.2f} to {self.ci_high:+.2f}), "
                f"p = {self.p_two_sided:.4f} (two-sided: B ≠ A), {over}")


def paired_bootstrap(a: EvalReport, b: EvalReport, metric: str = "ndcg@10", n_resamples: int = 10000,
                     seed: int = 0, fully_ranked: bool = False) -> BootstrapResult:
    """Paired bootstrap over the queries of all sets together (matched by set and query id). `fully_ranked`:
    only the queries no stage of either system failed on (the module doc); ValueError when there are none."""
    pairs = _paired_scores(a, b, metric)
    keep = np.concatenate([~fell for fell in _fallbacks(a, b).values()]) if fully_ranked else None
    scores_a = np.concatenate([pa for pa, _ in pairs.values()])
    scores_b = np.concatenate([pb for _, pb in pairs.values()])
    if keep is not None:
        if not keep.any():
            raise ValueError(f"no query was fully ranked by both {a.name!r} and {b.name!r}: a stage failed on each")
        scores_a, scores_b = scores_a[keep], scores_b[keep]
    return _bootstrap(scores_a, scores_b, metric, n_resamples, seed)


def fell_back(a: EvalReport, b: EvalReport) -> int:
    """How many of the queries A and B are paired on got a first-stage ranking in either: a stage failed on them."""
    return int(sum(fell.sum() for fell in _fallbacks(a, b).values()))


def _fallbacks(a: EvalReport, b: EvalReport) -> dict[str, np.ndarray]:
    """Per set, in A's query order, whether a stage of A or of B failed on each query."""
    return {name: set_a.fell_back() | b.sets[name].fell_back()[_b_order(set_a.query_ids, b.sets[name].query_ids, name)]
            for name, set_a in a.sets.items()}


def paired_bootstrap_per_set(a: EvalReport, b: EvalReport, metric: str = "ndcg@10", n_resamples: int = 10000,
                             seed: int = 0) -> dict[str, BootstrapResult]:
    """The same test on each set separately, keyed by set name."""
    return {name: _bootstrap(pa, pb, metric, n_resamples, seed)
            for name, (pa, pb) in _paired_scores(a, b, metric).items()}


def _bootstrap(scores_a: np.ndarray, scores_b: np.ndarray, metric: str, n_resamples: int,
               seed: int) -> BootstrapResult:
    if n_resamples < MIN_RESAMPLES:
        raise ValueError(f"n_resamples must be at least {MIN_RESAMPLES} for a 95% interval, got {n_resamples}")
    diff = 100.0 * (scores_b - scores_a)
    n = len(diff)
    rng = np.random.default_rng(seed)
    means = np.empty(n_resamples)
    chunk = max(1, _CELLS_PER_CHUNK // n)
    for start in range(0, n_resamples, chunk):
        stop = min(start + chunk, n_resamples)
        means[start:stop] = diff[rng.integers(0, n, size=(stop - start, n))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    return BootstrapResult(metric, n, float(100.0 * scores_a.mean()), float(100.0 * scores_b.mean()),
                           float(diff.mean()), float(low), float(high), *_p_values(means), n_resamples, seed)


def _p_values(means: np.ndarray) -> tuple[float, float]:
    """(two-sided, one-sided "B > A") p-values of the resampled mean differences, each with the +1 correction."""
    at_most_0 = (1 + int(np.count_nonzero(means <= 0))) / (1 + len(means))
    at_least_0 = (1 + int(np.count_nonzero(means >= 0))) / (1 + len(means))
    return min(1.0, 2 * min(at_most_0, at_least_0)), at_most_0


def _paired_scores(a: EvalReport, b: EvalReport, metric: str) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per set, A's and B's per-query scores on `metric`, aligned on A's query order."""
    if set(a.sets) != set(b.sets):
        raise ValueError(f"reports {a.name!r} and {b.name!r} cover different sets: "
                         f"only in A {sorted(set(a.sets) - set(b.sets))}, only in B {sorted(set(b.sets) - set(a.sets))}")
    pairs = {}
    for name, set_a in a.sets.items():
        set_b = b.sets[name]
        for report, s in ((a, set_a), (b, set_b)):
            if metric not in s.per_query:
                raise ValueError(f"report {report.name!r} has no {metric!r} for set {name!r}; "
                                 f"it has {sorted(s.per_query)}")
        pairs[name] = (set_a.per_query[metric], set_b.per_query[metric][_b_order(set_a.query_ids, set_b.query_ids, name)])
    if not any(len(pa) for pa, _ in pairs.values()):
        raise ValueError("the reports hold no queries to compare")
    return pairs


def _b_order(ids_a: list[str], ids_b: list[str], set_name: str) -> np.ndarray:
    """Positions in B of A's queries; errors unless both evaluated exactly the same queries."""
    if ids_a == ids_b:
        return np.arange(len(ids_a))
    if set(ids_a) != set(ids_b) or len(ids_a) != len(ids_b):
        only_a, only_b = sorted(set(ids_a) - set(ids_b)), sorted(set(ids_b) - set(ids_a))
        raise ValueError(f"set {set_name!r}: the reports evaluated different queries "
                         f"({len(ids_a)} vs {len(ids_b)}; only in A {only_a[:3]}, only in B {only_b[:3]}); "
                         "run both on the same split and max_queries")
    position = {qid: i for i, qid in enumerate(ids_b)}
    if len(position) != len(ids_b):
        raise ValueError(f"set {set_name!r}: query ids repeat and the two reports list them in different orders; "
                         "cannot pair queries")
    return np.array([position[qid] for qid in ids_a])
