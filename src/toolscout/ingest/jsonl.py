"""Benchmark `tools.jsonl` rows `{id, name, description, parameters, category, doc}` (DESIGN §5).

Rows go through `toolscout.benchmark.tool_from_row`, so a catalog loads exactly as the benchmark
loader reads it, and row ids are kept as they are (queries refer to them). Aliases (`input_schema`,
`inputSchema`, ...) fill a missing `parameters`; `returns`, `examples`, `limitations`, `tags` are read
under their aliases too. A folder path means its `tools.jsonl`. Lines are read here rather than with
`benchmark.read_jsonl` because lenient mode must skip one bad line and go on, and a generator that
raised cannot be resumed; the messages are the same (`file:line: ...`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterator, Mapping

from ..benchmark import tool_from_row
from ..errors import CatalogError
from ..tool import Tool
from .common import PARAMETER_KEYS, Context, Entry, collect, read_extras, type_name


def tools_file(path: Path, source: str) -> Path:
    if not path.is_dir():
        return path
    if not (path / "tools.jsonl").is_file():
        raise CatalogError(f"{source}: a folder must hold a benchmark tools.jsonl; this one does not "
                           "(give the catalog file itself)")
    return path / "tools.jsonl"


def parse_file(path: Path, ctx: Context) -> list[Entry]:
    return collect(ctx, _lines(path, ctx), lambda pos, row: _tool(ctx, pos, row))


def parse(rows: Any, ctx: Context) -> list[Entry]:
    """Rows already in memory (a list of dicts); positions are list indexes."""
    if isinstance(rows, Mapping) and isinstance(rows.get("tools"), list):
        rows = rows["tools"]
    if not isinstance(rows, (list, tuple)):
        raise ctx.error("", f"expected a list of benchmark tool rows, got {type_name(rows)}")
    return collect(ctx, ((f"[{i}]", row) for i, row in enumerate(rows)), lambda pos, row: _tool(ctx, pos, row))


class _BadLine:
    """A line that is not a JSON object: raised inside `collect`, so lenient mode can skip it."""

    def __init__(self, message: str):
        self.message = message


def _lines(path: Path, ctx: Context) -> Iterator[tuple[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{ctx.source}:{lineno}"
            try:
                obj = json.loads(line.rstrip())  # a trailing newline would shift the error's column
            except json.JSONDecodeError as exc:
                yield f"line {lineno}", _BadLine(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})")
                continue
            if not isinstance(obj, dict):
                yield f"line {lineno}", _BadLine(f"{where}: expected a JSON object, got {type_name(obj)}")
                continue
            yield f"line {lineno}", obj


def _tool(ctx: Context, position: str, row: Any) -> Tool:
    if isinstance(row, _BadLine):
        raise CatalogError(row.message)
    where = f"{ctx.source}:{position[5:]}" if position.startswith("line ") else f"{ctx.source}: {position}"
    if not isinstance(row, Mapping):
        raise CatalogError(f"{where}: expected a tool row object, got {type_name(row)}")
    if row.get("parameters") is None:
        alias = next((k for k in PARAMETER_KEYS[1:] if row.get(k) is not None), None)
        if alias:
            row = {**row, "parameters": row[alias]}
    tool = tool_from_row(row, where)
    extras = read_extras(ctx, row, position)
    if ctx.namespace and not tool.namespace:
        extras["namespace"] = ctx.namespace
    return tool.with_changes(**extras) if extras else tool
