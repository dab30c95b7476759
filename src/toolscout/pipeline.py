"""`ToolScout`: the one public facade. A catalog, a first-stage retriever, saved as one directory.

The CLI, the evaluation harness and the servers are thin layers over this class.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from . import __version__
from .artifacts import read_config, write_artifact
from .benchmark import read_jsonl
from .errors import ToolScoutError
from .results import Filter, Results
from .retrievers.base import Retriever, load_retriever, make_retriever
from .tool import Tool

PIPELINE_KIND = "toolscout.pipeline"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class Hit:
    """One search result: the tool, its score (higher is better) and its 1-based rank."""

    tool: Tool
    score: float
    rank: int

    def to_dict(self) -> dict[str, Any]:
        out = {"rank": self.rank, "id": self.tool.id, "name": self.tool.name,
               "namespace": self.tool.namespace, "score": round(float(self.score), 6),
               "description": self.tool.description}
        if self.tool.method:
            out["method"], out["path"] = self.tool.method, self.tool.path
        return out


class ToolScout:
    """Search a tool catalog with a task in plain language.

        scout = ToolScout.from_tools(tools, retriever="dense")
        hits = scout.search("book a flight to Paris", k=5)

    Writes (`add`, `remove`) and reads may come from different threads: a lock serialises writes and
    each search sees the catalog either before or after a write, never half of one.
    """

    def __init__(self, retriever: Retriever, tools: Sequence[Tool] = (), *, indexed: bool = False):
        self.retriever = retriever
        self._tools: dict[str, Tool] = {}
        self._lock = threading.RLock()
        if tools:
            self._tools = _catalog(tools)
            if not indexed:
                self.retriever.index(list(self._tools.values()))

    # construction ------------------------------------------------------------------------
    @classmethod
    def from_tools(cls, tools: Iterable[Tool], retriever: str = "dense", **options: Any) -> "ToolScout":
        """Index `tools` with the retriever registered as `retriever` (options go to its constructor)."""
        return cls(make_retriever(retriever, **options), list(tools))

    @classmethod
    def load(cls, path: str | Path) -> "ToolScout":
        folder, _config = read_config(path, kind=PIPELINE_KIND, max_format=FORMAT_VERSION)
        tools = [Tool.from_dict(row) for _n, row in read_jsonl(folder / "tools.jsonl")]
        retriever = load_retriever(folder / "retriever")
        scout = cls(retriever, tools, indexed=True)
        if len(retriever) != len(tools):  # a hand-edited or mismatched directory
            raise ToolScoutError(f"{path}: retriever holds {len(retriever)} tools but tools.jsonl has {len(tools)}")
        return scout

    def save(self, path: str | Path) -> None:
        """Write the pipeline atomically: a crash mid-save leaves the previous save loadable."""
        with self._lock:
            config = {"kind": PIPELINE_KIND, "format_version": FORMAT_VERSION, "toolscout": __version__,
                      "retriever": self.retriever.name, "tools": len(self._tools),
                      "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            with write_artifact(path, config) as folder:
                with open(folder / "tools.jsonl", "w", encoding="utf-8") as fh:
                    for tool in self._tools.values():
                        fh.write(json.dumps(_tool_row(tool), ensure_ascii=False) + "\n")
                self.retriever.save(folder / "retriever")

    # catalog -----------------------------------------------------------------------------
    @property
    def tools(self) -> list[Tool]:
        return list(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def __contains__(self, tool_id: str) -> bool:
        return tool_id in self._tools

    def get(self, tool_id: str) -> Tool:
        try:
            return self._tools[tool_id]
        except KeyError:
            raise KeyError(f"no tool with id {tool_id!r} in this catalog") from None

    def add(self, tools: Iterable[Tool]) -> None:
        """Insert new tools or replace tools with the same id; only changed tools are re-encoded."""
        batch = _catalog(tools)
        with self._lock:
            self.retriever.add(list(batch.values()))
            self._tools.update(batch)

    def remove(self, ids: Iterable[str]) -> None:
        ids = list(ids)
        unknown = [i for i in ids if i not in self._tools]
        if unknown:
            raise KeyError(f"cannot remove unknown tool id(s) {unknown[:5]}")
        with self._lock:
            self.retriever.remove(ids)
            for tool_id in ids:
                del self._tools[tool_id]

    # search ------------------------------------------------------------------------------
    def retrieve(self, queries: Sequence[str], k: int = 10, filter: Filter | None = None) -> Results:
        """Raw batched results (ids and scores), as the evaluation harness wants them."""
        if isinstance(queries, str):
            raise TypeError("retrieve takes a list of queries")
        if k < 1:
            raise ValueError(f"k must be at least 1, got {k}")
        with self._lock:
            return self.retriever.search(list(queries), k, filter)

    def search(self, query: str | Sequence[str], k: int = 5, *, namespaces: Iterable[str] | None = None,
               filter: Filter | None = None) -> list[Hit] | list[list[Hit]]:
        """The k best tools for `query`, best first; a list of queries gives one list per query.

        `namespaces` restricts results to tools in those namespaces.
        """
        single = isinstance(query, str)
        queries = [query] if single else list(query)
        for q in queries:
            if not isinstance(q, str) or not q.strip():
                raise ValueError("each query must be a non-empty string")
        if namespaces is not None:
            extra = Filter.make(namespaces=namespaces)
            filter = extra if filter is None else Filter(extra.namespaces, filter.ids, filter.exclude_ids)
        results = self.retrieve(queries, k, filter)
        hits = [
            [Hit(self._tools[tid], float(score), rank) for rank, (tid, score) in enumerate(zip(ids, scores), 1)]
            for ids, scores in results
        ]
        return hits[0] if single else hits


def _catalog(tools: Iterable[Tool]) -> dict[str, Tool]:
    out: dict[str, Tool] = {}
    for tool in tools:
        if not isinstance(tool, Tool):
            raise TypeError(f"expected Tool objects, got {type(tool).__name__}; use toolscout.load_tools to parse catalogs")
        if tool.id in out:
            raise ValueError(f"duplicate tool id {tool.id!r} in one batch")
        out[tool.id] = tool
    return out


def _tool_row(tool: Tool) -> dict[str, Any]:
    row = tool.to_dict()
    if "raw" in row:  # keep the original object when it is plain JSON (a Python callable is not)
        try:
            json.dumps(row["raw"])
        except (TypeError, ValueError):
            row["raw"] = repr(row["raw"])
    return row
