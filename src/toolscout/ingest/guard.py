"""Limits on the shape of a catalog object, checked once before any parser walks it.

A catalog comes from a file or a request, so it may be hostile. Before the parsers (and later the
retrievers, the index writer and the servers) walk it with ordinary recursive code, one pass checks that
it is a finite tree of JSON data within bounds (the pass recurses too, but checks the depth before each
step down, so it never goes deeper than MAX_DEPTH):

- nesting: at most MAX_DEPTH containers deep (real tool schemas are a few dozen at most);
- repetition: a container or long string reached a second time (a YAML alias, or a Python object used
  twice) counts again at its full size, as every writer will expand it; repeats may add at most
  MAX_REPEATED_SIZE, which stops "billion laughs" alias bombs in linear time;
- no container inside itself (a recursive YAML alias, or a Python object that holds itself);
- keys are JSON-like scalars (str, int, finite float, bool, None), numbers are finite (no NaN or
  Infinity; with `non_finite_ok`, for a lenient load, such a number is let through here and the tool
  that holds one is skipped instead, `common.collect`; one outside every tool still refuses it), integers fit in JSON writers (at most MAX_INT_DIGITS digits), text holds no lone
  surrogates (JSON's "\ud800" escape makes one; no UTF-8 writer, journal or database can store it);
- with `json_only` (data read from files), values are JSON types only: YAML tags such as `!!binary`,
  `!!set` or `!!timestamp` build Python objects that no writer can store.

A violation raises `CatalogError` naming the source and the key path (`tools[3].function.parameters...`).
The same bounds hold for schemas toolscout builds itself (from Python type hints, `python.py`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ..errors import SURROGATE_HINT, SURROGATE_PROBLEM, CatalogError, holds_lone_surrogate
from .common import at, brief

DEPTH_HINT = "flatten the schema (real tool schemas are far shallower)"

MAX_DEPTH = 128
MAX_REPEATED_SIZE = 50_000_000  # about the bytes the repeats add once written as JSON
MAX_INT_DIGITS = 4300  # Python's own limit for turning an int into text (sys.get_int_max_str_digits)
_INT_LIMIT = 10**MAX_INT_DIGITS
_SHOWN_KEYS = 16  # a longer path is shown with its middle left out
_KEY_TYPES = (str, int, float, bool, type(None))
_JSON_SCALARS = (str, int, float, bool, type(None))
_LONG_STRING = 64  # strings at least this long count as repeats when reached twice
_NO_KEY = object()


class _Walk:
    """One pass over a catalog object. Recursive: the depth limit bounds the recursion itself."""

    def __init__(self, source: str, json_only: bool, position: str, non_finite_ok: bool = False):
        self.source, self.json_only, self.position = source, json_only, position
        self.non_finite_ok = non_finite_ok
        self.non_finite: list[tuple[str, str]] = []  # (position, message) of each one let through
        self.keys: list[Any] = []  # the path to the container being walked
        self.open_ids: set[int] = set()  # containers on that path
        self.done: dict[int, tuple[int, int]] = {}  # id → (size, height) of finished containers
        self.long_strings: set[int] = set()
        self.repeated = 0

    def fail(self, problem: str, hint: str, key: Any = _NO_KEY) -> CatalogError:
        where = _path(self.position, self.keys + ([] if key is _NO_KEY else [key]))
        return CatalogError(f"{self.source}: {where + ': ' if where else ''}{problem}; {hint}")

    def container(self, node: Any) -> tuple[int, int]:
        """(size as JSON, about in bytes; containers below on the deepest branch) of one container."""
        self.open_ids.add(id(node))
        size, height = 2, 0
        for key, child in node.items() if type(node) is dict or isinstance(node, Mapping) else enumerate(node):
            if type(key) is str:
                size += len(key) + 4
                if holds_lone_surrogate(key):  # not in the path: it could not be printed
                    raise self.fail(f"key {brief(key)} holds a lone surrogate, not a Unicode character", SURROGATE_HINT)
            elif isinstance(key, _KEY_TYPES) and not (isinstance(key, float) and not math.isfinite(key)):
                size += 8
            else:
                raise self.fail(f"key {brief(key)} is a {type(key).__name__}, not a string",
                                "object keys must be strings (or numbers, true, false, null)")
            if type(child) is str and len(child) < _LONG_STRING and child.isascii():  # the common case, kept fast
                size += len(child) + 2
            elif _is_container(child):
                child_size, child_height = self.child(key, child)
                size, height = size + child_size, max(height, child_height + 1)
            else:
                size += self.leaf(key, child)
        self.open_ids.discard(id(node))
        self.done[id(node)] = (size, height)
        return size, height

    def child(self, key: Any, child: Any) -> tuple[int, int]:
        depth = len(self.keys) + 2  # the root container is level 1
        known = self.done.get(id(child))
        if known is not None:  # a repeat: it counts again at its full size
            if depth + known[1] > MAX_DEPTH:
                raise self.fail(f"nested deeper than {MAX_DEPTH} levels once aliases are expanded", DEPTH_HINT, key)
            self.repeat(key, known[0])
            return known
        if id(child) in self.open_ids:
            raise self.fail("this value contains itself (a recursive YAML alias, or an object that holds itself)",
                            "a catalog must be a tree: write the repeated part out, or use a $ref", key)
        if depth > MAX_DEPTH:
            raise self.fail(f"nested deeper than {MAX_DEPTH} levels", DEPTH_HINT, key)
        self.keys.append(key)
        found = self.container(child)
        self.keys.pop()
        return found

    def repeat(self, key: Any, size: int) -> None:
        self.repeated += size
        if self.repeated > MAX_REPEATED_SIZE:
            raise self.fail(f"repeated values (YAML aliases, or objects used twice) expand this catalog by more "
                            f"than {MAX_REPEATED_SIZE // 1_000_000} MB", "write the catalog without alias chains", key)

    def leaf(self, key: Any, value: Any) -> int:
        """Check one scalar; returns its size as JSON, about in bytes."""
        if isinstance(value, str):
            if holds_lone_surrogate(value):
                raise self.fail(SURROGATE_PROBLEM, SURROGATE_HINT, key)
            if len(value) >= _LONG_STRING:
                if id(value) in self.long_strings:
                    self.repeat(key, len(value))
                self.long_strings.add(id(value))
            return len(value) + 2
        if isinstance(value, float) and not math.isfinite(value):
            problem = self.fail(f"{value} is not a JSON number", "write a finite number, or a string", key)
            if not self.non_finite_ok:
                raise problem
            self.non_finite.append((_path(self.position, self.keys + ([] if key is _NO_KEY else [key])), str(problem)))
        if isinstance(value, int) and not -_INT_LIMIT < value < _INT_LIMIT:
            raise self.fail(f"a number with more than {MAX_INT_DIGITS} digits", "write it as a string", key)
        if self.json_only and not isinstance(value, _JSON_SCALARS):
            raise self.fail(f"a {type(value).__name__} value is not JSON (YAML tags such as !!binary, !!set and "
                            "!!timestamp make them)", "write it as plain data: a string, number, list or object", key)
        return 8


def _path(position: str, keys: list) -> str:
    """`position` extended by `keys`; a long path is shown with its middle left out."""
    if len(keys) > _SHOWN_KEYS:
        left_out = len(keys) - _SHOWN_KEYS + 2
        head = at(_path(position, keys[:_SHOWN_KEYS - 2]), f"…({left_out} more levels)…")
        return _path(head, keys[-2:])
    out = position
    for key in keys:
        out = at(out, key)
    return out


def check_tree(obj: Any, source: str, json_only: bool = False, position: str = "",
               non_finite_ok: bool = False) -> list[tuple[str, str]]:
    """Raise CatalogError unless `obj` is a finite, bounded tree of JSON-like data (see the module doc);
    `position`: where `obj` itself is, when it is part of a larger catalog. `non_finite_ok`: NaN and
    Infinity pass, and are returned as (position, the message that refuses them): a lenient load leaves
    out the tool that holds one (`common.collect`)."""
    walk = _Walk(source, json_only, position, non_finite_ok)
    if _is_container(obj):
        walk.container(obj)
    else:
        walk.leaf(_NO_KEY, obj)
    return walk.non_finite


def _is_container(value: Any) -> bool:
    return type(value) in (dict, list) or isinstance(value, (tuple, Mapping))
