"""Usage expansion, no LLM: known requests for a tool are appended to its document.

A tool's training queries (or logged requests) say in users' own words what the tool is for: the
document-side twin of Tool2Vec. `expand_usage` stores up to N of them in `Tool.usage`; a text view with
`TextView(usage=N)` appends them, so BM25 and dense retrieval both see them.

Only train-split queries are used. Test (and validation) queries are never copied into a document, so an
evaluation on the test split stays honest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..benchmark_sets import Query
from ..tool import Tool

USAGE_SPLIT = "train"


@dataclass
class UsageReport:
    tools_with_usage: int = 0
    queries_used: int = 0        # distinct (tool, query) pairs written
    train_queries: int = 0       # train queries seen
    ignored_queries: int = 0     # queries of other splits, ignored
    unknown_labels: int = 0      # labels naming no tool of the catalog

    def to_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


def _normalise(text: str) -> str:
    return re.sub(r"\W+", " ", text.lower()).strip()


def expand_usage(tools: Sequence[Tool], queries: Iterable[Query], max_per_tool: int,
                 report: UsageReport | None = None) -> list[Tool]:
    """`tools` with up to `max_per_tool` train-split requests each in `Tool.usage`.

    Requests a tool already has come first. Then its train queries, the most specific first (fewest
    labels: a query needing only this tool says most about it), in file order among equals; duplicates
    (same words, ignoring case and punctuation) are kept once. Tools without train queries are unchanged.
    """
    if max_per_tool < 0:
        raise ValueError(f"max_per_tool must be 0 or more, got {max_per_tool}")
    report = report if report is not None else UsageReport()
    known = {t.id for t in tools}
    candidates: dict[str, list[tuple[int, int, str]]] = {}
    for order, query in enumerate(queries):
        if query.split != USAGE_SPLIT:
            report.ignored_queries += 1
            continue
        report.train_queries += 1
        for label in query.labels:
            if label not in known:
                report.unknown_labels += 1
                continue
            candidates.setdefault(label, []).append((len(query.labels), order, query.text))
    out = []
    for tool in tools:
        found = sorted(candidates.get(tool.id, ()))
        if not found or max_per_tool == 0:
            out.append(tool)
            continue
        texts: dict[str, str] = {}
        for text in [*tool.usage, *(t for _n, _o, t in found)]:
            texts.setdefault(_normalise(text), text)
            if len(texts) >= max_per_tool:
                break
        usage = tuple(texts.values())
        report.tools_with_usage += 1
        report.queries_used += sum(1 for text in usage if text not in tool.usage)
        out.append(tool.with_changes(usage=usage))
    return out
