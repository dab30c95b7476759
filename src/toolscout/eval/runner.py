"""Run a search system over benchmark sets and measure quality and latency in the same run.

Two corpora: by default each set is searched over its own tools (one index per set);
`pooled=True` builds one index over the union of all sets' tools, which is harder and closer to a real
catalog. Queries run one at a time, each timed, so the latency is what one agent request would see.
"""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence
from warnings import WarningMessage, catch_warnings, simplefilter

import numpy as np

from ..benchmark_sets import BenchmarkSet, Query, load_benchmark
from ..errors import DegradedResults
from ..results import Results
from ..tool import Tool
from .metrics import query_metrics
from .summary import EvalReport, SetReport

SPLITS = ("train", "validation", "test")


class SearchSystem(Protocol):
    """Anything that ranks tools for queries: a retriever with a reranker, a pipeline, a baseline."""

    def retrieve(self, queries: list[str], k: int) -> Results: ...


SystemFactory = Callable[[list[Tool]], SearchSystem]


def evaluate(
    sets: Sequence[BenchmarkSet | str | os.PathLike],
    system_factory: SystemFactory,
    *,
    k: int = 10,
    split: str = "test",
    pooled: bool = False,
    name: str = "system",
    progress: bool = True,
    max_queries: int | None = None,
    warmup: int = 1,
    also_at: Sequence[int] = (),
) -> EvalReport:
    """Evaluate the systems `system_factory(tools)` builds on the `split` queries of each set.

    `sets`: BenchmarkSet objects or benchmark folders. `max_queries`: at most this many queries per
    set (the first ones of the split, so runs are comparable). `warmup`: untimed queries run on each
    new index first, so lazy loading does not land in the latency of the first timed query.
    What the system warns while it ranks goes to `report.warnings` (once each), not to the console; a stage
    that failed (`DegradedResults`) is counted over the timed queries into `report.degraded` and said in
    `report.warnings` as "failed on N of M queries".
    A set without queries in the split is skipped (noted in `report.warnings`); in pooled mode its
    tools still join the corpus, so corpus-only folders act as distractors. `also_at`: smaller cut-offs
    whose metrics are added too (e.g. (5,) adds recall@5 …), computed from the same top-k rankings.
    Latency is what each built system takes: a factory whose systems share an encoder should hand each one a
    cold query cache (`retrievers.base.forget_task_vectors`, as `toolscout eval` does), or a later system
    is timed on vectors an earlier one computed.
    """
    if k < 1:
        raise ValueError(f"k must be at least 1, got {k}")
    also_at = sorted({int(c) for c in also_at} - {k})
    if any(c < 1 or c > k for c in also_at):
        raise ValueError(f"extra cut-offs must be between 1 and k={k}, got {also_at}")
    if max_queries is not None and max_queries < 1:
        raise ValueError(f"max_queries must be at least 1 (or None for all), got {max_queries}")
    bench = [s if isinstance(s, BenchmarkSet) else load_benchmark(s) for s in sets]
    if not bench:
        raise ValueError("evaluate needs at least one benchmark set")
    _check_unique_names(bench)
    warnings: list[str] = []
    work = [(b, _queries_of(b, split, max_queries, warnings)) for b in bench]
    work = [(b, qs) for b, qs in work if qs]
    if not work:
        raise ValueError(f"no set has labelled queries in split {split!r} (splits: {', '.join(SPLITS)}): "
                         f"{'; '.join(warnings)}; nothing to evaluate")

    set_reports: dict[str, SetReport] = {}
    total_build_s = 0.0
    notes = _Notes()
    with _progress_bar(progress) as bar:
        if pooled:
            corpus = _pooled_tools(bench)
            system, total_build_s = _build(system_factory, corpus, bar, "pooled corpus", notes)
            categories = _categories(corpus)
            _warm_up(system, k, warmup, notes)
        for bset, queries in work:
            set_build_s = None  # pooled: the one shared index's time is the report's build_s
            if not pooled:
                system, set_build_s = _build(system_factory, bset.tools, bar, bset.name, notes)
                total_build_s += set_build_s
                categories = _categories(bset.tools)
                _warm_up(system, k, warmup, notes)
            report = _run_set(system, bset.name, queries, k, categories, bar, also_at, notes)
            report.build_s = set_build_s
            set_reports[bset.name] = report

    latency = [ms for r in set_reports.values() for ms in r.latency_ms]
    config = {
        "k": k, "split": split, "pooled": pooled, "max_queries": max_queries, "warmup": warmup,
        "sets": {b.name: {"path": str(b.path) if b.path else None, "tools": len(b.tools)} for b in bench},
    }
    return notes.said_in(EvalReport(name, k, set_reports, latency, total_build_s, config, warnings))


