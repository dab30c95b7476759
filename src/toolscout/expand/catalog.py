"""Reading a catalog for expansion or generation, and writing the result in the benchmark format.

Input: any catalog `load_tools` reads. A benchmark folder (or `tools.jsonl`) keeps its original rows, so
the output differs from the input only in `profile` / `usage`; its `queries.jsonl` travels along.
Output: `OUT.jsonl` (one tools file) or a folder `OUT/` holding `tools.jsonl` (+ `queries.jsonl`), which
`toolscout eval OUT`, `toolscout train ... --data OUT` and `load_benchmark` read directly. Files are
written beside and renamed, so an interrupted write never leaves half a file.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from ..artifacts import replace_file
from ..benchmark_sets import Query, load_queries, read_jsonl
from ..tool import Tool

_FILE_MODE = 0o644


@dataclass
class Catalog:
    tools: list[Tool]
    source: str
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)  # tool id → original benchmark row
    queries: list[Query] = field(default_factory=list)
    queries_file: Path | None = None


def _benchmark_tools_file(path: Path) -> Path | None:
    if path.is_dir() and (path / "tools.jsonl").is_file():
        return path / "tools.jsonl"
    if path.is_file() and path.suffix.lower() == ".jsonl":
        return path
    return None


def read_catalog(source: str | os.PathLike, format: str | None = None, lenient: bool = False) -> Catalog:
    """Tools of `source` (any catalog format), with the benchmark rows and queries when it has them."""
    from ..ingest import load_tools

    path = Path(source)
    tools = load_tools(source, format=format, lenient=lenient)
    tools_file = _benchmark_tools_file(path) if format in (None, "jsonl") else None
    if tools_file is None:
        return Catalog(tools, str(source))
    rows = {row["id"]: row for _n, row in read_jsonl(tools_file) if isinstance(row.get("id"), str)}
    tools = [_with_row_usage(t, rows.get(t.id)) for t in tools]
    queries_file = tools_file.parent / "queries.jsonl"
    queries: list[Query] = []
    if queries_file.is_file():
        queries = load_queries(queries_file, {t.id for t in tools})
    else:
        queries_file = None
    return Catalog(tools, str(source), rows, queries, queries_file)


def _with_row_usage(tool: Tool, row: Mapping[str, Any] | None) -> Tool:
    """Keep a `usage` list an earlier `toolscout expand --usage` wrote into the row."""
    if row is None or tool.usage or not isinstance(row.get("usage"), list):
        return tool
    return tool.with_changes(usage=tuple(str(u) for u in row["usage"] if isinstance(u, str)))


def tool_row(tool: Tool, original: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A benchmark `tools.jsonl` row for `tool`: its original row when it has one, with `profile` and
    `usage` set from the tool (`toolscout.benchmark_sets.tool_from_row` reads it back)."""
    if original is not None:
        row = dict(original)
    else:
        row = {"id": tool.id, "name": tool.name, "description": tool.description, "parameters": tool.parameters,
               "category": tool.category}
        extras = {"namespace": tool.namespace, "tags": list(tool.tags) or None, "title": tool.title,
                  "method": tool.method, "path": tool.path, "examples": list(tool.examples) or None,
                  "limitations": tool.limitations, "returns": tool.returns}
        row.update({k: v for k, v in extras.items() if v is not None})
        if tool.raw is not None and _is_json(tool.raw):
            row["doc"] = tool.raw
    row.pop("profile", None)
    row.pop("usage", None)
    if tool.profile:
        row["profile"] = dict(tool.profile)
    if tool.usage:
        row["usage"] = list(tool.usage)
    return row


def _is_json(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def write_reports(paths: Sequence[Path], report: Mapping[str, Any]) -> None:
    """A run report (expand's, generate's) as JSON to each of `paths`."""
    for path in paths:
        atomic_write_text(path, json.dumps(report, indent=2) + "\n")


def atomic_write_text(path: Path, text: str) -> None:
    replace_file(path, text, fsync=True, mode=_FILE_MODE)  # a catalog is an ordinary readable file


def atomic_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.chmod(tmp, _FILE_MODE)
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def jsonl_text(rows: Iterable[Mapping[str, Any]]) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)


def is_folder_output(out: str | os.PathLike) -> bool:
    return Path(out).suffix.lower() != ".jsonl"


def check_output(out: str | os.PathLike, own: Sequence[str | os.PathLike], command: str) -> None:
    """Refuse, before any LLM call, a folder `--out` that holds what `command` did not write: it is this
    command's when it is empty or holds one of the files the command writes there (`own`: its report or
    journal, so a rerun resumes). Anything else (a benchmark folder with hand-labelled queries, a trained
    model) would be overwritten. A `*.jsonl` file named as the output is replaced, as an output file is."""
    out = Path(out)
    if not out.exists():
        return
    if not is_folder_output(out):
        if out.is_dir():
            raise ValueError(f"--out {out}: is a folder; a *.jsonl output is a file")
        return
    if not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a folder")
    if any(out.iterdir()) and not any(Path(path).exists() for path in own):
        raise ValueError(f"--out {out}: the folder holds files `{command}` did not write (none of "
                         f"{', '.join(Path(p).name for p in own)}); give a new folder, so nothing in it is overwritten")


def tools_path(out: str | os.PathLike) -> Path:
    """Where the tools of output `out` go: `out` itself for `*.jsonl`, else `out/tools.jsonl`."""
    out = Path(out)
    return out / "tools.jsonl" if is_folder_output(out) else out


def write_catalog(out: str | os.PathLike, tools: Sequence[Tool], catalog: Catalog | None = None,
                  queries: Sequence[Query] | None = None) -> Path:
    """Write `tools` (original rows kept) to `out`; into a folder, also the queries: `queries` when
    given, else a copy of the input's queries.jsonl. Returns the tools file written."""
    out = Path(out)
    rows = catalog.rows if catalog is not None else {}
    target = tools_path(out)
    if is_folder_output(out) and target.parent.exists() and not target.parent.is_dir():
        raise ValueError(f"{out}: exists and is not a folder")
    atomic_write_text(target, jsonl_text(tool_row(t, rows.get(t.id)) for t in tools))
    if is_folder_output(out):
        if queries is not None:
            atomic_write_text(out / "queries.jsonl", jsonl_text(
                {"id": q.id, "query": q.text, "labels": list(q.labels), "split": q.split} for q in queries))
        elif catalog is not None and catalog.queries_file is not None:
            if catalog.queries_file.resolve() != (out / "queries.jsonl").resolve():
                atomic_copy(catalog.queries_file, out / "queries.jsonl")
    return target
