"""JSON-schema helpers: local `$ref` resolution (cycle- and size-guarded) for OpenAPI specs.

Tools must carry self-contained schemas (an agent is handed one tool, not the whole spec), so refs are
inlined. Two guards keep that finite: a ref already being expanded on the current branch (a recursive
type) and refs beyond a per-operation budget (heavily cross-linked specs would otherwise grow
exponentially) become a small placeholder `{"type": ..., "title": Name, "$comment": why}`. Every ref is
still looked up, so a broken one is always reported.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping
from urllib.parse import unquote

from .common import Context, at

MAX_EXPANSIONS = 200  # refs inlined per operation before placeholders are used
# Keys whose children are names (of properties, definitions), not schema keywords.
_NAME_MAPS = frozenset({"properties", "patternProperties", "definitions", "$defs"})


def is_schema_keyword_noise(key: str) -> bool:
    """OpenAPI-only keywords an LLM-facing JSON schema does not need (the original stays in Tool.raw)."""
    return key == "xml" or key.startswith("x-")


@dataclass
class Budget:
    """Refs one operation may still inline (read at creation, so the limit can be changed)."""

    left: int = field(default_factory=lambda: MAX_EXPANSIONS)


class RefResolver:
    """Resolves `#/...` refs inside one document; other refs are kept as they are, with a warning."""

    def __init__(self, document: Mapping[str, Any], ctx: Context):
        self.document = document
        self.ctx = ctx

    def lookup(self, ref: str, where: str) -> tuple[Any, str]:
        """The target of a local ref and its index path; a broken ref raises naming where it was."""
        parts = [unquote(p).replace("~1", "/").replace("~0", "~") for p in ref[2:].split("/")] if ref != "#" else []
        node: Any = self.document
        for i, part in enumerate(parts):
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                missing = "/".join(parts[: i + 1])
                raise self.ctx.error(at(where, "$ref"), f"broken $ref {ref!r}: this spec has no '#/{missing}'",
                                     "fix the reference or add the missing definition")
        return node, ".".join(parts)

    def _is_local(self, ref: str, where: str) -> bool:
        if ref.startswith("#"):
            return True
        self.ctx.warn(f"{self.ctx.source}: {where}: $ref {ref!r} points outside this file and was kept unresolved")
        return False

    def deref(self, node: Any, where: str) -> tuple[Any, str]:
        """Follow a chain of top-level refs (a parameter, request body or response object)."""
        seen: set[str] = set()
        while isinstance(node, Mapping) and isinstance(node.get("$ref"), str) and self._is_local(node["$ref"], where):
            ref = node["$ref"]
            if ref in seen:
                raise self.ctx.error(at(where, "$ref"), f"$ref {ref!r} refers to itself in a loop")
            seen.add(ref)
            node, where = self.lookup(ref, where)
        return node, where

    def resolve(self, node: Any, where: str, budget: Budget | None = None) -> Any:
        """A copy of `node` with local refs inlined and OpenAPI-only keywords (xml, x-*) dropped."""
        return self._resolve(node, where, (), budget or Budget(), names=False)

    def _resolve(self, node: Any, where: str, stack: tuple[str, ...], budget: Budget, names: bool) -> Any:
        if isinstance(node, list):
            return [self._resolve(v, at(where, i), stack, budget, False) for i, v in enumerate(node)]
        if not isinstance(node, Mapping):
            return node
        if names:  # a map of property names to schemas: every key is kept
            return {k: self._resolve(v, at(where, k), stack, budget, False) for k, v in node.items()}
        ref = node.get("$ref")
        if isinstance(ref, str) and self._is_local(ref, where):
            return self._inline(node, ref, where, stack, budget)
        return {k: self._resolve(v, at(where, k), stack, budget, k in _NAME_MAPS)
                for k, v in node.items() if not is_schema_keyword_noise(k)}

    def _inline(self, node: Mapping[str, Any], ref: str, where: str, stack: tuple[str, ...], budget: Budget) -> Any:
        target, target_at = self.lookup(ref, where)
        if ref in stack or budget.left <= 0:
            why = "recursive reference" if ref in stack else "reference not expanded (size limit)"
            kind = target.get("type", "object") if isinstance(target, Mapping) else "object"
            return {"type": kind, "title": ref.rsplit("/", 1)[-1], "$comment": f"{why}: {ref}"}
        budget.left -= 1
        resolved = self._resolve(target, target_at, stack + (ref,), budget, False)
        siblings = {k: v for k, v in node.items() if k != "$ref" and not is_schema_keyword_noise(k)}
        if siblings and isinstance(resolved, dict):  # OpenAPI 3.1: a description beside $ref overrides
            resolved = {**resolved, **self._resolve(siblings, where, stack, budget, False)}
        return resolved


def object_schema(properties: Mapping[str, Any], required: list[str]) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object", "properties": dict(properties)}
    if required:
        schema["required"] = list(dict.fromkeys(required))
    return schema


def is_plain_object(schema: Any) -> bool:
    """An object schema whose properties can be merged into another object's (no allOf/oneOf etc.)."""
    return (isinstance(schema, Mapping) and isinstance(schema.get("properties"), Mapping)
            and schema.get("type", "object") == "object"
            and not any(k in schema for k in ("allOf", "anyOf", "oneOf", "not")))
