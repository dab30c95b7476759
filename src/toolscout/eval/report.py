"""Human-facing views of evaluation reports: a text table and a bar chart."""

from __future__ import annotations

import io
import math
import os
from pathlib import Path
from typing import Sequence

from ..errors import MissingDependency
from .summary import EvalReport

MISSING = "–"


def _set_names(reports: Sequence[EvalReport]) -> list[str]:
    """Every set any report covers, in first-seen order."""
    names: dict[str, None] = {}
    for report in reports:
        names.update(dict.fromkeys(report.sets))
    return list(names)


def counted(n: int, noun: str) -> str:
    """"1 set", "2 sets"."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _cell(values: dict, key: str) -> str:
    value = values.get(key)
    return MISSING if value is None else f"{value:.2f}"


def format_table(reports: Sequence[EvalReport], metrics: Sequence[str] | None = None,
                 per_category: bool = False) -> str:
    """A text table: one row per set, then the macro mean (each set weighs the same; its query cell is the
    total), then latency and build time; one column per system × metric (points). `per_category` adds a row
    per category under each set. Under the table, a line for each stage that failed on some queries
    (`EvalReport.failed_stages`)."""
    from rich.console import Console
    from rich.markup import escape  # names are text: "bm25[k1=1.2]" is not a style tag
    from rich.table import Table

    if not reports:
        raise ValueError("format_table needs at least one report")
    metrics = list(metrics or reports[0].metric_keys)
    table = Table(title=escape(f"toolscout eval ({', '.join(r.name for r in reports)})"), title_justify="left")
    table.add_column("set")
    table.add_column("queries", justify="right")
    for report in reports:
        for metric in metrics:
            table.add_column(escape(f"{report.name}\n{metric}" if len(reports) > 1 else metric), justify="right")

    names = _set_names(reports)
    for name in names:
        first = next(r.sets[name] for r in reports if name in r.sets)
        cells = [_cell(r.sets[name].metrics, m) if name in r.sets else MISSING for r in reports for m in metrics]
        table.add_row(escape(name), str(first.n_queries), *cells)
        if per_category:
            _add_category_rows(table, reports, name, metrics)
    table.add_section()
    # a macro mean: each set weighs the same, so its query cell is the total, said as one (not the mean's weight)
    table.add_row(f"macro mean ({counted(len(reports[0].sets), 'set')})", f"{reports[0].n_queries} in all",
                  *[_cell(r.mean, m) for r in reports for m in metrics])
    table.add_section()
    for label, value in (("latency p50 ms", lambda r: f"{r.p50_ms:.2f}"), ("latency p99 ms", lambda r: f"{r.p99_ms:.2f}"),
                         ("queries/s", lambda r: f"{r.throughput_qps:.1f}"), ("build s", lambda r: f"{r.build_s:.2f}")):
        # one value per system, under its first metric column
        table.add_row(label, "", *[value(r) if j == 0 else "" for r in reports for j in range(len(metrics))])

    console = Console(file=io.StringIO(), width=max(100, 24 + 14 * len(reports) * len(metrics)),
                      color_system=None, force_terminal=False, highlight=False)
    console.print(table)
    # a stage that failed is said under the table that shows its name
    failed = [f"warning: {line}" for r in reports for line in r.failed_stages()]
    return "\n".join([line.rstrip() for line in console.file.getvalue().splitlines()] + failed) + "\n"


def _add_category_rows(table, reports: Sequence[EvalReport], set_name: str, metrics: list[str]) -> None:
    from rich.markup import escape

    categories = sorted({c for r in reports if set_name in r.sets for c in r.sets[set_name].by_category})
    for category in categories:
        by_cat = [r.sets[set_name].by_category.get(category, {}) if set_name in r.sets else {} for r in reports]
        count = next((c["queries"] for c in by_cat if c), 0)
        table.add_row(escape(f"  {category}"), str(count), *[_cell(c, m) for c in by_cat for m in metrics])


def plot_reports(reports: Sequence[EvalReport], path: str | os.PathLike, metric: str = "ndcg@10") -> Path:
    """A grouped bar chart (PNG) of `metric` per set and for the mean, one bar per system."""
    try:
        from matplotlib.figure import Figure  # the object API needs no global backend choice
    except ImportError:
        raise MissingDependency("matplotlib", "plotting evaluation reports", extra="plot") from None
    import numpy as np

    if not reports:
        raise ValueError("plot_reports needs at least one report")
    if not any(metric in r.metric_keys for r in reports):
        raise ValueError(f"no report has metric {metric!r}; they have {sorted({m for r in reports for m in r.metric_keys})}")
    groups = _set_names(reports) + ["mean"]
    x = np.arange(len(groups))
    width = 0.8 / len(reports)
    fig = Figure(figsize=(max(6.0, 0.9 * len(groups) * max(1, len(reports)) ** 0.5 + 2), 4.5), layout="constrained")
    ax = fig.subplots()
    for i, report in enumerate(reports):
        values = [report.sets[g].metrics.get(metric, math.nan) if g in report.sets else math.nan for g in groups[:-1]]
        values.append(report.mean.get(metric, math.nan))
        bars = ax.bar(x + (i - (len(reports) - 1) / 2) * width, values, width, label=report.name)
        ax.bar_label(bars, fmt="%.1f", fontsize=7, padding=2)
    ax.set_xticks(x, groups, rotation=30, ha="right")
    ax.set_ylabel(f"{metric} (points)")
    ax.set_ylim(0, 100)
    ax.grid(axis="y", alpha=0.3)
    fig.legend(loc="outside upper center", ncols=min(len(reports), 4), fontsize="small", frameon=False)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
