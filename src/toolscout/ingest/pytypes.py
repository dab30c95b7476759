"""Python type hints → JSON schema, for tools made from callables.

str→string, int→integer, float→number, bool→boolean, None→null; list/set/tuple/Sequence[X]→array of X;
dict/Mapping[str, X]→object (additionalProperties X); Optional[X] / X | None→X's schema with "null"
added to its type (or `anyOf` with null); other unions→anyOf; Literal[...] and Enum subclasses→enum
(with the type when all values share one); Annotated[X, "text" | Field(description=...)]→X plus that
description; datetime/date/time/UUID→string with a format; pydantic models→their own JSON schema;
dataclasses and TypedDicts→object schemas. `self_contained` then moves the definitions pydantic nests
(`$defs`) to the root of the tool's schema, where their refs point. Anything else (Any, no hint, unknown classes, a class whose
own hints cannot be resolved) → {} (any value). Values that are not plain JSON (NaN, sets, objects:
`guard.check_tree`) are left out of enums and defaults; hints nested deeper than `guard.MAX_DEPTH` raise
`HintTooDeep` (a hostile hint would otherwise exhaust the stack).
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
import datetime
import decimal
import enum
import inspect
import pathlib
import types
import typing
import uuid
from typing import Any

from ..errors import CatalogError
from .guard import MAX_DEPTH, check_tree

_SIMPLE = {str: {"type": "string"}, bool: {"type": "boolean"}, int: {"type": "integer"}, float: {"type": "number"},
           type(None): {"type": "null"}, bytes: {"type": "string"}, decimal.Decimal: {"type": "number"},
           pathlib.Path: {"type": "string"}, datetime.datetime: {"type": "string", "format": "date-time"},
           datetime.date: {"type": "string", "format": "date"}, datetime.time: {"type": "string", "format": "time"},
           uuid.UUID: {"type": "string", "format": "uuid"}, list: {"type": "array"}, tuple: {"type": "array"},
           set: {"type": "array"}, frozenset: {"type": "array"}, dict: {"type": "object"}}
_ARRAYS = (list, set, frozenset, tuple, cabc.Sequence, cabc.MutableSequence, cabc.Set, cabc.MutableSet,
           cabc.Iterable, cabc.Collection)
_MAPS = (dict, cabc.Mapping, cabc.MutableMapping)
_JSON_TYPES = {str: "string", bool: "boolean", int: "integer", float: "number"}


class HintTooDeep(Exception):
    """A type hint nested deeper than MAX_DEPTH."""


def type_schema(tp: Any, _trail: tuple = ()) -> dict[str, Any]:
    """The schema of `tp`; `_trail`: the hints it is nested in (for recursive classes and the depth)."""
    if len(_trail) >= MAX_DEPTH:
        raise HintTooDeep(f"type hint nested deeper than {MAX_DEPTH} levels")
    trail = _trail + (tp,)
    if tp is Any or tp is inspect.Parameter.empty or isinstance(tp, (str, typing.ForwardRef)):
        return {}  # no hint, or one that could not be resolved: any value
    if tp is None:
        return {"type": "null"}
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return _annotated(args, trail)
    if origin is typing.Union or origin is types.UnionType:
        return _union(args, trail)
    if origin is typing.Literal:
        return _enum(list(args))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum([member.value for member in tp])
    if origin in _ARRAYS:
        return _array(origin, args, trail)
    if origin in _MAPS:
        schema: dict[str, Any] = {"type": "object"}
        if len(args) == 2 and args[1] is not Any:
            schema["additionalProperties"] = type_schema(args[1], trail)
        return schema
    if tp in _SIMPLE:
        return dict(_SIMPLE[tp])
    if isinstance(tp, type):
        return _class_schema(tp, trail)
    return {}


def _annotated(args: tuple, trail: tuple) -> dict[str, Any]:
    schema = type_schema(args[0], trail)
    for meta in args[1:]:
        text = meta if isinstance(meta, str) else getattr(meta, "description", None)
        if isinstance(text, str) and text.strip():
            schema = {**schema, "description": text.strip()}
    return schema


def _union(args: tuple, trail: tuple) -> dict[str, Any]:
    nullable = type(None) in args
    options = [type_schema(a, trail) for a in args if a is not type(None)]
    if len(options) == 1:
        schema = options[0]
        if not nullable:
            return schema
        if isinstance(schema.get("type"), str):
            return {**schema, "type": [schema["type"], "null"]}
        if not schema:
            return {}
        return {"anyOf": [schema, {"type": "null"}]}
    return {"anyOf": options + ([{"type": "null"}] if nullable else [])}


def _enum(values: list) -> dict[str, Any]:
    values = [v for v in (v.value if isinstance(v, enum.Enum) else v for v in values) if is_json(v)]
    if not values:
        return {}
    kinds = {_JSON_TYPES.get(type(v)) for v in values}
    schema: dict[str, Any] = {"enum": values}
    if len(kinds) == 1 and None not in kinds:
        schema = {"type": kinds.pop(), **schema}
    return schema


def _array(origin: Any, args: tuple, trail: tuple) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "array"}
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        args = args[:1]
    if len(args) == 1 and args[0] is not Any:
        schema["items"] = type_schema(args[0], trail)
    elif origin is tuple and args and args != ((),):  # fixed-length tuple[X, Y]
        schema["prefixItems"] = [type_schema(a, trail) for a in args]
        schema["minItems"] = schema["maxItems"] = len(args)
    if origin in (set, frozenset, cabc.Set, cabc.MutableSet):
        schema["uniqueItems"] = True
    return schema


def _class_schema(cls: type, trail: tuple) -> dict[str, Any]:
    if hasattr(cls, "model_json_schema"):  # pydantic v2 model
        return _model_schema(cls)
    if cls in trail[:-1]:  # a recursive structure: stop here
        return {"type": "object", "title": cls.__name__}
    if dataclasses.is_dataclass(cls):
        hints = _class_hints(cls)
        props = {f.name: type_schema(hints.get(f.name, Any), trail) for f in dataclasses.fields(cls)}
        required = [f.name for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        return _object(cls.__name__, props, required)
    if typing.is_typeddict(cls):
        hints = _class_hints(cls)
        props = {name: type_schema(tp, trail) for name, tp in hints.items()}
        return _object(cls.__name__, props, sorted(getattr(cls, "__required_keys__", props)))
    return {}


def _class_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception:  # noqa: BLE001 - an unresolvable forward reference in the user's class: fields untyped
        return {}


def _model_schema(cls: type) -> dict[str, Any]:
    try:
        return dict(cls.model_json_schema())
    except Exception:  # noqa: BLE001 - pydantic cannot describe the user's model (arbitrary types): any value
        return {}


def self_contained(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` with every `$defs` inside it moved to its root, where its refs (`#/$defs/Name`) look.

    pydantic writes a model's definitions at the model's own root, so a model nested in a parameter (or in a
    list) would refer to nothing; recursive models need their definitions kept, so they are lifted, not
    inlined. Two different definitions under one name: the later one is renamed `Name_2` (its refs too).
    """
    lifted: dict[str, Any] = {}
    out = _lift(schema, lifted)
    return {**out, "$defs": lifted} if lifted else out


