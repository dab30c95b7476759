"""Every catalog reader under hostile input (issue 19): property-based tests with Hypothesis.

Hypothesis builds a well-formed catalog of one format (OpenAI chat tools, OpenAI legacy `functions`,
Anthropic, MCP `tools/list`, MCP grouped by server, OpenAPI 3, benchmark JSONL, Python callables), then
breaks it: wrong types at any place, missing and extra fields, non-string keys, duplicate ids, nesting 200
to 50,000 levels deep, strings of megabytes, NaN and Infinity, objects that contain themselves, YAML
"billion laughs" (aliases) and merge-key bombs, YAML tags that would construct Python objects, invalid
UTF-8, BOMs, truncated and random bytes, $ref cycles (self, mutual, through arrays and allOf), $refs to
missing or external targets, $ref fan-outs; for callables, odd type hints (recursive, unresolvable,
thousands deep, Literal[nan]), defaults that are not JSON and docstrings with long runs of spaces; for
Python module files, hints and defaults as source text, sys.exit() and syntax errors. Each input is read
through the public readers, strictly or leniently (drawn): in memory (`load_tools(obj)`, source "<object>",
or `parse_tools(obj, source="catalog")`, drawn) and as a file (`load_tools(path)`: JSON, YAML, JSONL or
.py), with the format given or detected. The property, for every read:

- it returns `Tool`s, or raises `CatalogError` whose message names the source (the file path, "<object>"
  or "catalog") and the place: the tool, the key path that was broken, or the line/column/byte offset in
  the file; never any other exception. In lenient mode a skipped tool's message must do the same;
- a well-formed catalog gives exactly the generated ids; a broken one still gives every tool it did
  not touch; whatever loads serializes as strict JSON (`allow_nan=False`), so it can be indexed;
- each read takes at most TIME_LIMIT_S seconds and MEMORY_LIMIT_MB of Python allocations (the
  `tracemalloc` peak). A correct reader needs far less: the largest input is a few MB of text and the
  slowest read measured here takes about a second under tracemalloc; the bombs, unguarded, take minutes
  or GBs.

Budget: the default profile is fixed (derandomized), 20 examples a property (scaled by `weight` where one
example is costly) and no shrinking, so the file runs in about 25 s on 2 cores. `HYPOTHESIS_PROFILE=long`
runs 300 a property at random, with larger huge values, and shrinks failures. `--hypothesis-show-statistics`
prints the example counts and the events (which mutation each example made).

Section 13 holds one regression test per bug the fuzzing found, each with the exact message it now gives;
the comment above each input says what happened to it before.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import enum
import functools
import gc
import inspect
import json
import keyword
import math
import os
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
import typing
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, Phase, event, given, note, settings, target
from hypothesis import strategies as st

import toolscout
from toolscout.errors import CatalogError
from toolscout.ingest import LoadReport, load_tools, parse_tools
from toolscout.tool import Tool

# ------------------------------------------------------------------------------------ bounds and budget

TIME_LIMIT_S = 5.0  # CPU seconds per read, under tracemalloc (which makes allocations several times slower)
MEMORY_LIMIT_MB = 200  # tracemalloc peak per read
# Writing a loaded tool as JSON: a 3-million-character non-ASCII string stands in a record up to 4 times
# (description, raw, a key and raw's key), escaped to 6 bytes a character: ~70 MB of JSON, ~210 MB at the peak.
WRITE_LIMIT_MB = 2 * MEMORY_LIMIT_MB
HARD_STOP_S = 20  # SIGALRM turns a hang into a failure instead of a stuck test run

# The default run is fixed (derandomized) and short, and does not shrink a failure (each shrink step of a
# slow input costs seconds); HYPOTHESIS_PROFILE=long explores at random, far more, and shrinks.
_CHECKS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example]
settings.register_profile("default", max_examples=20, deadline=None, derandomize=True, database=None,
                          print_blob=False, suppress_health_check=_CHECKS,
                          phases=[Phase.explicit, Phase.generate, Phase.target])
settings.register_profile("long", max_examples=300, deadline=None, derandomize=False, database=None,
                          print_blob=True, suppress_health_check=_CHECKS)
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "default")
FUZZ = settings.get_profile(PROFILE)

NOTHING = object()  # a case with no in-memory form (bytes only)
MARK = "MUTATION_POINT_QZX"  # stands in a dumped file where raw text is spliced in
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


# ------------------------------------------------------------------------------------ paths and tokens

def render(path: tuple) -> str:
    """('tools', 3, 'function') → 'tools[3].function': how positions read in messages."""
    out = ""
    for key in path:
        out = f"{out}[{key}]" if isinstance(key, int) else (f"{out}.{key}" if out else str(key))
    return out


def has_token(message: str, token: str) -> bool:
    """`token` stands in `message` as a whole position (not as the tail of a longer one)."""
    return re.search(r"(?:^|[\s(])" + re.escape(token) + r"(?=$|[\s.:\[(),;])", message) is not None


def value_paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path below the root, parents before children."""
    out: list[tuple] = []
    stack = [(prefix, doc)]
    while stack:
        path, node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, child in items:
            out.append(path + (key,))
            stack.append((path + (key,), child))
    return sorted(out, key=lambda p: (len(p), render(p)))


def get(doc: Any, path: tuple) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def add(node: dict | list, key: Any, value: Any) -> Any:
    """Add `value` to a mapping under `key`, or to the end of a list (the key then is its index)."""
    if isinstance(node, list):
        node.append(value)
        return len(node) - 1
    node[key] = value
    return key


def put(doc: Any, path: tuple, value: Any) -> Any:
    """Set `value` at `path` (the root when path is empty); returns the document."""
    if not path:
        return value
    get(doc, path[:-1])[path[-1]] = value
    return doc


# ------------------------------------------------------------------------------------ catalogs

@dataclass
class Spec:
    name: str
    description: str
    schema: dict


@dataclass
class Catalog:
    """A well-formed catalog of one format, and where its tools are."""

    format: str
    doc: Any
    tool_paths: list[tuple]  # position of each tool in the document
    ids: list[str]
    names: list[str]
    name_paths: list[tuple]  # where each tool's name (the JSONL id) is written
    kinds: tuple[str, ...] = ("json", "yaml")  # file kinds it can be written as

    def tool_tokens(self, index: int, file: str | None) -> list[str]:
        if file is not None and self.kinds == ("jsonl",):
            return [f"{file}:{index + 1}", f"line {index + 1}"]
        return [render(self.tool_paths[index])]

    def tools_at(self, path: tuple) -> list[int]:
        """The tools a change at `path` touches (inside one, or above several; in OpenAPI, anything outside
        `paths` (version, components) touches them all)."""
        if self.format == "openapi" and path[:1] != ("paths",):
            return list(range(len(self.tool_paths)))
        return [i for i, tp in enumerate(self.tool_paths) if path[:len(tp)] == tp or tp[:len(path)] == path]


WORDS = st.from_regex(r"[a-z][a-z0-9_]{0,10}", fullmatch=True)
PROSE = st.text(max_size=24)
SCHEMA_TYPES = ("string", "integer", "number", "boolean", "array", "object")


@st.composite
def tool_specs(draw) -> list[Spec]:
    specs = []
    for name in draw(st.lists(WORDS, min_size=1, max_size=4, unique=True)):
        props = draw(st.dictionaries(WORDS, st.sampled_from(SCHEMA_TYPES), max_size=3))
        schema = {"type": "object",
                  "properties": {k: {"type": t, "description": draw(PROSE)} for k, t in props.items()}}
        if props:
            schema["required"] = sorted(props)[:1]
        specs.append(Spec(name, draw(PROSE), schema))
    return specs


def _simple(fmt: str, specs: list[Spec], wrap: Callable[[Spec], dict], key: str | None, inner: tuple = (),
            namespace: str | None = None, kinds: tuple[str, ...] = ("json", "yaml")) -> Catalog:
    tools = [wrap(s) for s in specs]
    doc = {key: tools} if key else tools
    base = (key,) if key else ()
    names = [s.name for s in specs]
    ids = [f"{namespace}.{n}" if namespace else n for n in names]
    return Catalog(fmt, doc, [base + (i,) for i in range(len(specs))], ids, names,
                   [base + (i,) + inner + ("name",) for i in range(len(specs))], kinds)


