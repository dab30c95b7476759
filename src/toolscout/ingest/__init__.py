"""Tool catalogs in any common format → `list[Tool]`.

    from toolscout.ingest import load_tools, LoadReport
    tools = load_tools("petstore.yaml")                      # format detected
    tools = load_tools("tools.json", format="anthropic")     # or named
    report = LoadReport()
    tools = load_tools("mcp_tools.json", lenient=True, report=report)   # bad tools skipped, listed in report
    tools = load_tools([get_weather, send_email])            # Python callables

Sources for `load_tools`: a file path (JSON, YAML, JSONL, .py), a benchmark folder holding
`tools.jsonl`, a `"package.module:attr"` string naming Python callables, a running MCP server
(`"mcp:COMMAND ARGS"` over stdio, or an `http(s)://` streamable-HTTP URL; see `live_mcp`), a document by
URL (an `http(s)://` URL whose path ends in .json/.yaml/.yml, or any with a `format` other than "mcp": an
OpenAPI spec's `/openapi.json`; see `remote`), or an
object already in memory (dict / list / callables, handed to `parse_tools`). Several catalogs: call it once per file;
tools of different files with equal ids are the caller's to namespace.

Format detection (when `format` is None), first rule that applies:
  1. a folder → "jsonl" (benchmark rows); a `.jsonl` file → one tool per line: OpenAI, Anthropic or MCP
     tool definitions when its first row has no `id` and looks like one (the votes below), else benchmark
     rows (`format=` openai/anthropic/mcp reads its lines as that format); detected, every line must read as
     the first line's format, as a list must have one (a line that reads as another is an error, or skipped
     when lenient); a `.py` file or `module:attr`
     → "python".
  2. other files are read as JSON (`.json`, or text starting with `{`/`[`) or YAML (`.yaml`/`.yml`,
     anything else), then the object decides:
     - a mapping with `openapi` or `swagger` → "openapi";
     - a mapping with `jsonrpc`, `servers`, `mcpServers`, or `result.tools` → "mcp";
     - a mapping with a `functions` list → "openai" (legacy functions);
     - otherwise the tool objects (the `tools` list, the list itself, or the one object) vote:
       `function` object, `type: "function"` or an OpenAI built-in type (web_search, ...) → openai;
       `inputSchema`, `outputSchema`, `annotations`, or a server entry with `tools` → mcp;
       `input_schema` or a dated server-tool type (web_search_20250305) → anthropic;
       `id` + `name` + (`doc` or `category`) → jsonl; `parameters`, or only name/description → openai;
       a callable → python. Objects that give no sign do not vote.
     Exactly one format must get votes; none, or two (a mixed list), fails with a message that lists
     the formats and the `format=` argument / `--format` flag.
  A `format=` given that fails on a catalog (or skips all of it) that these rules read as another format
  says which, before the failure; a file that reads as no object or list (a CSV table) is refused with
  the kinds of catalog there are (`detect.CATALOG_KINDS`).

Errors: malformed input raises `toolscout.errors.CatalogError` naming the file, the position (an index
path such as `tools[3].function.parameters` or `paths./pets.get`, `line N` for JSONL, line and column
for JSON/YAML syntax and for a key written twice in one object, which is refused rather than read as
the last one, the byte offset of invalid UTF-8) and the field. Hostile input is bounded before
any parser sees it (`guard.py`: nesting depth, alias expansion, cycles, NaN/Infinity, non-JSON YAML
values; `text.py`: invalid UTF-8, JSON beyond Python's limits; `yaml_loader.py`: Python tags, merge-key
bombs; `schema.py`: $ref cycles and fan-out); schemas built from Python type hints keep the same bounds
(`pytypes.py`, `python.py`). So no other exception escapes and no catalog takes unbounded time or memory
(`tests/test_ingest_fuzz.py` checks this). `lenient=True` skips a bad tool (in OpenAPI, also a path item that
is not an object or whose $ref is broken or loops: its operations; a tool holding a NaN or Infinity, while
one outside every tool still refuses the source), records `(position, message)`
in `LoadReport.skipped` and goes on; a file that cannot be parsed at all still raises. Tools that a
format defines but that cannot be retrieved (Anthropic server tools, OpenAI built-ins) are always
skipped and reported.

Warnings (`LoadReport.warnings`, each naming the file): `$ref`s to other files left unresolved, a caller
namespace a grouped MCP file ignores, type hints that could not be resolved, a catalog that gave no tool.
`LoadReport.notices()` is both, skipped tools and warnings, one line each, as the CLI prints them and the
HTTP API returns them.

Ids: `namespace.name` when the tool has a namespace (an MCP server, an OpenAPI spec's title, the
caller's `namespace=`), else the name; benchmark rows keep their own ids. The same name in two
namespaces gives two tools; the same id twice in one source is an error naming both positions (in
lenient mode the later one is skipped and reported).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

from ..errors import CatalogError
from ..tool import Tool
from . import anthropic, jsonl, live_mcp, mcp, openai, openapi, python, remote
from .common import Context, Entry, LoadReport, finish
from .detect import (CATALOG_KINDS, FORMATS, LINE_FORMATS, detect_format, format_of_item, format_of_path,
                     format_of_row, read_structured)
from .guard import check_tree

__all__ = ["load_tools", "parse_tools", "LoadReport", "FORMATS"]

_PARSERS: dict[str, Callable[[Any, Context], list[Entry]]] = {
    "openai": openai.parse, "anthropic": anthropic.parse, "mcp": mcp.parse, "openapi": openapi.parse,
    "python": python.parse, "jsonl": jsonl.parse,
}


def _check_format(format: str | None) -> None:
    if format is not None and format not in FORMATS:
        raise CatalogError(f"unknown catalog format {format!r}; known: {', '.join(FORMATS)} (CLI: --format NAME)")


def parse_tools(obj: Any, format: str | None = None, lenient: bool = False, source: str = "<object>",
                namespace: str | None = None, report: LoadReport | None = None, as_served: bool = False) -> list[Tool]:
    """Tools from an object already in memory: parsed JSON/YAML, or a list of Python callables.
    `as_served`: a live server's listing, whose parameters schemas are kept as it gives them (`Context`)."""
    _check_format(format)
    check_tree(obj, source, non_finite_ok=lenient)  # the lenient load's NaN/Infinity: `_parse` places them
    return _parse(obj, format, lenient, source, namespace, report, as_served)


