"""YAML catalogs, read safely and fast.

One loader, `CatalogLoader`: libyaml's C parser when PyYAML has it (megabytes in milliseconds; the pure
Python parser takes seconds per megabyte), PyYAML's own composer and SafeConstructor on top. Safe means:

- only plain data: SafeConstructor refuses `!!python/...` tags, so no code runs while reading;
- dates stay strings: a schema's `default: 2024-01-01` must stay JSON;
- booleans and numbers are YAML 1.2's (what OpenAPI 3.1 and JSON Schema data are): only true/false (True,
  TRUE...) are booleans, so YAML 1.1's yes/no/on/off/y/n stay strings (`operationId: NO` is the name NO and
  `enum: [yes, no]` keeps its two words); `12:30`, `0b11` and `1_000` are strings and `010` is ten;
- nesting is bounded (`guard.MAX_DEPTH`): the composer is recursive Python, and libyaml's own composer
  is recursive C that crashes the process on a few hundred thousand levels, so it is not used. Newer
  libyaml builds (PyYAML 6.0.4's wheels) stop at 1,000 levels of their own while scanning ahead, before
  the composer sees a node; the text before that point is then composed alone, so that the error still
  names where level MAX_DEPTH + 1 opens, whichever PyYAML is installed;
- merge keys (`<<`) keep one entry per key as they merge, so chained merges cannot grow exponentially
  (a "merge-key bomb"); what the mapping means is unchanged;
- integers longer than Python converts are an error with their line, not a bare ValueError;
- a key written twice in one mapping is an error with both lines (PyYAML would keep the last silently).

`load` turns every problem into a CatalogError with its line and column. Alias bombs ("billion laughs") build a small, shared object here; `guard.check_tree` measures and stops
them afterwards.
"""

from __future__ import annotations

import re
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.constructor import SafeConstructor
from yaml.nodes import ScalarNode
from yaml.resolver import Resolver

from ..errors import CatalogError, DuplicateKey
from .guard import DEPTH_HINT, MAX_DEPTH, MAX_INT_DIGITS
from .text import DUPLICATE_HINT

try:
    from yaml._yaml import CParser

    _PARSER: tuple[type, ...] = (CParser,)
except ImportError:  # PyYAML built without libyaml
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    _PARSER = (Reader, Scanner, Parser)
_LIBYAML_NESTING_CAP = "maximum nesting depth"  # in the problem libyaml >= 0.2.5 reports at its own cap
_TOO_DEEP = f"nested deeper than {MAX_DEPTH} levels; {DEPTH_HINT}"
_MERGE_TAG = "tag:yaml.org,2002:merge"


class BeyondLimit(yaml.MarkedYAMLError):
    """YAML within the syntax but not what a catalog may hold (`problem` says what), at `problem_mark`."""


class _NamedTwice(BeyondLimit):
    """A key written twice in one mapping (`DuplicateKey` to the caller)."""


class CatalogLoader(Composer, *_PARSER, SafeConstructor, Resolver):  # type: ignore[misc]
    def __init__(self, stream: str):
        _PARSER[0].__init__(self, stream)
        for base in _PARSER[1:]:
            base.__init__(self)
        Composer.__init__(self)
        SafeConstructor.__init__(self)
        Resolver.__init__(self)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise BeyondLimit(None, None, _TOO_DEEP, self.peek_event().start_mark)
            return Composer.compose_node(self, parent, index)
        finally:
            self._depth -= 1

    def flatten_mapping(self, node: Any) -> None:
        _refuse_duplicate_keys(node)  # before merging: merged keys may be overridden, written ones not
        SafeConstructor.flatten_mapping(self, node)
        node.value = _one_entry_per_key(node.value)

    def construct_yaml_int(self, node: Any) -> int:
        """An integer as YAML 1.2 reads it (`010` is ten, `0o17` octal, `0x1F` hex); a YAML 1.1 form given an
        explicit `!!int` tag (`1_000`, `0b11`) as YAML 1.1 reads it."""
        text = self.construct_scalar(node)
        try:
            if not isinstance(text, str) or not _INT_12.match(text):
                return SafeConstructor.construct_yaml_int(self, node)
            base = {"0o": 8, "0x": 16}.get(text[:2], 10)
            return int(text[2:] if base != 10 else text, base)
        except ValueError:
            raise BeyondLimit(None, None, f"a number with more than {MAX_INT_DIGITS} digits; write it as a string",
                              node.start_mark) from None


class LastKeyLoader(CatalogLoader):
    """CatalogLoader that keeps the last of two equal keys, as YAML readers do (`load(unique=False)`)."""

    def flatten_mapping(self, node: Any) -> None:
        SafeConstructor.flatten_mapping(self, node)
        node.value = _one_entry_per_key(node.value)