def openai_chat(specs: list[Spec]) -> Catalog:
    return _simple("openai", specs, lambda s: {"type": "function", "function": {
        "name": s.name, "description": s.description, "parameters": s.schema}}, "tools", ("function",))


def openai_legacy(specs: list[Spec]) -> Catalog:
    return _simple("openai", specs, lambda s: {"name": s.name, "description": s.description,
                                               "parameters": s.schema}, "functions")


def anthropic(specs: list[Spec]) -> Catalog:
    return _simple("anthropic", specs, lambda s: {"name": s.name, "description": s.description,
                                                  "input_schema": s.schema}, None)


def mcp_tools(specs: list[Spec]) -> Catalog:
    return _simple("mcp", specs, lambda s: {"name": s.name, "description": s.description,
                                            "inputSchema": s.schema}, "tools")


def mcp_servers(specs: list[Spec]) -> Catalog:
    flat = mcp_tools(specs)
    flat.doc = {"mcpServers": {"srv": flat.doc}}
    flat.tool_paths = [("mcpServers", "srv") + p for p in flat.tool_paths]
    flat.name_paths = [("mcpServers", "srv") + p for p in flat.name_paths]
    flat.ids = [f"srv.{n}" for n in flat.names]
    return flat


def jsonl_rows(specs: list[Spec]) -> Catalog:
    catalog = _simple("jsonl", specs, lambda s: {"id": s.name, "name": s.name, "description": s.description,
                                                 "parameters": s.schema, "category": "fuzz"}, None,
                      kinds=("jsonl",))
    catalog.name_paths = [(i, "id") for i in range(len(specs))]
    return catalog


def openapi(specs: list[Spec]) -> Catalog:
    paths, schemas = {}, {}
    for i, s in enumerate(specs):
        schemas[f"S{i}"] = s.schema
        ref = {"$ref": f"#/components/schemas/S{i}"}
        paths[f"/n{i}"] = {"post": {
            "operationId": s.name, "summary": s.description,
            "parameters": [{"name": "trace", "in": "header", "schema": {"type": "string"}}],
            "requestBody": {"content": {"application/json": {"schema": ref}}},
            "responses": {"200": {"description": "ok", "content": {"application/json": {"schema": dict(ref)}}}}}}
    doc = {"openapi": "3.0.3", "info": {"title": "Fuzz API", "version": "1"}, "paths": paths,
           "components": {"schemas": schemas}}
    names = [s.name for s in specs]
    return Catalog("openapi", doc, [("paths", f"/n{i}", "post") for i in range(len(specs))],
                   [f"fuzz-api.{n}" for n in names], names,
                   [("paths", f"/n{i}", "post", "operationId") for i in range(len(specs))])


BUILDERS = {"openai": openai_chat, "openai_legacy": openai_legacy, "anthropic": anthropic, "mcp": mcp_tools,
            "mcp_servers": mcp_servers, "openapi": openapi, "jsonl": jsonl_rows}


@st.composite
def catalogs(draw, builders: tuple[str, ...] = tuple(BUILDERS)) -> Catalog:
    builder = draw(st.sampled_from(builders))
    catalog = BUILDERS[builder](draw(tool_specs()))
    event(f"format: {builder}")
    return catalog


# ------------------------------------------------------------------------------------ files

def dump(doc: Any, kind: str) -> bytes:
    if kind == "json":
        return json.dumps(doc, ensure_ascii=False, indent=1).encode("utf-8")
    if kind == "yaml":
        return yaml.dump(doc, Dumper=DUMPER, allow_unicode=True, sort_keys=False).encode("utf-8")
    rows = doc if isinstance(doc, list) else [doc]
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode("utf-8")


def splice(doc: Any, path: tuple, kind: str, payload: bytes) -> tuple[bytes, int]:
    """`doc` dumped as `kind` with raw `payload` text at `path`; and the byte offset where it starts."""
    data = dump(put(copy.deepcopy(doc), path, MARK), kind)
    marker = MARK.encode() if kind == "yaml" else f'"{MARK}"'.encode()
    offset = data.index(marker)
    return data[:offset] + payload + data[offset + len(marker):], offset


def line_col(data: bytes, offset: int) -> tuple[int, int]:
    line_start = data.rfind(b"\n", 0, offset) + 1
    return data.count(b"\n", 0, offset) + 1, len(data[line_start:offset].decode("utf-8", "replace")) + 1


SUFFIX = {"json": ".json", "yaml": ".yaml", "jsonl": ".jsonl", "py": ".py"}


# ------------------------------------------------------------------------------------ the property

Place = Callable[[str, "str | None"], bool]  # (message, file or None for the in-memory read) → names the place


@dataclass
class Case:
    catalog: Catalog
    label: str
    doc: Any = NOTHING  # what parse_tools reads (NOTHING: no in-memory form)
    data: bytes | None = None  # the file's bytes (None: `doc` dumped as `kind`)
    kind: str = "json"
    expect: str = "either"  # ok (exactly the ids) | error (CatalogError) | either
    place: Place = field(default=lambda message, file: True)
    format: str | None = "given"  # the format= argument: "given" means the catalog's own
    touched: tuple = ()  # the path changed: tools outside it must still load (None: any may go)
    after: Callable[[], None] | None = None  # a check once both reads are done

    def format_arg(self) -> str | None:
        return self.catalog.format if self.format == "given" else self.format

    def __repr__(self) -> str:  # the document may hold megabytes: Hypothesis prints `note`s instead
        return f"Case({self.label!r}, {self.catalog.format}, {self.kind})"

    @property
    def suffix(self) -> str:
        return SUFFIX[self.kind]


class HardStop(BaseException):
    """Raised by SIGALRM when one read runs past HARD_STOP_S."""


def _hard_stop(signum, frame):
    raise HardStop(f"a read ran past {HARD_STOP_S} s")


@dataclass
class Outcome:
    result: Any
    seconds: float
    peak_mb: float


def bounded(call: Callable[[], Any]) -> Outcome:
    """`call()` (or what it raised), its CPU seconds and its peak of Python allocations. CPU time, not wall
    time: other jobs on a shared machine must not fail a read; a hang still trips HARD_STOP_S."""
    gc.disable()  # a collection of earlier examples' garbage is not this read's time
    previous = signal.signal(signal.SIGALRM, _hard_stop)
    signal.setitimer(signal.ITIMER_REAL, HARD_STOP_S)
    tracemalloc.start()
    start = time.process_time()
    try:
        result = call()
    except Exception as exc:  # noqa: BLE001 - judged by `judge`: only CatalogError may come out
        result = exc
    finally:
        seconds = time.process_time() - start
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        gc.enable()
    return Outcome(result, seconds, peak)


def judge(case: Case, outcome: Outcome, report: LoadReport, source: str, file: str | None) -> None:
    what = f"{case.label} read from {'file' if file else 'memory'}"
    assert outcome.seconds <= TIME_LIMIT_S, f"{what}: took {outcome.seconds:.1f} s"
    assert outcome.peak_mb <= MEMORY_LIMIT_MB, f"{what}: peak {outcome.peak_mb:.0f} MB"
    result = outcome.result
    if isinstance(result, BaseException):
        assert isinstance(result, CatalogError), f"{what}: {type(result).__name__} escaped: {str(result)[:500]}"
        message = str(result)
        note(f"{what}: CatalogError: {message[:300]}")
        assert case.expect != "ok", f"{what}: a well-formed catalog failed: {message[:500]}"
        assert source in message, f"{what}: the message does not name {source!r}: {message[:500]}"
        assert case.place(message, file), f"{what}: the message does not name the place: {message[:500]}"
        return
    skipped = [message for _, message in report.skipped]  # lenient mode, or tools no format can retrieve
    assert all(source in message for message in skipped), f"{what}: a skip does not name {source!r}: {skipped}"
    if skipped:  # one of them is the change this case made
        assert any(case.place(m, file) for m in skipped), f"{what}: no skip names the place: {skipped}"
    assert case.expect != "error" or skipped, f"{what}: loaded {len(result)} tools, expected a CatalogError"
    assert all(isinstance(tool, Tool) for tool in result)
    ids, names = [t.id for t in result], {t.name for t in result}
    if case.expect == "ok":
        assert ids == case.catalog.ids and not skipped, f"{what}: ids {ids} != {case.catalog.ids}; {skipped}"
    elif case.touched is not None:
        untouched = set(range(len(case.catalog.names))) - set(case.catalog.tools_at(case.touched))
        assert {case.catalog.names[i] for i in untouched} <= names, f"{what}: lost untouched tools: {ids}"
    serialized = bounded(lambda: [json.dumps(t.to_record(), allow_nan=False) for t in result])
    assert not isinstance(serialized.result, BaseException), \
        f"{what}: loaded tools do not serialize as JSON: {serialized.result!r:.300}"
    assert serialized.seconds <= TIME_LIMIT_S and serialized.peak_mb <= WRITE_LIMIT_MB, \
        f"{what}: writing the tools took {serialized.seconds:.1f} s, {serialized.peak_mb:.0f} MB"