def _parse(obj: Any, format: str | None, lenient: bool, source: str, namespace: str | None,
           report: LoadReport | None, as_served: bool = False) -> list[Tool]:
    """`parse_tools` for an object already checked by `check_tree`."""
    report = report if report is not None else LoadReport()
    ctx = Context(source=source, lenient=lenient, report=report, namespace=namespace, as_served=as_served)
    if lenient:  # let through by the reader's check: each refuses the tool that holds it (`collect`)
        ctx.non_finite = check_tree(obj, source, non_finite_ok=True)
    fmt = format or detect_format(obj, source)
    try:
        tools = finish(ctx, _PARSERS[fmt](obj, ctx))
    except CatalogError as exc:  # read as the format given, it fails: say what it reads as, when that is another
        other = format and _another_format(format, lambda: detect_format(obj, source))
        if not other:
            raise
        raise CatalogError(f"{source}: {other}; read as {format}, it fails: {exc}") from None
    report.format, report.source = fmt, source
    if not tools and ctx.skips and format is not None:
        other = _another_format(format, lambda: detect_format(obj, source))
        if other:  # an OpenAI list read as Anthropic's loses every entry, each for a reason naming the wrong format
            ctx.warn(other)
    return tools


def _another_format(format: str, detected: Callable[[], str], what: str = "it") -> str | None:
    """What to say when a catalog read as the `format` given looks like another (`detected()`: the format
    `what` reads as), else None."""
    try:
        other = detected()
    except CatalogError:  # it looks like no format, or like several: nothing to say
        return None
    if other == format:
        return None
    return (f"{what} reads as {other}, not {format}: pass format={other!r} or none (CLI: --format {other}, or no "
            "--format)")


