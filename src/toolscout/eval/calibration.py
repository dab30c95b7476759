"""Probabilities and thresholds: fitting them, and measuring how far they can be trusted.

- `LogisticModel`: P(relevant) from a few numeric features, fitted by Newton's method (iteratively
  reweighted least squares) with a small L2 penalty; plain JSON in and out, numpy only, so applying it at
  search time costs a dot product (`toolscout.relevance` applies the shipped one to every hit).
- `expected_calibration_error` and `reliability_table`: how far predicted probabilities are from the
  observed rates, in equal-width bins (the share of items in a bin times |mean predicted − observed|,
  summed over bins).
- `any_relevant`, `choose_threshold` / `abstention`: an abstention threshold on a query's best value (a
  score, or the chance that one of its best hits is relevant), chosen on train-split queries as the highest
  that keeps `keep` of the recall of queries the catalog can serve, and what it does to queries it cannot
  serve (`AbstentionCase`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

DEFAULT_BINS = 10


# -------------------------------------------------------------------------------- the model

@dataclass(frozen=True)
class LogisticModel:
    """p = sigmoid(bias + Σ weight_j · (x_j − mean_j) / scale_j) over the named `features`."""

    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    weights: tuple[float, ...]
    bias: float

    def __post_init__(self) -> None:
        n = len(self.features)
        if not (len(self.mean) == len(self.scale) == len(self.weights) == n):
            raise ValueError(f"a logistic model over {n} features needs {n} means, scales and weights")
        if any(not s > 0 for s in self.scale):
            raise ValueError("every feature scale must be positive")

    def logits(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != len(self.features):
            raise ValueError(f"expected rows of {len(self.features)} features ({', '.join(self.features)}), "
                             f"got shape {x.shape}")
        z = (x - np.asarray(self.mean)) / np.asarray(self.scale)
        return z @ np.asarray(self.weights) + self.bias

    def predict(self, x: np.ndarray) -> np.ndarray:
        """P(relevant) for each row of `x` (one column per feature, in `features` order)."""
        return 1.0 / (1.0 + np.exp(-np.clip(self.logits(x), -60.0, 60.0)))

    @classmethod
    def fit(cls, features: Sequence[str], x: np.ndarray, y: np.ndarray, sample_weight: np.ndarray | None = None,
            l2: float = 1e-3, iterations: int = 100) -> "LogisticModel":
        """Maximum-likelihood fit of labels `y` (0 or 1) from `x` (standardised first), weighted by
        `sample_weight`, with `l2` × |weights|² as penalty (the bias is not penalised)."""
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y, dtype=np.float64)
        if len(x) != len(y) or not len(y):
            raise ValueError(f"fit needs as many labels as rows, and some: {len(x)} rows, {len(y)} labels")
        if not (0 < y.mean() < 1):
            raise ValueError("fit needs both relevant and irrelevant examples")
        w = np.ones(len(y)) if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        mean = np.average(x, axis=0, weights=w)
        scale = np.sqrt(np.average((x - mean) ** 2, axis=0, weights=w)) + 1e-9
        z = np.hstack([(x - mean) / scale, np.ones((len(x), 1))])
        penalty = np.diag([l2 * w.sum()] * (z.shape[1] - 1) + [0.0])
        beta = np.zeros(z.shape[1])
        for _ in range(iterations):
            p = 1.0 / (1.0 + np.exp(-np.clip(z @ beta, -60.0, 60.0)))
            gradient = z.T @ (w * (p - y)) + penalty @ beta
            hessian = z.T @ (z * (w * p * (1 - p))[:, None]) + penalty
            step = np.linalg.solve(hessian + 1e-9 * np.eye(len(beta)), gradient)
            beta -= step
            if np.max(np.abs(step)) < 1e-10:
                break
        return cls(tuple(features), tuple(map(float, mean)), tuple(map(float, scale)), tuple(map(float, beta[:-1])),
                   float(beta[-1]))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "logistic", "features": list(self.features), "mean": list(self.mean),
                "scale": list(self.scale), "weights": list(self.weights), "bias": self.bias}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "LogisticModel":
        if data.get("kind") != "logistic":
            raise ValueError(f"not a logistic model: kind {data.get('kind')!r}")
        return cls(tuple(data["features"]), tuple(data["mean"]), tuple(data["scale"]), tuple(data["weights"]),
                   float(data["bias"]))


# -------------------------------------------------------------------------------- measuring it

def _bins(probabilities: np.ndarray, bins: int) -> np.ndarray:
    """The bin of each probability: [0, 1/bins), ..., [(bins-1)/bins, 1] (1.0 goes in the last)."""
    return np.minimum((np.asarray(probabilities, dtype=np.float64) * bins).astype(int), bins - 1)


def _checked(probabilities: Sequence[float], labels: Sequence[float]) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(probabilities, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if p.shape != y.shape or p.ndim != 1:
        raise ValueError(f"one label per probability: {p.shape} probabilities, {y.shape} labels")
    if len(p) and (p.min() < 0 or p.max() > 1):
        raise ValueError("probabilities must lie in [0, 1]")
    return p, y


def expected_calibration_error(probabilities: Sequence[float], labels: Sequence[float],
                               bins: int = DEFAULT_BINS) -> float:
    """Σ over equal-width bins of (share of items in the bin) × |mean probability − share relevant|, in
    [0, 1] (0 for no items)."""
    p, y = _checked(probabilities, labels)
    if not len(p):
        return 0.0
    which = _bins(p, bins)
    total = 0.0
    for b in np.unique(which):
        inside = which == b
        total += inside.mean() * abs(p[inside].mean() - y[inside].mean())
    return float(total)


def reliability_table(probabilities: Sequence[float], labels: Sequence[float],
                      bins: int = DEFAULT_BINS) -> list[dict[str, float]]:
    """One row per equal-width bin: its bounds, how many items, their mean probability and the share of
    them relevant (None for an empty bin)."""
    p, y = _checked(probabilities, labels)
    which = _bins(p, bins)
    rows = []
    for b in range(bins):
        inside = which == b
        n = int(inside.sum())
        rows.append({"low": b / bins, "high": (b + 1) / bins, "count": n,
                     "predicted": float(p[inside].mean()) if n else None,
                     "observed": float(y[inside].mean()) if n else None})
    return rows


# -------------------------------------------------------------------------------- abstention

def any_relevant(probabilities: Sequence[float]) -> float:
    """The chance that at least one of several items is relevant, each with its own probability, taken as
    independent: 1 − Π(1 − p). Three near-twin tools at 0.2 each make 0.49: one of them is likely right,
    though which one is not."""
    return float(1.0 - np.prod(1.0 - np.clip(np.asarray(probabilities, dtype=np.float64), 0.0, 1.0)))


@dataclass(frozen=True)
class AbstentionCase:
    """One query for choosing and measuring an abstention threshold. `set`: its benchmark set; `top`: its
    best value (score or probability) against its own catalog, and `recall` there; `elsewhere`: its best
    value where no tool fits it (its gold tools removed, or another set's catalog; None: not measured)."""

    set: str
    top: float
    recall: float
    elsewhere: float | None = None


def _macro(cases: Sequence[AbstentionCase], value) -> float:
    sets = sorted({c.set for c in cases})
    return float(np.mean([np.mean([value(c) for c in cases if c.set == s]) for s in sets])) if sets else 0.0


def choose_threshold(cases: Sequence[AbstentionCase], keep: float) -> float:
    """The highest threshold at which the queries still answered keep at least `keep` × the recall of all
    (recall averaged per set, then over sets, so no set weighs by its size). Candidates: the values seen."""
    if not cases:
        raise ValueError("choosing a threshold needs queries")
    base = _macro(cases, lambda c: c.recall)

    def kept(t: float) -> float:
        return _macro(cases, lambda c: c.recall * (c.top >= t))

    candidates = sorted({c.top for c in cases} | {c.elsewhere for c in cases if c.elsewhere is not None})
    best = candidates[0]
    lo, hi = 0, len(candidates) - 1  # recall falls as the threshold rises: binary search the last good one
    while lo <= hi:
        mid = (lo + hi) // 2
        if kept(candidates[mid]) >= keep * base - 1e-12:
            best, lo = candidates[mid], mid + 1
        else:
            hi = mid - 1
    return float(best)


def abstention(cases: Sequence[AbstentionCase], threshold: float | None) -> dict[str, float]:
    """At `threshold` (None: never abstain), in % of queries: those with no fitting tool answered with
    nothing (`nomatch_abstained`), those that have one still answered (`normal_answered`), and recall kept
    and without abstention; all pooled over the given queries."""
    if not cases:
        return {"queries": 0}
    t = float("-inf") if threshold is None else threshold
    elsewhere = [c.elsewhere < t for c in cases if c.elsewhere is not None]
    return {"queries": len(cases),
            "nomatch_abstained": 100.0 * float(np.mean(elsewhere)) if elsewhere else None,
            "normal_answered": 100.0 * float(np.mean([c.top >= t for c in cases])),
            "recall": 100.0 * float(np.mean([c.recall * (c.top >= t) for c in cases])),
            "recall_without_abstention": 100.0 * float(np.mean([c.recall for c in cases]))}