def read_in_memory(case: Case, lenient: bool, via_load_tools: bool) -> Outcome:
    """Through `load_tools(obj)` (the public reader, source "<object>") or `parse_tools(obj, source=...)`."""
    report, fmt = LoadReport(), case.format_arg()
    via_load_tools = via_load_tools and not isinstance(case.doc, str)  # load_tools reads a string as a path
    source = "<object>" if via_load_tools else "catalog"

    def read() -> list[Tool]:
        if via_load_tools:
            return load_tools(case.doc, format=fmt, lenient=lenient, report=report)
        return parse_tools(case.doc, format=fmt, lenient=lenient, source=source, report=report)
    outcome = bounded(read)
    judge(case, outcome, report, source, None)
    return outcome


def read_file(case: Case, lenient: bool) -> Outcome | None:
    """`load_tools(path)` on the case's bytes (or its object written as JSON, YAML or JSONL)."""
    data = case.data
    if data is None and case.kind == "py":  # callables in memory have no file form
        return None
    if data is None:
        try:
            data = dump(case.doc, case.kind)
        except (TypeError, ValueError, yaml.YAMLError):  # keys JSON/YAML cannot write: memory only
            return None
    report, fmt = LoadReport(), case.format_arg()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"catalog{case.suffix}"
        path.write_bytes(data)
        outcome = bounded(lambda: load_tools(path, format=fmt, lenient=lenient, report=report))
        judge(case, outcome, report, str(path), str(path))
    return outcome


def check(case: Case, lenient: bool, via_load_tools: bool) -> None:
    event(case.label)
    event(f"lenient: {lenient}")
    outcomes = [read_in_memory(case, lenient, via_load_tools)] if case.doc is not NOTHING else []
    outcomes += [o for o in [read_file(case, lenient)] if o is not None]
    # The file is the object written out: strict reads must agree. (Lenient ones may not: a JSONL file skips
    # a bad line, while the guard refuses a whole object, or JSON/YAML file, that holds a value it cannot carry.)
    if case.data is None and len(outcomes) == 2 and not lenient:
        memory, file = (o.result for o in outcomes)
        if isinstance(memory, list) and isinstance(file, list):
            assert [t.id for t in memory] == [t.id for t in file], "memory and file reads loaded different tools"
        else:
            assert isinstance(memory, CatalogError) and isinstance(file, CatalogError), \
                f"one read loaded tools, the other raised: {memory!r:.300} / {file!r:.300}"
    if case.after is not None:
        case.after()
    # Steers Hypothesis towards slow and big reads, and reports the worst it found in the statistics.
    target(max(o.seconds for o in outcomes), label="seconds per read (worst of the case)")
    target(max(o.peak_mb for o in outcomes), label="MB per read (worst of the case)")


def fuzz(strategy: st.SearchStrategy[Case], weight: float = 1.0):
    """The property over `strategy`, read strictly or leniently, from memory through either public reader
    and from a file; `weight` scales the profile's example count (by what one example costs)."""
    @settings(FUZZ, max_examples=max(2, round(FUZZ.max_examples * weight)))
    @given(strategy, st.booleans(), st.booleans())
    def test(case: Case, lenient: bool, via_load_tools: bool) -> None:
        check(case, lenient, via_load_tools)
    return test


# ------------------------------------------------------------------------------------ where messages point

def near(catalog: Catalog, path: tuple) -> Place:
    """A lax place: the tool that holds `path`, `path` itself or a parent of it (two keys deep at least);
    for OpenAPI components, any operation that needs them."""
    def names(message: str, file: str | None) -> bool:
        if not path:
            return True
        tokens = [t for i in catalog.tools_at(path) for t in catalog.tool_tokens(i, file)]
        tokens += [render(path[:n]) for n in range(min(2, len(path)), len(path) + 1)]
        tokens += [f"'{path[-1]}'"]  # a field named as missing
        if path[0] == "components":
            tokens += [t for i in range(len(catalog.ids)) for t in catalog.tool_tokens(i, file)]
        if file is not None and catalog.kinds == ("jsonl",) and isinstance(path[0], int):
            return any(message.startswith(f"{file}:{path[0] + 1}") or has_token(message, t) for t in tokens)
        return any(has_token(message, t) for t in tokens)
    return names


def exactly(catalog: Catalog, path: tuple) -> Place:
    """A strict place: the key path itself (for a JSONL file: the row's line, then the path inside it)."""
    def names(message: str, file: str | None) -> bool:
        if file is not None and catalog.kinds == ("jsonl",):
            row = f"{file}:{path[0] + 1}"
            return message.startswith(row) and (len(path) == 1 or has_token(message, render(path[1:])))
        return has_token(message, render(path))
    return names


def in_text(catalog: Catalog, data: bytes, start: int, end: int, also: Place | None = None) -> Place:
    """For the file: a line and column between byte offsets `start` and `end` (one line);
    in memory, or as an alternative, `also`."""
    (line, first), (_, last) = line_col(data, start), line_col(data, end)

    def names(message: str, file: str | None) -> bool:
        if also is not None and also(message, file):
            return True
        if file is None:
            return False
        if catalog.kinds == ("jsonl",):
            found = re.search(r"column (\d+)", message)
            return message.startswith(f"{file}:{line}") and found is not None and first <= int(found[1]) <= last
        found = re.search(r"line (\d+), column (\d+)", message)
        return found is not None and int(found[1]) == line and first <= int(found[2]) <= last
    return names


def unhashable_key(message: str, file: str | None) -> bool:
    return file is not None and re.search(r"line \d+, column \d+: invalid YAML \(.*unhashable key", message) is not None


def undetected(message: str, file: str | None) -> bool:
    """The format could not be told: the message lists the formats and the `format=` argument."""
    return "pass format= one of" in message


def either_of(*places: Place) -> Place:
    return lambda message, file: any(p(message, file) for p in places)


# ------------------------------------------------------------------------------------ 1. well-formed

@st.composite
def valid_cases(draw) -> Case:
    catalog = draw(catalogs())
    kind = draw(st.sampled_from(catalog.kinds))
    data = dump(catalog.doc, kind)
    if draw(st.booleans()):
        data = b"\xef\xbb\xbf" + data  # a UTF-8 BOM is not an error
    detect = draw(st.booleans())
    return Case(catalog, f"valid {kind}" + (" with BOM" if data[:1] == b"\xef" else ""), doc=catalog.doc, data=data,
                kind=kind, expect="ok", format=None if detect else "given")


test_valid_catalogs_load_exactly = fuzz(valid_cases())


# ------------------------------------------------------------------------------------ 2. structure

WRONG_VALUES = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False),
                         st.text(max_size=8), st.lists(st.integers(), max_size=2),
                         st.dictionaries(WORDS, st.integers(), max_size=2))
SPECIAL_KEYS = st.sampled_from(["$ref", "type", "tools", "function", "functions", "inputSchema", "input_schema",
                                "openapi", "servers", "result", "jsonrpc", "error", "properties", "allOf", "<<",
                                "parameters", "paths", "id", "tags", "category", "usage", "profile", "namespace"])