def load_tools(source: str | os.PathLike | list | dict | Callable, format: str | None = None,
               lenient: bool = False, namespace: str | None = None,
               report: LoadReport | None = None) -> list[Tool]:
    """Tools from a catalog file, a benchmark folder, `module:attr`, or an object (see the module doc)."""
    _check_format(format)
    report = report if report is not None else LoadReport()
    if not isinstance(source, (str, os.PathLike)):
        return parse_tools(source, format, lenient, "<object>", namespace, report)
    name = os.fspath(source)
    if not name.strip():  # Path("") is the current folder: not what an empty name meant
        raise CatalogError(f"{name!r}: the catalog's path or name is empty")
    path = Path(name)
    if not path.exists():
        if problem := remote.unsupported_scheme_problem(name):  # 'htp://host/x.json' is a typo, not a missing file
            raise CatalogError(problem)
        if isinstance(source, str) and remote.is_document_url(name, format):
            return _parse(remote.fetch_document(name, lenient=lenient), format, lenient, name, namespace, report)
        if format in (None, "mcp") and isinstance(source, str) and live_mcp.is_live_source(name):
            return _load_live(name, format, lenient, namespace, report)
        if format in (None, "python") and (python.MODULE_ATTR.match(name) or format == "python"):
            try:
                callables = python.import_callables(name, report)
            except CatalogError as exc:  # it may have been meant as a file name
                raise CatalogError(f"{exc}; nor is there a file or folder of that name") from None
            return parse_tools(callables, "python", lenient, name, namespace, report)
        raise CatalogError(f"{name}: no such file or folder; a catalog is one of: {CATALOG_KINDS}")
    fmt = format or format_of_path(path)
    if path.is_file() and path.suffix.lower() == ".jsonl" and (format is None or format in LINE_FORMATS):
        return _load_jsonl_definitions(path, name, format, lenient, namespace, report)
    if fmt == "python":
        return parse_tools(python.load_file(path, name, report), "python", lenient, name, namespace, report)
    if fmt == "jsonl" and (path.is_dir() or path.suffix.lower() not in (".json", ".yaml", ".yml")):
        return _load_benchmark_rows(path, name, lenient, namespace, report)
    if path.is_dir():
        raise CatalogError(f"{name}: is a folder; give a catalog file, or a benchmark folder with tools.jsonl")
    obj = read_structured(path, name, lenient=lenient)  # checked by check_tree as it is read
    return _parse(obj, fmt, lenient, name, namespace, report)


def _load_live(name: str, format: str | None, lenient: bool, namespace: str | None,
               report: LoadReport) -> list[Tool]:
    """The tools of the MCP server `name`; a URL that is no MCP endpoint may be a spec's (format not given)."""
    try:
        return live_mcp.load_live_tools(name, namespace=namespace, lenient=lenient, report=report)
    except CatalogError as exc:
        if format is not None or remote.url_scheme(name) is None:
            raise
        raise CatalogError(f"{exc}. An http(s) URL is read as an MCP server unless its path ends in .json, .yaml "
                           "or .yml; if it serves an OpenAPI spec or another catalog, pass its format (CLI: "
                           "--format openapi)") from None


def _load_jsonl_definitions(path: Path, name: str, format: str | None, lenient: bool, namespace: str | None,
                            report: LoadReport) -> list[Tool]:
    """A .jsonl file: tool definitions one per line (in `format`, or as its first row looks), else benchmark
    rows."""
    ctx = Context(source=name, lenient=lenient, report=report, namespace=namespace)
    first_line, first = jsonl.first_row(path, ctx)
    fmt = format or format_of_row(first)
    if fmt == "jsonl":
        return _load_benchmark_rows(path, name, lenient, namespace, report)
    detected = None if format else (fmt, f"{name}:{first_line}")  # lines in another format are refused
    try:
        tools = finish(ctx, jsonl.parse_definitions_file(path, ctx, _PARSERS[fmt], detected))
    except CatalogError as exc:  # read as the format given, it fails: say what its first line reads as
        other = format and _another_format(format, lambda: _format_of_line(first), f"line {first_line}")
        if not other:
            raise
        raise CatalogError(f"{name}: {other}; read as {format}, it fails: {exc}") from None
    report.format, report.source = fmt, name
    return tools


def _format_of_line(row: Any) -> str:
    """The format a JSONL line shows a sign of; CatalogError when it shows none (not JSON, not an object, or
    an object no format's tool looks like): then there is nothing to say about it but the parser's error."""
    shape = format_of_item(row)  # None for anything but an object (a JSON line is never callable)
    if shape is None:
        raise CatalogError("the line shows no format")
    return shape


def _load_benchmark_rows(path: Path, name: str, lenient: bool, namespace: str | None,
                         report: LoadReport) -> list[Tool]:
    file = jsonl.tools_file(path, name)
    shown = name if file == path else os.path.join(name, file.name)
    ctx = Context(source=shown, lenient=lenient, report=report, namespace=namespace)
    tools = finish(ctx, jsonl.parse_file(file, ctx))
    report.format, report.source = "jsonl", shown
    return tools