# ------------------------------------------------------------------------------------------ inputs

def _check_unique_names(bench: list[BenchmarkSet]) -> None:
    seen: dict[str, BenchmarkSet] = {}
    for b in bench:
        if b.name in seen:
            raise ValueError(f"two benchmark sets are named {b.name!r} ({seen[b.name].path} and {b.path}); "
                             "set names key the report, rename one folder")
        seen[b.name] = b


def _queries_of(bset: BenchmarkSet, split: str, max_queries: int | None, warnings: list[str]) -> list[Query]:
    queries = bset.split(split)
    unlabelled = [q for q in queries if not q.labels]
    if unlabelled:
        warnings.append(f"{bset.name}: skipped {len(unlabelled)} {split} queries with no labels "
                        f"(first: {unlabelled[0].id!r})")
        queries = [q for q in queries if q.labels]
    if not queries:
        why = "no queries.jsonl" if not bset.queries and bset.path is not None and \
            not (bset.path / "queries.jsonl").exists() else f"no labelled {split} queries"
        warnings.append(f"{bset.name}: {why}; set skipped")
    return queries[:max_queries] if max_queries is not None else queries


def _pooled_tools(bench: list[BenchmarkSet]) -> list[Tool]:
    owner: dict[str, str] = {}
    tools: list[Tool] = []
    for b in bench:
        for tool in b.tools:
            if tool.id in owner:
                raise ValueError(f"pooled corpus: tool id {tool.id!r} is in both {owner[tool.id]!r} and {b.name!r}; "
                                 "pooled evaluation needs ids unique across sets (prefix them with the set name)")
            owner[tool.id] = b.name
            tools.append(tool)
    return tools


def _categories(corpus: list[Tool]) -> dict[str, str]:
    return {t.id: t.category for t in corpus if t.category}


# ------------------------------------------------------------------------------------------ running

def _build(factory: SystemFactory, tools: list[Tool], bar, label: str, notes: _Notes) -> tuple[SearchSystem, float]:
    task = bar.add_task(f"indexing {label} ({len(tools)} tools)", total=None)
    start = time.perf_counter()
    # what indexing warns of (tools a model cannot score) is this set's; the filters as they are, so that a
    # library's DeprecationWarning, which Python would not show, stays out of the report
    with notes.kept(timed=False, where=label, every=False):
        system = factory(list(tools))
    elapsed = time.perf_counter() - start
    bar.remove_task(task)
    if not callable(getattr(system, "retrieve", None)):
        raise TypeError(f"system_factory returned {type(system).__name__}, which has no retrieve(queries, k) method; "
                        "wrap a retriever so that retrieve() calls its search()")
    return system, elapsed


def _warm_up(system: SearchSystem, k: int, n: int, notes: _Notes) -> None:
    # a neutral text, not a benchmark query: a system that caches answers must not see one early
    for _ in range(n):
        with notes.kept(timed=False):
            system.retrieve(["find a tool that can help with this task"], k)


def _top_ids(results: Results, k: int, query: Query) -> list[str]:
    if len(results) != 1:
        raise ValueError(f"retrieve([query], k) returned {len(results)} result lists, expected 1 (query {query.id!r})")
    return [str(i) for i in results.ids[0][:k]]