ODD_KEYS = st.one_of(st.integers(), st.none(), st.booleans(), st.floats(allow_nan=False),
                     st.tuples(st.integers(), st.integers()), st.frozensets(st.integers(), max_size=2))


@st.composite
def structure_cases(draw) -> Case:
    catalog = draw(catalogs())
    doc, kind = copy.deepcopy(catalog.doc), draw(st.sampled_from(catalog.kinds))
    op = draw(st.sampled_from(["wrong type", "delete", "extra field", "odd key", "duplicate id", "wrong root"]))
    if op == "duplicate id" and len(catalog.ids) > 1:
        i, j = sorted(draw(st.lists(st.sampled_from(range(len(catalog.ids))), min_size=2, max_size=2, unique=True)))
        moved = draw(st.sampled_from([i, j]))
        put(doc, catalog.name_paths[moved], get(doc, catalog.name_paths[i + j - moved]))

        def both(message: str, file: str | None) -> bool:
            return all(any(has_token(message, t) for t in catalog.tool_tokens(k, file)) for k in (i, j))
        return Case(catalog, "duplicate id", doc=doc, kind=kind, expect="error", place=both)
    if op == "wrong root":
        return Case(catalog, "wrong root", doc=draw(WRONG_VALUES), kind=kind, touched=None)
    paths = value_paths(doc)
    if op in ("extra field", "odd key"):
        containers = [()] + [p for p in paths if isinstance(get(doc, p), (dict, list))]
        parent = draw(st.sampled_from(containers))
        key = draw(SPECIAL_KEYS | WORDS if op == "extra field" else ODD_KEYS)
        path = parent + (add(get(doc, parent), key, draw(WRONG_VALUES)),)
        if op == "odd key":  # YAML writes a tuple key as a list, which cannot be a key when read back
            note(f"{op} at {render(path)}")
            return Case(catalog, op, doc=doc, kind=kind, place=either_of(near(catalog, path), unhashable_key),
                        touched=path)
    else:
        path = draw(st.sampled_from(paths))
        if op == "delete":  # the container that lacks it may be named instead
            del get(doc, path[:-1])[path[-1]]
            note(f"delete at {render(path)}")
            return Case(catalog, op, doc=doc, kind=kind, place=either_of(near(catalog, path), near(catalog, path[:-1])),
                        touched=path)
        else:
            old = type(get(doc, path))
            put(doc, path, draw(WRONG_VALUES.filter(lambda v: type(v) is not old)))
    note(f"{op} at {render(path)}")
    if draw(st.booleans()):  # detected: the change may also leave a catalog whose format cannot be told
        return Case(catalog, op + " (detected)", doc=doc, kind=kind, place=either_of(near(catalog, path), undetected),
                    touched=path, format=None)
    return Case(catalog, op, doc=doc, kind=kind, place=near(catalog, path), touched=path)


test_broken_structure = fuzz(structure_cases())


# ------------------------------------------------------------------------------------ 3. deep nesting

def nested(shape: str, depth: int) -> Any:
    node: Any = {}
    for _ in range(depth):
        node = [node] if shape == "array" else {"a": node} if shape == "object" else \
            {"type": "object", "properties": {"x": node}}
    return node


def nested_text(shape: str, depth: int) -> str:
    head, tail = {"array": ("[", "]"), "object": ('{"a": ', "}"),
                  "schema": ('{"type": "object", "properties": {"x": ', "}}")}[shape]
    return head * depth + "{}" + tail * depth


@st.composite
def deep_cases(draw) -> Case:
    catalog = draw(catalogs())
    kind = draw(st.sampled_from(catalog.kinds))
    path = draw(st.sampled_from(value_paths(catalog.doc)))
    shape = draw(st.sampled_from(["array", "object", "schema"]))
    depth = draw(st.sampled_from([200, 1_000, 10_000, 50_000]))
    doc = put(copy.deepcopy(catalog.doc), path, nested(shape, depth))
    payload = nested_text(shape, depth).encode()
    data, offset = splice(catalog.doc, path, kind, payload)
    place = in_text(catalog, data, offset, offset + len(payload) - 1, also=exactly(catalog, path))
    return Case(catalog, f"nested {depth} deep ({shape})", doc=doc, data=data, kind=kind, place=place, touched=path)


test_deep_nesting = fuzz(deep_cases())


# ------------------------------------------------------------------------------------ 4. huge values

HUGE_SIZES = [1_000_000, 3_000_000] if PROFILE == "long" else [200_000, 1_000_000]  # characters


