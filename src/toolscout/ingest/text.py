"""Catalog bytes to text, and JSON text to objects, with the place of any problem.

- `decode`: UTF-8, with or without a BOM; invalid bytes raise CatalogError naming the line and the byte
  offset in the file (counted with the BOM, so a hex editor finds it).
- `parse_json` (a whole file: line and column) and `parse_json_line` (one JSONL line: its column):
  `json.loads`, except that every problem is a CatalogError naming its place: syntax, and what Python's
  reader cannot take beyond syntax (nesting that exhausts its recursion, integers longer than Python
  converts), and keys named twice in one object (the reader would keep the last silently). The wording of
  each kind of problem lives here only.
"""

from __future__ import annotations

import codecs
import json
import re
from typing import Any

from ..errors import CatalogError, DuplicateKey
from .guard import DEPTH_HINT, MAX_DEPTH, MAX_INT_DIGITS

# A JSON string (unrolled loop: no catastrophic backtracking) or a bracket; used only to locate problems.
_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')
_KEY_OR_BRACKET = re.compile(r'("[^"\\]*(?:\\.[^"\\]*)*")(\s*:)?|[\[\]{}]')
_NEWLINE = b"\n"
# Duplicate keys are refused rather than read as JSON and YAML readers do (the last one wins): in a catalog
# they are a mistake, usually of hand-merged specs, and what the first one held would be lost without a word.
DUPLICATE_HINT = "a key may appear once in an object: merge the two entries"
_STRING_OR_LONG_NUMBER = re.compile(rf'"[^"\\]*(?:\\.[^"\\]*)*"|\d{{{MAX_INT_DIGITS + 1},}}')


class _Problem(Exception):
    """JSON text that cannot be read: `problem`, `hint`, and the `index` of the character at fault."""

    def __init__(self, problem: str, hint: str, index: int, syntax: json.JSONDecodeError | None = None,
                 kind: type[CatalogError] = CatalogError):
        super().__init__(problem)
        self.problem, self.hint, self.index, self.syntax, self.kind = problem, hint, index, syntax, kind


def decode(data: bytes, source: str, offset: int | None = None) -> str:
    """`data` as text: a whole file, or one line of a JSONL file that starts at byte `offset`."""
    skip = len(codecs.BOM_UTF8) if not offset and data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = skip + exc.start
        line = f"line {data.count(_NEWLINE, 0, bad) + 1}: " if offset is None else ""
        raise CatalogError(f"{source}: {line}not UTF-8 text (byte {(offset or 0) + bad}); save the catalog as "
                           "UTF-8") from None


def parse_json(text: str, source: str, unique: bool = True) -> Any:
    """The JSON file `text`; a problem raises CatalogError with its line and column (DuplicateKey for a key
    named twice; `unique=False` keeps the last instead, as JSON readers do)."""
    try:
        return _loads(text, unique)
    except _Problem as exc:
        line, column = _line_and_column(text, exc.index)
        raise exc.kind(f"{source}: line {line}, column {column}: {exc.problem}; {exc.hint}") from None


def parse_json_line(text: str, where: str) -> Any:
    """One JSONL line (`where`: "file:line"); a problem raises CatalogError with its column."""
    try:
        return _loads(text)
    except _Problem as exc:
        if exc.syntax is not None:  # worded as `benchmark.read_jsonl` words it
            raise CatalogError(f"{where}: invalid JSON ({exc.syntax.msg} at column {exc.syntax.colno})") from None
        raise CatalogError(f"{where}: {exc.problem} (column {exc.index + 1}); {exc.hint}") from None


def _loads(text: str, unique: bool = True) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_unique_keys if unique else None)
    except _DuplicateKey:
        key, index, first = _first_duplicate(text)
        line, column = _line_and_column(text, first)
        raise _Problem(f"duplicate key {key!r} (first at line {line}, column {column})", DUPLICATE_HINT,
                       index, kind=DuplicateKey) from None
    except json.JSONDecodeError as exc:
        raise _Problem(f"invalid JSON ({exc.msg})", "fix the syntax there", exc.pos, exc) from None
    except RecursionError:
        raise _Problem(f"nested deeper than {MAX_DEPTH} levels", DEPTH_HINT, _too_deep_at(text)) from None
    except ValueError:  # Python refuses to turn an integer of more than 4,300 digits into an int
        at = next((m.start() for m in _STRING_OR_LONG_NUMBER.finditer(text) if m.group()[0] != '"'), 0)
        raise _Problem(f"a number with more than {MAX_INT_DIGITS} digits", "write it as a string", at) from None


class _DuplicateKey(Exception):
    """An object that names a key twice (found by the reader; `_first_duplicate` then finds where)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):  # json.loads would keep the last value silently
        raise _DuplicateKey
    return obj


def _first_duplicate(text: str) -> tuple[str, int, int]:
    """(key, index of its second mention, index of its first) for the first key an object names twice."""
    open_objects: list[dict[str, int] | None] = []  # per open bracket: the keys seen ({}), or None ([])
    for token in _KEY_OR_BRACKET.finditer(text):
        if token.group(1) is None:  # a bracket
            if token.group() in "{[":
                open_objects.append({} if token.group() == "{" else None)
            elif open_objects:
                open_objects.pop()
        elif token.group(2) and open_objects and open_objects[-1] is not None:  # a string before ':' is a key
            key, seen = json.loads(token.group(1)), open_objects[-1]
            if key in seen:
                return key, token.start(), seen[key]
            seen[key] = token.start()
    return "?", 0, 0  # not reached: the reader found one


def _too_deep_at(text: str) -> int:
    """The index of the first bracket that opens level MAX_DEPTH + 1."""
    depth = 0
    for token in _STRING_OR_BRACKET.finditer(text):
        char = token.group()
        if char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return token.start()
        elif char in "]}":
            depth -= 1
    return 0


def _line_and_column(text: str, index: int) -> tuple[int, int]:
    """1-based line and column of `text[index]`."""
    return text.count("\n", 0, index) + 1, index - (text.rfind("\n", 0, index) + 1) + 1
