"""Benchmark `tools.jsonl` rows `{id, name, description, parameters, category, doc}` (README, "Evaluation"),
and JSONL files of tool definitions, one OpenAI, Anthropic or MCP tool per line (`parse_definitions_file`).

Rows go through `toolscout.benchmark_sets.tool_from_row`, so a catalog loads exactly as the benchmark
loader reads it, and row ids are kept as they are (queries refer to them). Aliases (`input_schema`,
`inputSchema`, ...) fill a missing `parameters`; `returns`, `examples`, `limitations`, `tags` are read
under their aliases too. A folder path means its `tools.jsonl`. Lines are read here rather than with
`benchmark.read_jsonl` because lenient mode must skip one bad line and go on, and a generator that
raised cannot be resumed; the messages are the same (`file:line: ...`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from ..benchmark_sets import tool_from_row
from ..errors import CatalogError
from ..tool import Tool, json_type
from .common import PARAMETER_KEYS, Context, Entry, collect, read_extras
from .detect import detect_format
from .guard import check_tree
from .text import decode, parse_json_line


def tools_file(path: Path, source: str) -> Path:
    if not path.is_dir():
        return path
    if not (path / "tools.jsonl").is_file():
        raise CatalogError(f"{source}: a folder must hold a benchmark tools.jsonl; this one does not "
                           "(give the catalog file itself)")
    return path / "tools.jsonl"


def parse_file(path: Path, ctx: Context) -> list[Entry]:
    return collect(ctx, _lines(path, ctx), lambda pos, row: _tool(ctx, pos, row))


def first_row(path: Path, ctx: Context) -> tuple[str | None, Any]:
    """The first non-blank line of a JSONL file: its line number, and it as an object (None when it is not
    JSON); (None, None) when there is none."""
    for position, row in _lines(path, ctx):
        return position[5:], None if isinstance(row, _BadLine) else row
    return None, None


def parse_definitions_file(path: Path, ctx: Context, parse_object: Callable[[Any, Context], list[Entry]],
                           detected: tuple[str, str] | None = None) -> list[Entry]:
    """A JSONL file of tool definitions in one format, read by that format's parser (`parse_object`) one
    line at a time: each line's tools are positioned at its line, and a problem names the file and line
    (`tools.jsonl:3: tool.function: field 'name' is missing`). `detected`: (the format, the line that told
    it) when the first line chose the format: a line that reads as another format is refused (lenient:
    skipped), naming both lines, as a JSON list of mixed formats is; read as the first line's format, an
    OpenAI line after an Anthropic one was skipped as an "Anthropic server tool"."""
    entries: list[Entry] = []
    for position, row in _lines(path, ctx):
        where = f"{ctx.source}:{position[5:]}"
        if detected and not isinstance(row, _BadLine):
            row = _held_to(row, where, *detected)
        if isinstance(row, _BadLine):
            if not ctx.lenient:
                raise CatalogError(row.message)
            ctx.skip(position, row.message)
            continue
        line = replace(ctx, source=where, skips=0)  # the same report
        entries.extend((position, tool) for _, tool in parse_object(row, line))
        ctx.skips += line.skips
    return entries


_A_TOOL_OF = {"openai": "an OpenAI tool", "anthropic": "an Anthropic tool", "mcp": "an MCP tool",
              "jsonl": "a benchmark tool row", "openapi": "an OpenAPI spec", "python": "a Python callable"}


_BARE = {"name", "description", "strict"}  # all an OpenAI, Anthropic or MCP tool with no parameters needs


def _held_to(row: Any, where: str, fmt: str, decided_by: str) -> Any:
    """`row`, or a `_BadLine` saying why it is not in the file's format `fmt` (which the line `decided_by` set)."""
    if isinstance(row, Mapping) and set(row) <= _BARE:  # a tool without a schema reads as any format's
        return row
    try:
        shape = detect_format(row, where)
    except CatalogError:  # no sign of any format: the parser says what is wrong with it
        return row
    if shape == fmt:
        return row
    return _BadLine(f"{where}: this line is {_A_TOOL_OF[shape]}, but the file reads as {fmt} from its first line "
                    f"({decided_by}); a JSONL file holds one format: put each format's tools in a file of their "
                    "own (or pass format=..., CLI: --format NAME, to read every line as one format)")


def parse(rows: Any, ctx: Context) -> list[Entry]:
    """Rows already in memory (a list of dicts); positions are list indexes."""
    if isinstance(rows, Mapping) and isinstance(rows.get("tools"), list):
        rows = rows["tools"]
    if not isinstance(rows, (list, tuple)):
        raise ctx.error("", f"expected a list of benchmark tool rows, got {json_type(rows)}")
    return collect(ctx, ((f"[{i}]", row) for i, row in enumerate(rows)), lambda pos, row: _tool(ctx, pos, row))


class _BadLine:
    """A line that is not a JSON object: raised inside `collect`, so lenient mode can skip it."""

    def __init__(self, message: str):
        self.message = message


def _lines(path: Path, ctx: Context) -> Iterator[tuple[str, Any]]:
    """(position, row) per non-blank line; a line that cannot be a row comes as a `_BadLine`.

    Lines are split on b"\n" and decoded one at a time, so invalid UTF-8 spoils only its own line (and
    its message names the line and the byte offset in the file); a BOM before the first line is skipped.
    """
    offset = 0
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            start, offset = offset, offset + len(raw)
            where = f"{ctx.source}:{lineno}"
            try:
                row = _row(raw, where, start)
            except CatalogError as exc:
                yield f"line {lineno}", _BadLine(str(exc))
                continue
            if row is not None:
                yield f"line {lineno}", row


def _row(raw: bytes, where: str, start: int) -> dict | None:
    """One line as a checked JSON object (None when blank); CatalogError names line, column or byte."""
    line = decode(raw, where, offset=start)
    if not line.strip():
        return None
    obj = parse_json_line(line.rstrip(), where)  # a trailing newline would shift the error's column
    if not isinstance(obj, dict):
        raise CatalogError(f"{where}: expected a JSON object, got {json_type(obj)}")
    check_tree(obj, where, json_only=True)
    return obj


def _tool(ctx: Context, position: str, row: Any) -> Tool:
    if isinstance(row, _BadLine):
        raise CatalogError(row.message)
    where = f"{ctx.source}:{position[5:]}" if position.startswith("line ") else f"{ctx.source}: {position}"
    if not isinstance(row, Mapping):
        raise CatalogError(f"{where}: expected a tool row object, got {json_type(row)}")
    _check_types(row, where)
    if row.get("parameters") is None:
        alias = next((k for k in PARAMETER_KEYS[1:] if row.get(k) is not None), None)
        if alias:
            row = {**row, "parameters": row[alias]}
    tool = tool_from_row(row, where)
    extras = read_extras(ctx, row, position)
    if ctx.namespace and not tool.namespace:
        extras["namespace"] = ctx.namespace
    return tool.with_changes(**extras) if extras else tool


# Fields `tool_from_row` takes as they are: their types are checked here, so a wrong one is a CatalogError.
_ROW_TYPES = {"namespace": (str,), "profile": (Mapping,), "tags": (str, list), "usage": (list,)}


def _check_types(row: Mapping, where: str) -> None:
    for key, types in _ROW_TYPES.items():
        value = row.get(key)
        if value is not None and not isinstance(value, types):
            wanted = " or ".join({str: "a string", list: "a list", Mapping: "an object"}[t] for t in types)
            raise CatalogError(f"{where}: field {key!r} must be {wanted} or null, got {json_type(value)}")
