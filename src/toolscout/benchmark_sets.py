"""Benchmark folders: `tools.jsonl` + `queries.jsonl` (the format of the dev sets)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from .errors import CatalogError
from .tool import Tool, json_type, parameters_problem


@dataclass(frozen=True)
class Query:
    id: str
    text: str
    labels: tuple[str, ...]
    split: str = "test"


@dataclass
class BenchmarkSet:
    name: str
    tools: list[Tool]
    queries: list[Query] = field(default_factory=list)
    path: Path | None = None

    def split(self, name: str) -> list[Query]:
        return [q for q in self.queries if q.split == name]

    @property
    def tool_ids(self) -> set[str]:
        return {t.id for t in self.tools}


def tool_from_row(row: Mapping[str, Any], where: str = "") -> Tool:
    """A benchmark `tools.jsonl` row → Tool. `where` prefixes error messages (file:line)."""
    for key in ("id", "name"):
        if not isinstance(row.get(key), str) or not row.get(key):
            raise CatalogError(f"{where}: field {key!r} must be a non-empty string")
    params = row.get("parameters")
    if params is not None and not isinstance(params, Mapping):
        raise CatalogError(f"{where}: field 'parameters' must be an object or null, got {json_type(params)}")
    problem = parameters_problem(params)
    if problem:
        raise CatalogError(f"{where}: field 'parameters{'.' if problem[0] else ''}{problem[0]}' {problem[1]}")
    description = row.get("description") or ""
    if not isinstance(description, str):
        raise CatalogError(f"{where}: field 'description' must be a string")
    for key in ("title", "method", "path"):  # what `toolscout expand` writes beside the benchmark fields
        if row.get(key) is not None and not isinstance(row[key], str):
            raise CatalogError(f"{where}: field {key!r} must be a string or null, got {json_type(row[key])}")
    return Tool(
        id=row["id"], name=row["name"], description=description, parameters=params, title=row.get("title") or None,
        method=row.get("method") or None, path=row.get("path") or None,
        category=row.get("category") or None, namespace=row.get("namespace") or None,
        tags=tuple(row.get("tags") or ()), profile=row.get("profile") or None,
        usage=tuple(u for u in row.get("usage") or () if isinstance(u, str)), raw=row.get("doc", row),
    )


def read_jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line; a bad line raises with file and line."""
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise CatalogError(f"{path}:{lineno}: invalid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(obj, dict):
                raise CatalogError(f"{path}:{lineno}: expected a JSON object, got {json_type(obj)}")
            yield lineno, obj


def load_queries(path: Path, known_ids: set[str] | None = None) -> list[Query]:
    queries = []
    line_of: dict[str, int] = {}  # query id -> its line: an id twice would merge two rows in every per-query report
    for lineno, row in read_jsonl(path):
        where = f"{path}:{lineno}"
        text, labels = row.get("query"), row.get("labels")
        if not isinstance(text, str) or not text.strip():
            raise CatalogError(f"{where}: field 'query' must be a non-empty string")
        if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
            raise CatalogError(f"{where}: field 'labels' must be a list of tool ids")
        if known_ids is not None:
            unknown = [x for x in labels if x not in known_ids]
            if unknown:
                raise CatalogError(f"{where}: labels {unknown[:3]} are not tool ids of this set")
        split = row.get("split", "test")
        if split not in ("train", "test", "validation"):
            raise CatalogError(f"{where}: field 'split' must be train, validation or test, got {split!r}")
        query_id = str(row.get("id", f"q{lineno}"))
        if line_of.setdefault(query_id, lineno) != lineno:
            raise CatalogError(f"{where}: duplicate query id {query_id!r}, already on line {line_of[query_id]}; "
                               "query ids are unique in a set (reports and comparisons pair queries by id)")
        queries.append(Query(query_id, text, tuple(labels), split))
    return queries


def load_benchmark(folder: str | Path) -> BenchmarkSet:
    folder = Path(folder)
    tools_file = folder / "tools.jsonl"
    if not tools_file.exists():
        raise CatalogError(f"{folder}: not a benchmark folder (no tools.jsonl)")
    tools = [tool_from_row(row, f"{tools_file}:{n}") for n, row in read_jsonl(tools_file)]
    seen: set[str] = set()
    for tool in tools:
        if tool.id in seen:
            raise CatalogError(f"{tools_file}: duplicate tool id {tool.id!r}")
        seen.add(tool.id)
    queries_file = folder / "queries.jsonl"
    queries = load_queries(queries_file, seen) if queries_file.exists() else []
    return BenchmarkSet(folder.name, tools, queries, folder)


def write_benchmark(folder: str | Path, tools: Sequence[Tool], queries: Sequence[Query]) -> None:
    """Write a benchmark folder (used by query generation and tests)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "tools.jsonl", "w", encoding="utf-8") as fh:
        for t in tools:
            row = {"id": t.id, "name": t.name, "description": t.description, "parameters": t.parameters,
                   "category": t.category}
            if t.namespace:
                row["namespace"] = t.namespace
            if t.profile:
                row["profile"] = dict(t.profile)
            if t.usage:
                row["usage"] = list(t.usage)
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    with open(folder / "queries.jsonl", "w", encoding="utf-8") as fh:
        for q in queries:
            fh.write(json.dumps({"id": q.id, "query": q.text, "labels": list(q.labels), "split": q.split},
                                ensure_ascii=False) + "\n")