@st.composite
def huge_cases(draw) -> Case:
    catalog = draw(catalogs())
    kind = draw(st.sampled_from(catalog.kinds))
    doc = copy.deepcopy(catalog.doc)
    path = draw(st.sampled_from(value_paths(doc)))
    what = draw(st.sampled_from(["string", "key", "list", "number"]))
    size = draw(st.sampled_from(HUGE_SIZES))
    if what == "number":  # 5,000 digits: more than Python turns into an int by default
        data, offset = splice(catalog.doc, path, kind, b"9" * 5000)
        place = either_of(in_text(catalog, data, offset, offset), near(catalog, path))
        return Case(catalog, "5000-digit number", doc=put(doc, path, 10**5000 - 1), data=data, kind=kind,
                    place=place, touched=path)
    if what == "key" and isinstance(get(doc, path[:-1]), dict):  # a renamed key: its container is at fault
        parent = get(doc, path[:-1])
        parent[draw(st.characters()) * size] = parent.pop(path[-1])
        return Case(catalog, "huge key", doc=doc, kind=kind, place=near(catalog, path[:-1]), touched=path)
    else:
        value = draw(st.characters()) * size if what != "list" else ["x"] * (size // 100)  # YAML: ~1 s per 100k
        put(doc, path, value)
    return Case(catalog, f"huge {what}", doc=doc, kind=kind, place=near(catalog, path), touched=path)


test_huge_values = fuzz(huge_cases(), weight=0.5)


# ------------------------------------------------------------------------------------ 5. values JSON cannot carry

@st.composite
def non_json_cases(draw) -> Case:
    """NaN and Infinity (Python's JSON reader takes them), and lone surrogates (JSON's "\\ud800" escape):
    loaded, they could not be written as strict JSON, nor as UTF-8 (the journal, PostgreSQL)."""
    catalog = draw(catalogs())
    path = draw(st.sampled_from(value_paths(catalog.doc)))
    value = draw(st.sampled_from([math.nan, math.inf, -math.inf, "a\ud800b", "\udfff"]))
    doc = put(copy.deepcopy(catalog.doc), path, value)
    kind = draw(st.sampled_from(catalog.kinds))
    data = None
    if isinstance(value, str):  # written as the JSON escape (the YAML reader refuses it: JSON only)
        kind = "jsonl" if catalog.kinds == ("jsonl",) else "json"
        data, _ = splice(catalog.doc, path, kind, json.dumps(value).encode())
    return Case(catalog, f"{value!r} in JSON", doc=doc, data=data, kind=kind, expect="error",
                place=exactly(catalog, path), touched=path)


test_values_json_cannot_carry = fuzz(non_json_cases())


# ------------------------------------------------------------------------------------ 6. cycles and bombs

def laughs(fanout: int, levels: int, as_dict: bool) -> Any:
    node: Any = "lol"
    for _ in range(levels):
        node = {f"k{i}": node for i in range(fanout)} if as_dict else [node] * fanout
    return node


def merge_bomb(levels: int, fanout: int) -> bytes:
    """A YAML flow mapping whose merge keys (`<<`) list the previous level `fanout` times."""
    parts = ["b0: &m0 {k0: 1, k1: 2}"]
    for level in range(1, levels + 1):
        merged = ", ".join([f"*m{level - 1}"] * fanout)
        parts.append(f"b{level}: &m{level} {{<<: [{merged}], own{level}: {level}}}")
    return ("{" + ", ".join(parts) + "}").encode()


@st.composite
def shape_cases(draw) -> Case:
    catalog = draw(catalogs(tuple(b for b in BUILDERS if b != "jsonl")))  # JSONL cannot hold aliases
    doc = copy.deepcopy(catalog.doc)
    what = draw(st.sampled_from(["cycle", "billion laughs", "merge bomb"]))
    if what == "cycle":
        containers = [p for p in value_paths(doc) if isinstance(get(doc, p), (dict, list))]
        parent = draw(st.sampled_from([()] + containers))
        target = draw(st.sampled_from([parent[:n] for n in range(len(parent) + 1)]))
        path = parent + (add(get(doc, parent), "loop", get(doc, target)),)
        note(f"{render(path) or 'root'} refers back to {render(target) or 'the root'}")
        return Case(catalog, "object contains itself", doc=doc, kind="yaml", expect="error",
                    place=exactly(catalog, path), touched=None)
    path = draw(st.sampled_from(value_paths(doc)))
    if what == "merge bomb":  # merged copies collapse to a few keys: loading it must stay cheap
        path = catalog.tool_paths[0] + ("x-merge",)
        data, _ = splice(put(doc, path, None), path, "yaml", merge_bomb(draw(st.integers(7, 9)), 10))
        return Case(catalog, "YAML merge-key bomb", data=data, kind="yaml", place=near(catalog, path), touched=path)
    fanout = draw(st.integers(5, 10))
    bomb = laughs(fanout, math.ceil(9 / math.log10(fanout)), draw(st.booleans()))  # ≥ 10**9 leaves expanded
    return Case(catalog, "billion laughs", doc=put(doc, path, bomb), kind="yaml", expect="error",
                place=exactly(catalog, path), touched=None)


test_cycles_and_bombs = fuzz(shape_cases())


# ------------------------------------------------------------------------------------ 7. YAML tags

PYTHON_TAGS = ['!!python/object/apply:os.remove ["{sentinel}"]', "!!python/name:os.system", "!!python/module:os",
               "!!python/object:argparse.Namespace {{x: 1}}", '!!python/object/new:builtins.open ["{sentinel}", "w"]']
# every example's sentinel file in one folder, removed when the tests end (a folder per example filled /tmp)
SENTINELS = tempfile.TemporaryDirectory(prefix="toolscout-yaml-sentinels-")
NON_JSON_TAGS = ["!!binary aGVsbG8=", "!!set {{a: null, b: null}}", "!!timestamp 2001-12-14t21:59:43.10-05:00"]
HARMLESS_TAGS = ["!!omap [{{a: 1}}, {{b: 2}}]", "!!pairs [{{a: 1}}]", '!!str 12', '!!int "12"', "!!float 1.5"]


@st.composite
def tag_cases(draw) -> Case:
    catalog = draw(catalogs(tuple(b for b in BUILDERS if b != "jsonl")))
    path = draw(st.sampled_from(value_paths(catalog.doc)))
    group = draw(st.sampled_from(["python", "non-JSON", "harmless"]))
    tag = draw(st.sampled_from({"python": PYTHON_TAGS, "non-JSON": NON_JSON_TAGS, "harmless": HARMLESS_TAGS}[group]))
    handle, name = tempfile.mkstemp(dir=SENTINELS.name)
    os.close(handle)
    sentinel = Path(name)
    sentinel.write_text("keep me")
    data, offset = splice(catalog.doc, path, "yaml", tag.format(sentinel=sentinel).encode())
    line, _ = line_col(data, offset)

    def at_line(message: str, file: str | None) -> bool:
        return f"line {line}, column" in message

    def untouched() -> None:
        assert sentinel.read_text() == "keep me", "a YAML tag ran Python code"
    place = {"python": at_line, "non-JSON": either_of(at_line, exactly(catalog, path))}.get(group, near(catalog, path))
    return Case(catalog, f"YAML {group} tag", data=data, kind="yaml", expect="either" if group == "harmless" else
                "error", place=place, touched=path, after=untouched)


test_yaml_tags = fuzz(tag_cases())


# ------------------------------------------------------------------------------------ 8. bytes

BAD_UTF8 = [b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xe2\x82", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"\x80",
            b"\xc0\xaf"]


@st.composite
def encoding_cases(draw) -> Case:
    catalog = draw(catalogs())
    kind = draw(st.sampled_from(catalog.kinds))
    strings = [p for p in value_paths(catalog.doc) if isinstance(get(catalog.doc, p), str)]
    path = draw(st.sampled_from(strings))
    bad = draw(st.sampled_from(BAD_UTF8))
    data, offset = splice(catalog.doc, path, kind, b'"ab' + bad + b'cd"')
    bom = draw(st.booleans())
    if bom:
        data, offset = b"\xef\xbb\xbf" + data, offset + 3
    byte = offset + 3
    line, _ = line_col(data, byte)

    def names(message: str, file: str | None) -> bool:
        row = catalog.kinds != ("jsonl",) or message.startswith(f"{file}:{line}")
        return row and has_token(message, f"byte {byte}")
    return Case(catalog, "invalid UTF-8" + (" after a BOM" if bom else ""), data=data, kind=kind, expect="error",
                place=names)


test_invalid_utf8 = fuzz(encoding_cases())


# ------------------------------------------------------------------------------------ 9. OpenAPI $refs

SCHEMAS = ("components", "schemas")


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


@st.composite
def ref_cases(draw) -> Case:
    catalog = draw(catalogs(("openapi",)))
    doc = copy.deepcopy(catalog.doc)
    schemas = doc["components"]["schemas"]
    i = draw(st.sampled_from(range(len(catalog.ids))))
    own = f"S{i}"
    what = draw(st.sampled_from(["self", "mutual", "through array", "through allOf", "parameter loop", "missing",
                                 "pointer text", "external", "fan-out", "big target"]))
    expect, place = "ok", near(catalog, catalog.tool_paths[i])
    if what == "self":
        schemas[own] = _ref(own)
    elif what == "mutual":
        schemas[own]["properties"]["next"] = _ref("Other")
        schemas["Other"] = {"type": "object", "properties": {"back": _ref(own)}}
    elif what == "through array":
        schemas[own]["properties"]["children"] = {"type": "array", "items": _ref(own)}
    elif what == "through allOf":
        schemas[own] = {"allOf": [schemas[own], {"anyOf": [_ref(own), {"type": "null"}]}]}
    elif what == "parameter loop":
        get(doc, catalog.tool_paths[i])["parameters"].append({"$ref": "#/components/parameters/P"})
        doc["components"]["parameters"] = {"P": {"$ref": "#/components/parameters/Q"},
                                           "Q": {"$ref": "#/components/parameters/P"}}
        expect = "error"
    elif what == "missing":
        schemas[own]["properties"]["gone"] = _ref("Missing_" + draw(WORDS))
        expect = "error"
    elif what == "pointer text":
        pointer = draw(st.sampled_from(["#/paths/~1n0/post/parameters/²", "#/paths/~1n0/post/parameters/" + "9" * 5000,
                                        "#/components/schemas/%zz", "#/~2", "#", "#/"]) | st.text(max_size=12))
        schemas[own]["properties"]["odd"] = {"$ref": pointer if pointer.startswith("#") else "#" + pointer}
        expect = "either"
    elif what == "external":
        schemas[own]["properties"]["far"] = {"$ref": draw(st.sampled_from(
            ["other.yaml#/components/schemas/X", "https://example.com/schema.json", "./x.json#/Y"]))}
    elif what == "fan-out":  # 10 refs per level, 12 levels: 10**12 copies if inlined without a budget
        schemas["L0"] = {"type": "string"}
        for level in range(1, 13):
            schemas[f"L{level}"] = {"allOf": [_ref(f"L{level - 1}")] * 10}
        schemas[own]["properties"]["wide"] = _ref("L12")
    else:  # every operation inlines a 600-property schema 100 times (more nodes than the budget)
        schemas["Big"] = {"type": "object", "properties": {f"p{n}": {"type": "string"} for n in range(600)}}
        for k in range(len(catalog.ids)):
            schemas[f"S{k}"]["properties"]["big"] = {"allOf": [_ref("Big")] * 100}
    kind = draw(st.sampled_from(catalog.kinds))
    return Case(catalog, f"$ref {what}", doc=doc, kind=kind, expect=expect, place=place,
                touched=("components",) if what == "big target" else catalog.tool_paths[i])


test_openapi_refs = fuzz(ref_cases(), weight=0.5)


# ------------------------------------------------------------------------------------ 10. anything at all

def _json_containers(inner: st.SearchStrategy) -> st.SearchStrategy:
    return st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
                           _json_containers, max_leaves=25)