def _run_set(system: SearchSystem, name: str, queries: list[Query], k: int, categories: dict[str, str], bar,
             also_at: Sequence[int], notes: _Notes) -> SetReport:
    task = bar.add_task(name, total=len(queries))
    rankings, latency, degraded = [], [], []
    for query in queries:
        failed_before = notes.failed_queries
        with notes.kept(timed=True):
            start = time.perf_counter()
            results = system.retrieve([query.text], k)
            latency.append((time.perf_counter() - start) * 1000.0)
        rankings.append(_top_ids(results, k, query))
        degraded.append(notes.failed_queries > failed_before)  # a stage failed on this query
        bar.advance(task)
    bar.remove_task(task)
    report = _score_set(name, queries, rankings, latency, k, categories, also_at)
    report.degraded = degraded
    return report


@dataclass
class _Notes:
    """What a system warned while it ranked: per failed stage, the timed queries it failed on and its first
    error (`DegradedResults`); any other warning once, in the order first seen."""

    failed: dict[str, list] = field(default_factory=dict)  # stage -> [queries, fallback, first reason]
    other: dict[str, None] = field(default_factory=dict)

    @contextmanager
    def kept(self, timed: bool, where: str | None = None, every: bool = True) -> Iterator[None]:
        """Keep what the system warns within the block (`timed`: the block ranked one benchmark query; `where`:
        the set or corpus its other warnings are about, said before them; `every`: each warning, whatever the
        filters say, as counting failed queries needs)."""
        with catch_warnings(record=True) as caught:
            if every:
                simplefilter("always")
            yield
        self.add(caught, timed, where)

    @property
    def failed_queries(self) -> int:
        """The timed queries some stage failed on so far, counted once per failed stage."""
        return sum(count for count, _fallback, _reason in self.failed.values())

    def add(self, caught: list[WarningMessage], timed: bool, where: str | None = None) -> None:
        for record in caught:
            warning = record.message
            if not isinstance(warning, DegradedResults):
                self.other.setdefault(f"{where}: {warning}" if where else str(warning))
            elif timed and warning.queries:  # one query per timed call: it was this one
                self.failed.setdefault(warning.stage, [0, warning.fallback, warning.reason])[0] += 1

    def said_in(self, report: EvalReport) -> EvalReport:
        """`report` with its `degraded` stages, and these notes among its warnings, each line naming the system."""
        report.degraded = {stage: {"queries": count, "of": len(report.latency_ms), "fallback": fallback,
                                   "first_error": reason} for stage, (count, fallback, reason) in self.failed.items()}
        report.warnings += [f"{line}; first error: {d['first_error']}"
                            for line, d in zip(report.failed_stages(), report.degraded.values())]
        report.warnings += [f"{report.name}: {text}" for text in self.other]
        return report


def _score_set(name: str, queries: list[Query], rankings: list[list[str]], latency: list[float], k: int,
               categories: dict[str, str], also_at: Sequence[int] = ()) -> SetReport:
    rows = []
    for ranked, q in zip(rankings, queries):
        row = query_metrics(ranked, set(q.labels), k)
        for cut in also_at:
            row.update(query_metrics(ranked, set(q.labels), cut))
        rows.append(row)
    per_query = {key: np.array([r[key] for r in rows], dtype=np.float64) for key in rows[0]}
    query_categories = np.array([categories.get(q.labels[0], "unknown") for q in queries], dtype=object)
    by_category = {}
    for category in sorted(set(query_categories)):
        mask = query_categories == category
        by_category[category] = {**_points(per_query, mask), "queries": int(mask.sum())}
    return SetReport(name, len(queries), _points(per_query), per_query, [q.id for q in queries],
                     by_category, latency, rankings, queries=list(queries), query_categories=list(query_categories))


def _points(per_query: dict[str, np.ndarray], mask: np.ndarray | None = None) -> dict[str, float]:
    """Mean of each metric in points (0–100), over the queries `mask` selects (all by default)."""
    return {key: float(100.0 * (v if mask is None else v[mask]).mean()) for key, v in per_query.items()}


@contextmanager
def _progress_bar(enabled: bool) -> Iterator:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=not enabled, transient=True) as bar:
        yield bar