_BOOL_TAG = "tag:yaml.org,2002:bool"
CatalogLoader.add_constructor("tag:yaml.org,2002:int", CatalogLoader.construct_yaml_int)
_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
# YAML 1.2's core schema (what OpenAPI 3.1 and JSON Schema data are): YAML 1.1's sexagesimal `12:30` (750),
# octal `010` (8), binary `0b11` and `1_000` are strings or decimals there
_INT_12 = re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$")
_FLOAT_12 = re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)"
                       r"|\.(?:nan|NaN|NAN))$")
CatalogLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers
            if tag not in ("tag:yaml.org,2002:timestamp", _BOOL_TAG, _INT_TAG, _FLOAT_TAG)]
    for first, resolvers in Resolver.yaml_implicit_resolvers.items()
}
CatalogLoader.add_implicit_resolver(_BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
CatalogLoader.add_implicit_resolver(_INT_TAG, _INT_12, list("-+0123456789"))  # before float: `12` is an int
CatalogLoader.add_implicit_resolver(_FLOAT_TAG, _FLOAT_12, list("-+0123456789."))


def _refuse_duplicate_keys(node: Any) -> None:
    """Raise at the second of two equal keys written in one mapping (`text.DUPLICATE_HINT` says why)."""
    first: dict[tuple[str, str], Any] = {}
    for key, _value in node.value:
        if not isinstance(key, ScalarNode) or key.tag == _MERGE_TAG:
            continue
        mark = first.setdefault((key.tag, key.value), key.start_mark)
        if mark is not key.start_mark:
            raise _NamedTwice(None, None, f"duplicate key {key.value!r} (first at line {mark.line + 1}, column "
                              f"{mark.column + 1}); {DUPLICATE_HINT}", key.start_mark)


def _one_entry_per_key(pairs: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Merged (key, value) node pairs with one entry per key: the first key's place, the last value (what
    building a dict from all of them gives)."""
    out: list[tuple[Any, Any]] = []
    where: dict[Any, int] = {}
    for key, value in pairs:
        ident = (key.tag, key.value) if isinstance(key, ScalarNode) else id(key)
        if ident in where:
            out[where[ident]] = (out[where[ident]][0], value)
        else:
            where[ident] = len(out)
            out.append((key, value))
    return out


def load(text: str, source: str, unique: bool = True) -> Any:
    """The one document in `text`; a problem raises CatalogError naming `source` and, where known, the
    line and column (DuplicateKey for a key written twice; `unique=False` keeps the last instead)."""
    try:
        return _compose(text, CatalogLoader if unique else LastKeyLoader)
    except _NamedTwice as exc:
        raise DuplicateKey(_marked_message(exc, source)) from None
    except yaml.MarkedYAMLError as exc:
        raise CatalogError(_marked_message(exc, source)) from None
    except yaml.YAMLError as exc:
        raise CatalogError(f"{source}: invalid YAML ({exc})") from None


def _compose(text: str, loader: type = CatalogLoader) -> Any:
    try:
        return yaml.load(text, Loader=loader)  # noqa: S506 - SafeConstructor: plain data only
    except yaml.MarkedYAMLError as exc:
        if _LIBYAML_NESTING_CAP not in str(exc.problem) or exc.problem_mark is None:
            raise
        raise _first_too_deep(text, exc.problem_mark) from None


def _first_too_deep(text: str, capped_at: Any) -> BeyondLimit:
    """The depth error for a text libyaml refused at its own cap (`capped_at`, where level 1,001 opens).
    Levels MAX_DEPTH + 1 to 1,000 all open before that point, so composing the text before it stops at
    the first of them, and names its place."""
    try:
        yaml.load(text[:capped_at.index], Loader=CatalogLoader)  # noqa: S506 - as in _compose
    except BeyondLimit as exc:
        return exc
    except yaml.YAMLError:
        pass
    return BeyondLimit(None, None, _TOO_DEEP, capped_at)


def _marked_message(exc: yaml.MarkedYAMLError, source: str) -> str:
    mark = exc.problem_mark or exc.context_mark
    where = f"{source}: line {mark.line + 1}, column {mark.column + 1}: " if mark else f"{source}: "
    if isinstance(exc, BeyondLimit):
        return where + str(exc.problem)
    problem = " ".join(p for p in (exc.context, exc.problem) if p)
    opened = exc.context_mark
    if opened is not None and mark is not None and opened.line != mark.line:  # where the open construct began
        problem += f", opened at line {opened.line + 1}, column {opened.column + 1}"
    return f"{where}invalid YAML ({problem}); fix the syntax there"