DATA_FORMATS = (None, "openai", "anthropic", "mcp", "openapi", "jsonl")


@st.composite
def random_cases(draw) -> Case:
    catalog = draw(catalogs())
    fmt = draw(st.sampled_from(DATA_FORMATS))
    what = draw(st.sampled_from(["random value", "random bytes", "truncated file"]))
    if what == "random value":
        return Case(catalog, what, doc=draw(JSON_VALUES), kind=draw(st.sampled_from(["json", "yaml"])), format=fmt,
                    touched=None)
    kind = draw(st.sampled_from(catalog.kinds))
    if what == "random bytes":
        data = draw(st.binary(max_size=300))
    else:
        full = dump(catalog.doc, kind)
        data = full[:draw(st.integers(0, len(full) - 1))]
    return Case(catalog, what, data=data, kind=kind, format=fmt, touched=None)


test_random_input = fuzz(random_cases())


# ------------------------------------------------------------------------------------ 11. Python callables

class Colour(enum.Enum):
    RED = "red"
    ODD = math.nan  # not a JSON value
    THING = object()


@dataclasses.dataclass
class TreeNode:  # a recursive type
    value: int
    children: list[TreeNode] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Unresolved:
    other: NoSuchType  # noqa: F821 - a hint that cannot be resolved


class Movie(typing.TypedDict):
    title: str
    sequel: Movie | None


LITERALS = st.one_of(st.integers(), st.text(max_size=6), st.booleans(), st.none(), st.floats(),
                     st.just(10**5000))
TYPE_LEAVES = st.sampled_from([str, int, float, bool, type(None), bytes, typing.Any, datetime.date, uuid.UUID, list,
                               dict, Colour, TreeNode, Unresolved, Movie, "NoSuchType", object])
def _type_forms(inner: st.SearchStrategy) -> st.SearchStrategy:
    # typing.Optional and Union, not `|`: they also take the string forward refs drawn here
    return st.one_of(
        inner.map(lambda t: list[t]), inner.map(lambda t: dict[str, t]), inner.map(lambda t: typing.Optional[t]),  # noqa: UP045
        st.tuples(inner, inner).map(lambda ab: tuple[ab]), st.tuples(inner, inner).map(lambda ab: typing.Union[ab]),  # noqa: UP007
        st.tuples(inner, st.text(max_size=12)).map(lambda a: typing.Annotated[a[0], a[1]]),
        st.lists(LITERALS, min_size=1, max_size=3).map(lambda vs: typing.Literal[tuple(vs)]))


TYPES = st.recursive(TYPE_LEAVES, _type_forms, max_leaves=6)
DEFAULTS = st.one_of(JSON_VALUES, st.sampled_from([math.nan, math.inf, 10**5000, Colour.ODD, object(), b"\xff"]),
                     st.integers(200, 5000).map(lambda depth: nested("array", depth)))
IDENTIFIERS = WORDS.filter(lambda w: not keyword.iskeyword(w))  # parameter and function names
SPACES = st.sampled_from([" ", " " * 40_000, "\t" * 40_000])  # long runs once made the regexes quadratic


@st.composite
def docstrings(draw) -> str:
    """Free text, or Google, NumPy and reST sections with odd entries and long runs of spaces."""
    gap = draw(SPACES)
    parts = [draw(st.text(max_size=30)), f"Summary{gap}line:{gap}x"]
    for name in draw(st.lists(WORDS, max_size=2)):
        parts += [draw(st.sampled_from([f"Args:\n    {name}{gap}(int):{gap}text",
                                        f"Parameters\n----------\n{name}{gap}: int\n    text", f":param {name}:{gap}text",
                                        f"Returns:\n    bool:{gap}x", f"Examples:\n    >>> {name}()"]))]
    return "\n\n".join(draw(st.permutations(parts)))


def make_callable(name: str, params: list[tuple[str, Any, Any]], returns: Any, doc: str, wrap: str) -> Any:
    """A callable whose signature, hints and docstring are as drawn; `wrap`: how it is handed over."""
    def fn(*args, **kwargs):
        return None
    empty = inspect.Parameter.empty
    fn.__signature__ = inspect.Signature(
        [inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY, annotation=t, default=d) for p, t, d in params],
        return_annotation=returns)
    fn.__annotations__ = {p: t for p, t, _ in params if t is not empty} | {"return": returns}
    fn.__name__, fn.__doc__ = name, doc
    if wrap == "partial":
        return functools.partial(fn)
    if wrap == "object":  # a callable object: its class's __call__ is read
        kind = type(name.replace("\x00", "") or "Anon", (), {"__call__": lambda self, *a, **k: None, "__doc__": doc})
        kind.__call__.__signature__ = inspect.Signature([inspect.Parameter("self", inspect.Parameter.POSITIONAL_ONLY)]
                                                        + list(fn.__signature__.parameters.values()))
        return kind()
    return fn


@st.composite
def python_callables(draw) -> Catalog:
    items, names = [], []
    for i, name in enumerate(draw(st.lists(WORDS | st.text(max_size=8), min_size=1, max_size=3, unique=True))):
        params = [(p, draw(TYPES | st.just(inspect.Parameter.empty)),
                   draw(DEFAULTS | st.just(inspect.Parameter.empty))) for p in draw(st.lists(IDENTIFIERS, max_size=3,
                                                                                              unique=True))]
        wrap = draw(st.sampled_from(["function", "partial", "object"]))
        items.append(make_callable(name, params, draw(TYPES), draw(docstrings()), wrap))
        names.append(name)
    junk = draw(st.sampled_from([[], [len], [lambda x: x], [42], ["text"], [None]]))  # odd list members
    items += junk
    return Catalog("python", items, [(i,) for i in range(len(items))], names, names, [], kinds=("py",))


def module_source(draw) -> str:
    """A module of functions whose hints, defaults and docstrings are written as source text."""
    lines = [draw(st.sampled_from(["", "from __future__ import annotations"]))]
    for name in draw(st.lists(IDENTIFIERS, min_size=1, max_size=3, unique=True)):
        hint = draw(st.sampled_from(["int", "list[dict[str, int]]", "NoSuchType", "'NoSuchType'",
                                     "list[" * 150 + "int" + "]" * 150, "typing.Literal[float('nan')]"]))
        default = draw(st.sampled_from(["1", "float('nan')", "10**5000", "[" * 150 + "]" * 150, "{1, 2}",
                                        "object()"]))
        lines += [f"def {name}(x: {hint} = {default}) -> None:", f"    {draw(docstrings())!r}"]
    tail = draw(st.sampled_from(["", "raise SystemExit(3)", "raise ValueError('boom')", "TOOLS = 5",
                                 "TOOLS = [1, 'x']", "def broken(:", "import sys; sys.exit(0)"]))
    return "\n".join(["import typing", *lines, tail]) + "\n"


@st.composite
def python_cases(draw) -> Case:
    catalog = draw(python_callables())
    if draw(st.booleans()):
        return Case(catalog, "Python callables", doc=catalog.doc, kind="py", touched=None,
                    place=lambda message, file: re.search(r"\[\d+\]", message) is not None)
    source = module_source(draw)
    data = source.encode()
    if draw(st.booleans()):  # truncated or garbled: a syntax error at worst
        data = data[:draw(st.integers(0, len(data)))] + draw(st.binary(max_size=4))
    event("Python module " + ("(garbled)" if data != source.encode() else "(whole)"))
    return Case(catalog, "Python module file", data=data, kind="py", touched=None)


test_python_callables = fuzz(python_cases())


# ------------------------------------------------------------------------------------ 12. under OS limits

CHILD = """
import sys
from toolscout.errors import CatalogError
from toolscout.ingest import load_tools
for path in sys.argv[1:]:
    try:
        print("loaded", len(load_tools(path)), flush=True)
    except CatalogError as exc:
        print("CatalogError", str(exc)[:300].replace("\\n", " "), flush=True)
"""
OS_MEMORY_LIMIT = 1 << 30  # address space of the child process


