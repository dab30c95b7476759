"""What an evaluation produces: per-set and whole-run reports, and their JSON form (`toolscout eval --json`)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..benchmark_sets import Query
from .metrics import metric_keys


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0–100, linear interpolation); 0.0 for no values."""
    return float(np.percentile(values, q)) if len(values) else 0.0


@dataclass
class SetReport:
    """One benchmark set's results.

    `metrics`: mean of each metric in points (0–100). `per_query`: each metric's 0–1 value per query,
    in `query_ids` order (what the bootstrap resamples). `by_category`: the same means per category of
    each query's first gold tool, plus its "queries" count. `rankings`: the top-k ids per query, kept
    for error analysis. `build_s`: seconds to build this set's index (None when the index was shared,
    in pooled mode). `queries`, `query_categories`: the evaluated queries, in `query_ids` order, and the
    category each was counted under. `degraded`: per query, whether a stage of the system failed on it (an LLM
    reranker whose calls failed: it got the first stage's ranking); empty when nothing says.
    """

    name: str
    n_queries: int
    metrics: dict[str, float]
    per_query: dict[str, np.ndarray]
    query_ids: list[str]
    by_category: dict[str, dict[str, float]]
    latency_ms: list[float]
    rankings: list[list[str]] = field(default_factory=list, repr=False)
    build_s: float | None = None
    queries: list[Query] = field(default_factory=list, repr=False)
    query_categories: list[str] = field(default_factory=list, repr=False)
    degraded: list[bool] = field(default_factory=list, repr=False)

    def fell_back(self) -> np.ndarray:
        """Per query (in `query_ids` order), whether a stage failed on it (`degraded`; all False when unsaid)."""
        return np.array(self.degraded if self.degraded else [False] * self.n_queries, dtype=bool)

    def to_json(self) -> dict[str, Any]:
        return {**self.metrics, "queries": self.n_queries}

    def query_rows(self) -> list[dict[str, Any]]:
        """Each query as `eval --json` writes it under "per_query": id, text, gold labels, category, the ranked
        ids, its latency, whether a stage failed on it (`degraded`) and each metric in points, so that a user
        can pair systems query by query."""
        return [{"id": query.id, "query": query.text, "labels": list(query.labels), "category": category,
                 "ranked": list(ranked), "latency_ms": ms, "degraded": bool(fell),
                 **{key: 100.0 * float(values[i]) for key, values in self.per_query.items()}}
                for i, (query, category, ranked, ms, fell) in
                enumerate(zip(self.queries, self.query_categories, self.rankings, self.latency_ms, self.fell_back()))]


@dataclass
class EvalReport:
    """A whole evaluation run of one system: its sets, and the latency of every query in run order.

    `build_s` is the total index-build time (all per-set indexes, or the one pooled index). `config`
    records how the run was made; `warnings` lists what was skipped and why, and what the system warned
    while it ranked. `degraded`: per stage that failed on some timed queries (an LLM reranker whose calls
    failed), {"queries": how many, "of": all timed queries, "fallback": what they got, "first_error"}.
    """

    name: str
    k: int
    sets: dict[str, SetReport]
    latency_ms: list[float]
    build_s: float
    config: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    degraded: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def metric_keys(self) -> tuple[str, ...]:
        """The metrics at k, then those at any extra cut-off the run also computed (`also_at`)."""
        keys = metric_keys(self.k)
        extra = [key for s in list(self.sets.values())[:1] for key in s.metrics if key not in keys]
        return keys + tuple(extra)

    @property
    def mean(self) -> dict[str, float]:
        """Macro mean over sets of each metric (every set weighs the same, whatever its size)."""
        if not self.sets:
            return {}
        return {key: float(np.mean([s.metrics[key] for s in self.sets.values()])) for key in self.metric_keys}

    def failed_stages(self) -> list[str]:
        """One line per stage that failed on some queries, e.g. "bm25+llm@20: LLM reranker failed on 2 of 40
        queries (they kept the first stage's order)": the table's caption, and with the first error a warning."""
        return [f"{self.name}: {stage} failed on {d['queries']} of {d['of']} queries ({d['fallback']})"
                for stage, d in self.degraded.items()]

    @property
    def n_queries(self) -> int:
        return sum(s.n_queries for s in self.sets.values())

    @property
    def p50_ms(self) -> float:
        return percentile(self.latency_ms, 50)

    @property
    def p99_ms(self) -> float:
        return percentile(self.latency_ms, 99)

    @property
    def throughput_qps(self) -> float:
        """Queries per second answered one at a time (total queries over total query time)."""
        total_s = sum(self.latency_ms) / 1000.0
        return len(self.latency_ms) / total_s if total_s > 0 else 0.0

    def to_json(self, per_category: bool = False, per_query: bool = False) -> dict[str, Any]:
        """The `eval --json` document (README, "Evaluation"; metrics in points), plus system, k, throughput, build
        time, what the run skipped and why (`warnings`) and the stages that failed on some queries (`degraded`).
        `per_category` adds {"per_category": {SET: {CATEGORY: metrics and "queries"}}}, `per_query`
        {"per_query": {SET: [SetReport.query_rows()]}}."""
        data = {
            "sets": {name: s.to_json() for name, s in self.sets.items()},
            "mean": self.mean,
            "latency_ms": {"p50": self.p50_ms, "p99": self.p99_ms},
            "system": self.name,
            "k": self.k,
            "throughput_qps": self.throughput_qps,
            "build_s": self.build_s,
            "warnings": list(self.warnings),
            "degraded": self.degraded,
        }
        if per_category:
            data["per_category"] = {name: s.by_category for name, s in self.sets.items()}
        if per_query:
            data["per_query"] = {name: s.query_rows() for name, s in self.sets.items()}
        return data

    def save_json(self, path: str | os.PathLike) -> Path:
        """Write `to_json()` to `path` atomically (write beside, then rename)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        return path
