"""JSON-schema helpers: local `$ref` resolution (cycle- and size-guarded) for OpenAPI specs.

Tools must carry self-contained schemas (an agent is handed one tool, not the whole spec), so refs are
inlined. Guards keep that finite: a ref already being expanded on the current branch (a recursive
type), refs beyond a per-operation budget of refs and of copied nodes (heavily cross-linked specs would
otherwise grow exponentially, and a large schema inlined many times would fill memory), refs beyond a
budget for the whole document, and refs that would nest the schema deeper than `guard.MAX_DEPTH` become
a small placeholder `{"type": ..., "title": Name, "$comment": why}`. Every ref is still looked up, so a
broken one is always reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

from .common import Context, at, brief
from .guard import MAX_DEPTH

MAX_EXPANSIONS = 200  # refs inlined per operation before placeholders are used
MAX_INLINED_NODES = 5_000  # objects and arrays copied out of refs per operation (~100 KB of JSON)
MAX_INLINED_TOTAL = 500_000  # the same for the whole document (about 100 MB of copies)
# Keys whose children are names (of properties, definitions), not schema keywords.
_NAME_MAPS = frozenset({"properties", "patternProperties", "definitions", "$defs"})


def is_schema_keyword_noise(key: Any) -> bool:
    """OpenAPI-only keywords an LLM-facing JSON schema does not need (the original stays in Tool.raw)."""
    return isinstance(key, str) and (key == "xml" or key.startswith("x-"))


@dataclass
class Budget:
    """Refs and copied nodes one operation may still inline (read at creation, so the limits can be changed)."""

    left: int = field(default_factory=lambda: MAX_EXPANSIONS)
    nodes_left: int = field(default_factory=lambda: MAX_INLINED_NODES)


class RefResolver:
    """Resolves `#/...` refs inside one document; other refs are kept as they are, with a warning."""

    def __init__(self, document: Mapping[str, Any], ctx: Context):
        self.document = document
        self.ctx = ctx
        self.total_left = MAX_INLINED_TOTAL  # nodes all operations together may still copy out of refs

    def lookup(self, ref: str, where: str) -> tuple[Any, str]:
        """The target of a local ref and its index path; a broken ref raises naming where it was."""
        if ref != "#" and not ref.startswith("#/"):  # '#definitions/X': the slash forgotten
            raise self.ctx.error(at(where, "$ref"), f"malformed $ref {brief(ref)}: a ref inside this file is '#/' "
                                 f"and a path", f"write {brief('#/' + ref[1:])}")
        parts = [unquote(p).replace("~1", "/").replace("~0", "~") for p in ref[2:].split("/")] if ref != "#" else []
        node: Any = self.document
        for i, part in enumerate(parts):
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif isinstance(node, list) and _index(part, len(node)) is not None:
                node = node[_index(part, len(node))]
            else:
                missing = "/".join(parts[: i + 1])
                raise self.ctx.error(at(where, "$ref"), f"broken $ref {brief(ref)}: this spec has no {brief('#/' + missing)}",
                                     "fix the reference or add the missing definition")
        return node, ".".join(parts)

    def _is_local(self, ref: str, where: str) -> bool:
        if ref.startswith("#"):
            return True
        self.ctx.warn(f"{where}: $ref {brief(ref)} points outside this file and was kept unresolved")
        return False

    def deref(self, node: Any, where: str) -> tuple[Any, str]:
        """Follow a chain of top-level refs (a parameter, request body or response object)."""
        seen: set[str] = set()
        while isinstance(node, Mapping) and isinstance(node.get("$ref"), str) and self._is_local(node["$ref"], where):
            ref = node["$ref"]
            if ref in seen:
                raise self.ctx.error(at(where, "$ref"), f"$ref {brief(ref)} refers to itself in a loop")
            seen.add(ref)
            node, where = self.lookup(ref, where)
        return node, where

    def resolve(self, node: Any, where: str, budget: Budget | None = None) -> Any:
        """A copy of `node` with local refs inlined and OpenAPI-only keywords (xml, x-*) dropped."""
        return self._resolve(node, where, (), budget or Budget(), names=False, depth=0)

    def _resolve(self, node: Any, where: str, stack: tuple[str, ...], budget: Budget, names: bool,
                 depth: int) -> Any:
        if not isinstance(node, (list, Mapping)):
            return node
        if stack:  # a copy out of a ref
            budget.nodes_left -= 1
            self.total_left -= 1
        if isinstance(node, list):
            return [self._resolve(v, at(where, i), stack, budget, False, depth + 1) for i, v in enumerate(node)]
        if names:  # a map of property names to schemas: every key is kept
            return {k: self._resolve(v, at(where, k), stack, budget, False, depth + 1) for k, v in node.items()}
        ref = node.get("$ref")
        if isinstance(ref, str) and self._is_local(ref, where):
            return self._inline(node, ref, where, stack, budget, depth)
        return {k: self._resolve(v, at(where, k), stack, budget, k in _NAME_MAPS, depth + 1)
                for k, v in node.items() if not is_schema_keyword_noise(k)}

    def _inline(self, node: Mapping[str, Any], ref: str, where: str, stack: tuple[str, ...], budget: Budget,
                depth: int) -> Any:
        target, target_at = self.lookup(ref, where)
        why = self._not_expanded(ref, stack, budget, depth)
        if why:
            kind = target.get("type", "object") if isinstance(target, Mapping) else "object"
            return {"type": kind, "title": ref.rsplit("/", 1)[-1], "$comment": f"{why}: {ref}"}
        budget.left -= 1
        resolved = self._resolve(target, target_at, stack + (ref,), budget, False, depth)
        siblings = {k: v for k, v in node.items() if k != "$ref" and not is_schema_keyword_noise(k)}
        if siblings and isinstance(resolved, dict):  # OpenAPI 3.1: a description beside $ref overrides
            resolved = {**resolved, **self._resolve(siblings, where, stack, budget, False, depth)}
        return resolved

    def _not_expanded(self, ref: str, stack: tuple[str, ...], budget: Budget, depth: int) -> str | None:
        """Why `ref` becomes a placeholder here, or None to inline it."""
        if ref in stack:
            return "recursive reference"
        if budget.left <= 0 or budget.nodes_left <= 0:
            return "reference not expanded (size limit)"
        if self.total_left <= 0:
            self.ctx.warn(f"$refs beyond {MAX_INLINED_TOTAL} inlined schema objects in all were "
                          "left as placeholders")
            return "reference not expanded (size limit for the whole spec)"
        if depth >= MAX_DEPTH:
            return "reference not expanded (depth limit)"
        return None


def _index(part: str, size: int) -> int | None:
    """A JSON-pointer token as an index into a list of `size` items (ASCII digits only), else None."""
    if part.isascii() and part.isdigit() and len(part) <= len(str(size)) and int(part) < size:
        return int(part)
    return None


def object_schema(properties: Mapping[str, Any], required: list[str]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": dict(properties)}
    if required:
        schema["required"] = list(dict.fromkeys(required))
    return schema


# What an allOf part may say and still be merged into one object: its properties, their requirement, and
# words about it. A part with any other constraint (additionalProperties, a oneOf...) keeps the allOf as written.
_MERGEABLE_PART_KEYS = frozenset({"type", "properties", "required", "description", "title", "example", "examples"})


def merged_all_of(schema: Any) -> Any:
    """`schema` with an `allOf` of object parts (nested allOfs included) merged into one plain object: the
    parts' properties (a name two parts define differently is both: `{"allOf": [first, second]}`) and
    their required names; the schema's own words (description, title) are kept. Otherwise `schema` as
    it is. An OpenAPI body is often `allOf: [$ref Base, {extra fields}]` (petstore-expanded's Pet); merged,
    its fields are arguments like a plain body's."""
    if not isinstance(schema, Mapping) or not isinstance(schema.get("allOf"), list):
        return schema
    parts = [merged_all_of(part) for part in schema["allOf"]]
    own = {k: v for k, v in schema.items() if k != "allOf"}
    if not all(_mergeable(part) for part in parts + [own]):
        return schema
    properties: dict[str, Any] = {}
    required: list[str] = []
    for part in [own, *parts]:
        for name, prop in (part.get("properties") or {}).items():
            properties[name] = prop if properties.get(name, prop) == prop else {"allOf": [properties[name], prop]}
        required.extend(r for r in part.get("required") or () if isinstance(r, str))
    merged = {**own, "type": "object", "properties": properties}
    if required:
        merged["required"] = list(dict.fromkeys(required))
    return merged


def _mergeable(part: Any) -> bool:
    return (isinstance(part, Mapping) and set(part) <= _MERGEABLE_PART_KEYS
            and part.get("type", "object") == "object" and isinstance(part.get("properties", {}), Mapping)
            and isinstance(part.get("required", []), list))


def is_plain_object(schema: Any) -> bool:
    """An object schema whose properties can be merged into another object's (no allOf/oneOf etc.)."""
    return (isinstance(schema, Mapping) and isinstance(schema.get("properties"), Mapping)
            and schema.get("type", "object") == "object"
            and not any(k in schema for k in ("allOf", "anyOf", "oneOf", "not")))


def branch_fields(schema: Any, depth: int = 0) -> dict[str, Any]:
    """The fields of the branches of a schema that is one of several object shapes (oneOf/anyOf, or an allOf
    left unmerged) and has no fields of its own, each named once (its first branch's schema)."""
    if not isinstance(schema, Mapping) or "properties" in schema or depth > 3:
        return {}
    fields: dict[str, Any] = {}
    for keyword in ("oneOf", "anyOf", "allOf"):
        branches = schema.get(keyword)
        for branch in branches if isinstance(branches, list) else ():
            own = branch.get("properties") if isinstance(branch, Mapping) else None
            for name, field_schema in {**(own if isinstance(own, Mapping) else {}),
                                       **branch_fields(branch, depth + 1)}.items():
                fields.setdefault(str(name), field_schema)
    return fields


def without_read_only(schema: Any) -> Any:
    """`schema`, a request body's, without the properties marked `readOnly: true` (at any depth), and without
    them in `required`: the server sets them (an `id`), so a caller sends none, even where the shared schema
    of requests and responses lists them as required. `writeOnly` ones stay: requests are where they go."""
    if isinstance(schema, list):
        return [without_read_only(item) for item in schema]
    if not isinstance(schema, Mapping):
        return schema
    out: dict[str, Any] = {}
    dropped: set[str] = set()
    for key, value in schema.items():
        if key == "properties" and isinstance(value, Mapping):
            dropped = {name for name, prop in value.items()
                       if isinstance(prop, Mapping) and prop.get("readOnly") is True}
            out[key] = {name: without_read_only(prop) for name, prop in value.items() if name not in dropped}
        elif key in _NAME_MAPS and isinstance(value, Mapping):
            out[key] = {name: without_read_only(item) for name, item in value.items()}
        else:
            out[key] = without_read_only(value)
    if dropped and isinstance(out.get("required"), list):
        out["required"] = [name for name in out["required"] if name not in dropped]
        if not out["required"]:
            del out["required"]
    return out