# keywords whose values are data, not schemas: a "$defs" key inside a default or an example is a value
_DATA_KEYWORDS = frozenset({"default", "const", "enum", "examples", "example"})


def _lift(node: Any, lifted: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_lift(v, lifted) for v in node]
    if not isinstance(node, dict):
        return node
    own = node.get("$defs")
    renames = _renames(own, lifted) if isinstance(own, dict) else {}
    if renames:
        node = _renamed(node, renames)
    if isinstance(own, dict):
        for name, definition in node["$defs"].items():
            lifted[renames.get(name, name)] = _lift(definition, lifted)
    return {k: v if k in _DATA_KEYWORDS else _lift(v, lifted) for k, v in node.items()
            if not (k == "$defs" and isinstance(own, dict))}


def _renames(own: dict[str, Any], lifted: dict[str, Any]) -> dict[str, str]:
    """New names for the definitions of `own` that clash with different ones already lifted."""
    renames: dict[str, str] = {}
    changed = True
    while changed:  # a rename changes the refs of the others, which may then clash in turn
        changed = False
        for name, definition in own.items():
            target = renames.get(name, name)
            if target in lifted and lifted[target] != _renamed(definition, renames):
                taken = set(lifted) | set(own) | set(renames.values())
                renames[name] = next(f"{name}_{i}" for i in range(2, len(taken) + 3) if f"{name}_{i}" not in taken)
                changed = True
    return renames


def _renamed(node: Any, renames: dict[str, str]) -> Any:
    """`node` with its `#/$defs/Old` refs pointing at the new names."""
    if isinstance(node, list):
        return [_renamed(v, renames) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: v if k in _DATA_KEYWORDS else _renamed(v, renames) for k, v in node.items()}
    ref = out.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/$defs/") and ref[len("#/$defs/"):] in renames:
        out["$ref"] = "#/$defs/" + renames[ref[len("#/$defs/"):]]
    return out


def _object(title: str, props: dict[str, Any], required: list[str]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "title": title, "properties": props}
    if required:
        schema["required"] = list(required)
    return schema


def jsonable_default(value: Any) -> tuple[bool, Any]:
    """(True, JSON value) for a default an agent can be told about; (False, None) otherwise."""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, (tuple, set, frozenset)):
        value = list(value)
    return (True, value) if is_json(value) else (False, None)


def is_json(value: Any) -> bool:
    """Whether `value` is plain JSON data within the catalog bounds (finite numbers, no sets or objects)."""
    try:
        check_tree(value, "value", json_only=True)
    except CatalogError:
        return False
    return True