def test_worst_inputs_stay_within_os_limits(tmp_path):
    """The worst fixed inputs, read in a child process under an address-space limit and a timeout: the
    C parts (libyaml, the JSON scanner) and a stack overflow are outside what tracemalloc sees, and a
    segfault would take the test run with it. Each must end in a CatalogError naming its file and place
    (or, for the merge-key bomb, load)."""
    tool = {"type": "function", "function": {"name": "a", "parameters": {"type": "object", "properties": {}}}}
    files = {  # name: (text, what the child must print after "CatalogError PATH"; None: it loads one tool)
        "deep.json": ('{"tools": [' + "[" * 1_000_000 + "]" * 1_000_000 + "]}",
                      r": line 1, column 138: nested deeper than 128 levels"),  # the bracket opening level 129
        "deep.yaml": ("tools: " + "[" * 1_000_000 + "]" * 1_000_000 + "\n",
                      r": line 1, column \d+: nested deeper than 128 levels"),
        "deep.jsonl": ('{"id": "a", "name": "a", "parameters": ' + '{"a": ' * 500_000 + "1" + "}" * 500_000 + "}\n",
                       r":1: nested deeper than 128 levels \(column \d+\)"),
        "laughs.yaml": (yaml.dump({"tools": [dict(tool, lol=laughs(10, 12, False))]}, Dumper=DUMPER),
                        r": tools\[0\]\.lol(\[\d+\])+: repeated values"),
        "merge.yaml": ("tools: [{type: function, function: {name: a}, x: " + merge_bomb(12, 10).decode() + "}]\n",
                       None),  # the merged copies collapse: it loads
        "cycle.yaml": ("tools: &a [*a]\n", r": tools\[0\]: this value contains itself"),
    }
    for name, (text, _) in files.items():
        (tmp_path / name).write_text(text)
    paths = [str(tmp_path / name) for name in files]
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(toolscout.__file__).parents[1])}

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (OS_MEMORY_LIMIT, OS_MEMORY_LIMIT))
    run = subprocess.run([sys.executable, "-c", CHILD, *paths], capture_output=True, text=True, timeout=120,
                         env=env, preexec_fn=limit, check=False)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    assert len(lines) == len(paths), run.stdout + run.stderr[-2000:]
    for path, (_, expected), line in zip(paths, files.values(), lines):
        if expected is None:
            assert line == "loaded 1", line
        else:
            assert re.match("CatalogError " + re.escape(path) + expected, line), line


# ------------------------------------------------------------------------------------ 13. regressions

def _laughs_yaml(levels: int) -> str:
    lines = ["    x0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lines += [f"    x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, levels + 1)]
    return _YAML_TOOL + "\n".join(lines) + "\n"


def _cycle() -> dict:
    parameters: dict = {"type": "object", "properties": {}}
    parameters["properties"]["x"] = parameters
    return {"tools": [{"type": "function", "function": {"name": "a", "parameters": parameters}}]}


_JSON_TOOL = '{"tools": [{"type": "function", "function": {"name": "a", "parameters": %s}}]}'
_YAML_TOOL = "tools:\n- type: function\n  function:\n    name: a\n"
_NOT_JSON = "is not JSON (YAML tags such as !!binary, !!set and !!timestamp make them); write it as plain data: a " \
            "string, number, list or object"
_DEEP = "nested deeper than 128 levels"
_ITSELF = ("this value contains itself (a recursive YAML alias, or an object that holds itself); a catalog must be a "
           "tree: write the repeated part out, or use a $ref")
_FLATTEN = "flatten the schema (real tool schemas are far shallower)"
_SPEC = {"openapi": "3.0.0"}
# Each input once broke a reader (the comment says how); now: the exact message after the source's name.
REGRESSIONS: dict[str, tuple[str, Any, str]] = {
    # RecursionError from json.loads
    "JSON nested 10,000 deep": (".json", '{"tools": [' + "[" * 10_000 + "]" * 10_000 + "]}",
                                f": line 1, column 138: {_DEEP}; {_FLATTEN}"),
    # ValueError: Exceeds the limit (4300 digits) for integer string conversion
    "JSON 5,000-digit integer": (".json", '{"tools": [\n {"id": ' + "9" * 5000 + "}]}",
                                 ": line 2, column 9: a number with more than 4300 digits; write it as a string"),
    # loaded; the tool then could not be written as JSON (NaN, and 1e999 read as inf)
    "JSON NaN": (".json", _JSON_TOOL % '{"type": "object", "properties": {"x": {"default": NaN}}}',
                 (": tools[0].function.parameters.properties.x.default: nan is not a JSON number; write a finite "
                  "number, or a string")),
    "JSON 1e999": (".json", _JSON_TOOL % '{"type": "object", "properties": {"x": {"maximum": 1e999}}}',
                   (": tools[0].function.parameters.properties.x.maximum: inf is not a JSON number; write a finite "
                    "number, or a string")),
    # RecursionError in the YAML composer
    "YAML nested 10,000 deep": (".yaml", "tools: " + "[" * 10_000 + "]" * 10_000 + "\n",
                                f": line 1, column 135: {_DEEP}; {_FLATTEN}"),
    # libyaml >= 0.2.5 (PyYAML 6.0.4's wheels) stops at 1,000 levels while it scans ahead over brackets that
    # may open a key; the place named must still be level 129's, counted in characters after multi-byte ones
    "YAML nested 10,000 deep after non-ASCII": (".yaml", "x: 'üü€😀'\ntools: " + "[" * 10_000 + "]" * 10_000,
                                                f": line 2, column 135: {_DEEP}; {_FLATTEN}"),
    # ValueError from int()
    "YAML 5,000-digit integer": (".yaml", _YAML_TOOL + "    x: " + "9" * 5000 + "\n",
                                 ": line 5, column 8: a number with more than 4300 digits; write it as a string"),
    # loaded; writing the tool raised ValueError: Circular reference detected
    "YAML recursive alias": (".yaml", _YAML_TOOL + "    parameters: &p {type: object, properties: {x: *p}}\n",
                             f": tools[0].function.parameters.properties.x: {_ITSELF}"),
    # loaded 10**9 shared leaves; writing the tool took minutes and gigabytes
    "YAML billion laughs": (".yaml", _laughs_yaml(8),
                            (": tools[0].function.x6[2]: repeated values (YAML aliases, or objects used twice) expand "
                             "this catalog by more than 50 MB; write the catalog without alias chains")),
    # loaded bytes, sets and datetimes; writing the tool raised TypeError: ... is not JSON serializable
    "YAML !!binary": (".yaml", _YAML_TOOL + "    parameters: {type: object, default: !!binary aGVsbG8=}\n",
                      f": tools[0].function.parameters.default: a bytes value {_NOT_JSON}"),
    "YAML !!set": (".yaml", _YAML_TOOL + "    parameters: {type: object, properties: !!set {a: null}}\n",
                   f": tools[0].function.parameters.properties: a set value {_NOT_JSON}"),
    "YAML !!timestamp": (".yaml", _YAML_TOOL + "    parameters: {type: object, default: !!timestamp 2001-12-14}\n",
                         f": tools[0].function.parameters.default: a date value {_NOT_JSON}"),
    # UnicodeDecodeError
    "JSONL invalid UTF-8": (".jsonl", b'{"id": "a", "name": "a"}\n{"id": "b", "name": "b\xff"}\n',
                            ":2: not UTF-8 text (byte 47); save the catalog as UTF-8"),
    # RecursionError
    "JSONL nested 10,000 deep": (".jsonl", '{"id": "a", "name": "a", "parameters": ' + '{"a": ' * 10_000 + "1"
                                 + "}" * 10_000 + "}\n", f":1: {_DEEP} (column 802); {_FLATTEN}"),
    # TypeError in tool_from_row (tuple(5)); a profile that is not an object was kept (Tool.profile is a mapping)
    "JSONL tags 5": (".jsonl", '{"id": "a", "name": "a", "tags": 5}\n',
                     ":1: field 'tags' must be a string or a list or null, got integer"),
    "JSONL usage 5": (".jsonl", '{"id": "a", "name": "a", "usage": 5}\n',
                      ":1: field 'usage' must be a list or null, got integer"),
    "JSONL profile [1]": (".jsonl", '{"id": "a", "name": "a", "profile": [1]}\n',
                          ":1: field 'profile' must be an object or null, got array"),
    # TypeError: 'int' object is not iterable (the same for a media type's schema)
    "OpenAPI tags 5": ("memory", {**_SPEC, "paths": {"/a": {"get": {"operationId": "a", "tags": 5}}}},
                       ": paths./a.get.tags: field 'tags' must be a list, got integer"),
    "OpenAPI media schema 5": ("memory", {**_SPEC, "paths": {"/a": {"get": {"operationId": "a", "parameters": [
        {"name": "q", "in": "query", "content": {"application/json": {"schema": 5}}}]}}}},
        ": paths./a.get.parameters[0].content: a media type's schema must be an object, got integer"),
    # ValueError: invalid literal for int() ('²' is a digit to str.isdigit; 5,000 digits: ValueError too)
    "OpenAPI $ref index ²": ("memory", {**_SPEC, "paths": {"/a": {"get": {"operationId": "a", "parameters": [
        {"$ref": "#/paths/~1a/get/parameters/²"}]}}}},
        (": paths./a.get.parameters[0].$ref: broken $ref '#/paths/~1a/get/parameters/²': this spec has no "
         "'#/paths//a/get/parameters/²'; fix the reference or add the missing definition")),
    # TypeError: unhashable type: 'list' (format detection)
    "detected type [[x]]": ("memory", {"tools": [{"type": [["x"]]}]},
                            (": cannot tell which tool format this is: no tool object looks like OpenAI, Anthropic, "
                             "MCP, OpenAPI, Python callables or benchmark JSONL rows; pass format= one of openai, "
                             "anthropic, mcp, openapi, python, jsonl (CLI: --format NAME)")),
    # loaded; writing the tool raised ValueError: Circular reference detected
    "object that holds itself": ("memory", _cycle, f": tools[0].function.parameters.properties.x: {_ITSELF}"),
    # loaded; writing the tool as UTF-8 (the serving journal) raised UnicodeEncodeError
    "JSON lone surrogate": (".json", _JSON_TOOL % '{"type": "object", "description": "a\\ud800"}',
                            (": tools[0].function.parameters.description: a lone surrogate (\\ud800 to \\udfff) is "
                             "not a Unicode character; write the character itself, or leave it out")),
    # loaded; the tool then could not be written as JSON
    "key inf": ("memory", {"tools": [{"type": "function", "function": {"name": "a", "parameters": {
        "type": "object", "properties": {math.inf: {}}}}}]},
        (": tools[0].function.parameters.properties: key inf is a float, not a string; object keys must be strings "
         "(or numbers, true, false, null)")),
}


@pytest.mark.parametrize("name", list(REGRESSIONS))
def test_regression_message(name, tmp_path):
    suffix, data, expected = REGRESSIONS[name]
    if suffix == "memory":
        source = "catalog"
        read = lambda: parse_tools(data() if callable(data) else data, source=source)
    else:
        path = tmp_path / f"catalog{suffix}"
        path.write_bytes(data if isinstance(data, bytes) else data.encode())
        source, read = str(path), lambda: load_tools(path)
    with pytest.raises(CatalogError) as info:
        read()
    assert str(info.value) == source + expected


def _body(schema: dict) -> dict:
    return {**_SPEC, "paths": {"/a": {"post": {"operationId": "a", "requestBody": {
        "required": True, "content": {"application/json": {"schema": schema}}}}}}}


@pytest.mark.parametrize("required", [[{"x": 1}], 5])
def test_regression_openapi_required_that_is_no_list_of_names_is_left_out(required):
    # TypeError: unhashable type: 'dict' / 'int' object is not iterable
    [tool] = parse_tools(_body({"type": "object", "properties": {"x": {}}, "required": required}))
    assert tool.parameters == {"type": "object", "properties": {"x": {}}}


def test_regression_openapi_number_keys_are_kept():
    # AttributeError: 'int' object has no attribute 'startswith' (the x-* filter)
    [tool] = parse_tools(_body({"type": "object", "properties": {"x": {1: 2, "x-internal": 1}}}))
    assert tool.parameters == {"type": "object", "properties": {"x": {1: 2}}}


def test_regression_huge_values_are_cut_in_messages():
    # the whole value was repeated in the message (megabytes), or repr() recursed through it
    spec = {**_SPEC, "paths": {"/a": {"get": {"operationId": "a", "parameters": [
        {"$ref": "#/paths/~1a/get/parameters/" + "9" * 5000}]}}}}
    for catalog in ({"openapi": "9" + "x" * 1_000_000, "paths": {}}, spec):
        with pytest.raises(CatalogError) as info:
            parse_tools(catalog, source="catalog")
        assert len(str(info.value)) < 600, str(info.value)[:600]
    assert str(info.value).startswith("catalog: paths./a.get.parameters[0].$ref: broken $ref '#/paths/~1a/get/para")


def test_regression_openapi_refs_stop_at_the_node_budget():
    # each operation copied a 600-property schema 100 times (60,000 objects, ~4 MB per tool)
    spec = _body({"allOf": [{"$ref": "#/components/schemas/Big"}] * 100})
    spec["components"] = {"schemas": {"Big": {"type": "object", "properties": {f"p{n}": {} for n in range(600)}}}}
    [tool] = parse_tools(spec)
    copies = tool.parameters["properties"]["body"]["allOf"]
    assert sum("properties" in c for c in copies) == 9  # 9 × 601 objects: the first past 5,000
    assert copies[-1] == {"type": "object", "title": "Big", "$comment": "reference not expanded (size limit): "
                                                                          "#/components/schemas/Big"}


def test_regression_python_values_that_are_not_json_are_left_out():
    # NaN and Literal[nan] went into the schema (not JSON); a 5,000-deep default raised RecursionError
    deep: list = []
    for _ in range(5000):
        deep = [deep]

    def f(x: int = math.nan, y: typing.Literal[math.nan, 1] = 1, z: list = deep, c: Colour = Colour.RED):
        pass
    [tool] = parse_tools([f], source="catalog")
    assert tool.parameters == {"type": "object", "properties": {
        "x": {"type": "integer"}, "y": {"type": "integer", "enum": [1], "default": 1}, "z": {"type": "array"},
        "c": {"type": "string", "enum": ["red"], "default": "red"}}}


def test_regression_python_class_with_unresolvable_hints():
    # NameError: name 'NoSuchType' is not defined
    def f(u: Unresolved):
        pass
    [tool] = parse_tools([f], source="catalog")
    assert tool.parameters["properties"]["u"] == {"type": "object", "title": "Unresolved",
                                                  "properties": {"other": {}}, "required": ["other"]}


def test_regression_python_hint_nested_3000_deep():
    # RecursionError in type_schema
    def f(x):
        pass
    hint: Any = int
    for _ in range(3000):
        hint = list[hint]
    f.__annotations__ = {"x": hint}
    with pytest.raises(CatalogError) as info:
        parse_tools([f], source="catalog")
    assert str(info.value) == ("catalog: [0] (f).parameters.properties.x: type hint nested deeper than 128 levels; "
                               "a tool's argument types are far shallower")


def test_regression_python_docstring_with_long_runs_of_spaces():
    # the section regexes backtracked quadratically: 200,000 spaces took hours
    def f(x: int):
        pass
    f.__doc__ = "Summary" + " " * 200_000 + "line.\n\nArgs:\n    x" + " " * 200_000 + "(int): the x\n"
    start = time.perf_counter()
    [tool] = parse_tools([f], source="catalog")
    assert time.perf_counter() - start < 2
    assert tool.parameters["properties"]["x"] == {"type": "integer", "description": "the x"}


def test_regression_python_module_that_exits(tmp_path):
    # SystemExit ended the caller's process
    path = tmp_path / "tools.py"
    path.write_text("import sys\nsys.exit(3)\n")
    with pytest.raises(CatalogError) as info:
        load_tools(path)
    assert str(info.value) == f"{path}: running the module failed (SystemExit: 3)"


def test_regression_empty_path():
    # Path("") is the current folder: read as a benchmark folder, with a message naming no source
    with pytest.raises(CatalogError) as info:
        load_tools("")
    assert str(info.value) == "'': the catalog's path or name is empty"
