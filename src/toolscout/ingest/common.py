"""What every parser shares: the load report, positioned error messages, field aliases and ids.

A parser turns one source object into `(position, Tool)` pairs; `collect` runs the per-tool parse with
lenient-mode skipping, and `finish` checks ids and counts what was loaded. Positions are index paths
into the source (`tools[3].function`, `paths./pets.get`) or `line N` for JSONL, so every message can
say where the problem is.
"""

from __future__ import annotations

import json
import re
import reprlib
import unicodedata
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

from ..errors import CatalogError, InvalidRequest
from ..tool import Tool, json_type, parameters_problem

# Source field names that mean the same thing, canonical name first.
PARAMETER_KEYS = ("parameters", "input_schema", "inputSchema", "args_schema", "argsSchema")
RETURN_KEYS = ("returns", "output_schema", "outputSchema", "response", "response_schema")
EXAMPLE_KEYS = ("examples", "example_usage", "example")
_SHORT_REPR = reprlib.Repr()  # bounded depth and length: safe on any value
_SHORT_REPR.maxstring = _SHORT_REPR.maxother = 160  # a long string is cut in its middle


@dataclass
class LoadReport:
    """What a load did: the format it read, how many tools it loaded, what it skipped and why.

    Pass the same report to several loads to accumulate: `loaded`, `skipped` and `warnings` add up and
    `format`/`source` describe the latest load.
    """

    format: str | None = None
    loaded: int = 0
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (position, message)
    warnings: list[str] = field(default_factory=list)
    source: str | None = None

    def warn(self, source: str, message: str) -> None:
        """Record something the user should know about `source` (named before `message`), once."""
        message = f"{source}: {message}"
        if message not in self.warnings:
            self.warnings.append(message)

    def notices(self) -> list[str]:
        """What a person should be told of the load, one line each, each naming its file once: the tools
        skipped, then the warnings (the CLI prints them, the HTTP API returns them)."""
        return [f"{message} (skipped)" for _position, message in self.skipped] + list(self.warnings)

    def summary(self) -> str:
        text = f"{self.source or '<object>'}: {self.loaded} tools ({self.format or 'unknown format'})"
        if self.skipped:
            text += f", {len(self.skipped)} skipped"
        return text


@dataclass
class Context:
    """One load's settings, handed to the parser of its format."""

    source: str
    lenient: bool = False
    report: LoadReport = field(default_factory=LoadReport)
    namespace: str | None = None  # the caller's namespace, for tools their source does not place
    # a live server's listing, as the gateway proxies it: a parameters schema the rule refuses is kept, with a
    # warning (the server takes its own schema; the rule is for catalogs toolscout is given to index)
    as_served: bool = False
    empty_hint: str | None = None  # where this format's tools come from, said when a catalog gives none
    skips: int = 0  # tools skipped by this load
    # lenient: the NaN and Infinity values of the source, as (position, message), not yet refused: a tool
    # that holds one is skipped (`collect`); one outside every tool still refuses the source (`finish`)
    non_finite: list[tuple[str, str]] = field(default_factory=list)

    def error(self, position: str, problem: str, hint: str | None = None) -> CatalogError:
        return catalog_error(self.source, position, problem, hint)

    def skip(self, position: str, message: str) -> None:
        """Record a tool left out; `message` names the file and position (a CatalogError's text)."""
        self.report.skipped.append((position, message))
        self.skips += 1

    def warn(self, message: str) -> None:
        """Record something the user should know; the file's name is put before `message`."""
        self.report.warn(self.source, message)

    def refuse_non_finite_within(self, position: str) -> None:
        """CatalogError naming the first NaN or Infinity inside the tool at `position`, if it holds one."""
        inside = [(where, message) for where, message in self.non_finite
                  if where == position or where.startswith((position + ".", position + "["))]
        if inside:
            self.non_finite = [place for place in self.non_finite if place not in inside]
            raise CatalogError(inside[0][1])


def catalog_error(source: str, position: str, problem: str, hint: str | None = None) -> CatalogError:
    where = f"{source}: {position}" if position else source
    return CatalogError(f"{where}: {problem}" + (f"; {hint}" if hint else ""))


def at(position: str, key: str | int) -> str:
    """Extend an index path: at('tools', 3) == 'tools[3]', at('tools[3]', 'function') == 'tools[3].function'."""
    if isinstance(key, int):
        return f"{position}[{key}]"
    return f"{position}.{key}" if position else str(key)


def brief(value: Any, limit: int = 200) -> str:
    """`repr(value)` cut to `limit` characters, for messages about values that may be huge or deep."""
    text = _SHORT_REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ----------------------------------------------------------------------------------- the two loops

Entry = tuple[str, Tool]


def collect(ctx: Context, items: Iterable[tuple[str, Any]],
            parse_one: Callable[[str, Any], Tool | None]) -> list[Entry]:
    """Parse each `(position, object)`; in lenient mode a bad tool is reported and skipped.

    `parse_one` returns None for a tool it skips on purpose (it reports that itself).
    """
    entries: list[Entry] = []
    for position, obj in items:
        try:
            ctx.refuse_non_finite_within(position)
            tool = parse_one(position, obj)
        except CatalogError as exc:
            if not ctx.lenient:
                raise
            ctx.skip(position, str(exc))
            continue
        if tool is not None:
            entries.append((position, tool))
    return entries


def finish(ctx: Context, entries: list[Entry]) -> list[Tool]:
    """Check that ids are unique (a true duplicate is an error naming both positions) and count; a catalog
    that gives no tool is worth a warning (an empty spec is rarely what was meant)."""
    if ctx.non_finite:  # outside every tool (a shared component, say): nothing smaller to leave out
        raise CatalogError(ctx.non_finite[0][1])
    first_at: dict[str, str] = {}
    tools: list[Tool] = []
    for position, tool in entries:
        if tool.id in first_at:
            exc = ctx.error(position, f"duplicate tool id {brief(tool.id)}, already defined at {first_at[tool.id]}",
                            "rename one of them, or give them different namespaces")
            if not ctx.lenient:
                raise exc
            ctx.skip(position, str(exc))
            continue
        first_at[tool.id] = position
        tools.append(tool)
    ctx.report.loaded += len(tools)
    if not tools:
        why = "every tool in it was skipped" if ctx.skips else "it holds none"
        ctx.warn(f"no tools loaded: {why}" + (f" ({ctx.empty_hint})" if ctx.empty_hint and not ctx.skips else ""))
    return tools


# ------------------------------------------------------------------------------------ field readers

def tool_items(obj: Any, ctx: Context, keys: tuple[str, ...] = ("tools",)) -> list[tuple[str, Any]]:
    """(position, item) for each tool of a list, a `{key: [...]}` wrapper, or a single tool object."""
    if isinstance(obj, Mapping):
        key = next((k for k in keys if k in obj), None)
        if key is None:
            return [("tool", obj)]
        if not isinstance(obj[key], list):
            raise ctx.error(key, f"expected a list of tools, got {json_type(obj[key])}")
        return [(at(key, i), item) for i, item in enumerate(obj[key])]
    if isinstance(obj, (list, tuple)):
        return [(f"[{i}]", item) for i, item in enumerate(obj)]
    raise ctx.error("", f"expected a list of tools or an object with 'tools', got {json_type(obj)}")


def qualified_id(namespace: str | None, name: str) -> str:
    return f"{namespace}.{name}" if namespace else name


def require_mapping(ctx: Context, obj: Any, position: str, what: str = "a tool object") -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise ctx.error(position, f"expected {what}, got {json_type(obj)}")
    return obj


def read_name(ctx: Context, obj: Mapping[str, Any], position: str, key: str = "name") -> str:
    name = obj.get(key)
    if not isinstance(name, str) or not name.strip():
        problem = "is missing" if key not in obj else f"must be a non-empty string, got {brief(name)}"
        raise ctx.error(position, f"field {key!r} {problem}", "every tool needs a name")
    return name.strip()


def read_text(ctx: Context, obj: Mapping[str, Any], position: str, key: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ctx.error(at(position, key), f"field {key!r} must be a string, got {json_type(value)}")
    return value.strip()


def join_summary(summary: str, description: str) -> str:
    """`summary` + `description` as one text, without repeating a description that restates the summary."""
    summary, description = summary.strip(), description.strip()
    if not summary or description.lower().startswith(summary.lower().rstrip(".")):
        return description or summary
    if not description:
        return summary
    return f"{summary}{'' if summary[-1] in '.!?:' else '.'} {description}"


def read_description(ctx: Context, obj: Mapping[str, Any], position: str) -> str:
    return join_summary(read_text(ctx, obj, position, "summary"), read_text(ctx, obj, position, "description"))


def read_schema(ctx: Context, obj: Mapping[str, Any], position: str, keys: tuple[str, ...],
                must_be_object: bool = False) -> dict[str, Any] | None:
    """The first alias of `keys` present in `obj`, checked to be a JSON schema object."""
    key = next((k for k in keys if k in obj), None)
    if key is None or obj[key] is None:
        return None
    value = obj[key]
    if hasattr(value, "model_json_schema"):  # a pydantic model class (LangChain `args_schema`)
        value = value.model_json_schema()
    where = at(position, key)
    if not isinstance(value, Mapping):
        raise ctx.error(where, f"field {key!r} must be a JSON schema object, got {json_type(value)}")
    problem = parameters_problem(value) if must_be_object else None  # the rule `Tool` applies, placed here
    if problem and _kept_as_served(ctx, problem):
        ctx.warn(f"{at(where, problem[0])}: {problem[1]} (kept as the server gave it)")
    elif problem:
        raise ctx.error(at(where, problem[0]) if problem[0] else where, problem[1])
    return dict(value)


def _kept_as_served(ctx: Context, problem: tuple[str, str]) -> bool:
    """Whether a live server's parameters schema is kept despite `problem`: unless it does not describe an
    object at all (no arguments could be sent: skipped, as always), the server takes its own schema."""
    return ctx.as_served and problem[0] not in ("", "type")


def _strings(ctx: Context, value: Any, where: str, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,) if value.strip() else ()
    if isinstance(value, (list, tuple)):
        return tuple(v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str) for v in value)
    if isinstance(value, Mapping):  # an example object: keep it as JSON text
        return (json.dumps(value, ensure_ascii=False, default=str),)
    raise ctx.error(where, f"field {key!r} must be a string or a list, got {json_type(value)}")


def read_extras(ctx: Context, obj: Mapping[str, Any], position: str) -> dict[str, Any]:
    """Tags, category, examples, limitations and returns under any of their source names.

    Only keys the source has are returned, so format-specific values can be merged over them.
    """
    out: dict[str, Any] = {}
    tags: list[str] = []
    for key in ("tags", "categories"):
        if key in obj:
            tags.extend(_strings(ctx, obj[key], at(position, key), key))
    category = obj.get("category")
    if isinstance(category, (list, tuple)):
        tags.extend(_strings(ctx, category, at(position, "category"), "category"))
    elif category is not None:
        if not isinstance(category, str):
            raise ctx.error(at(position, "category"), f"field 'category' must be a string, got {json_type(category)}")
        out["category"] = category or None
    if tags:
        out["tags"] = tuple(dict.fromkeys(t for t in tags if t))
    examples: list[str] = []
    for key in EXAMPLE_KEYS:
        if key in obj:
            examples.extend(_strings(ctx, obj[key], at(position, key), key))
    if examples:
        out["examples"] = tuple(examples)
    if obj.get("limitations") is not None:
        out["limitations"] = "; ".join(_strings(ctx, obj["limitations"], at(position, "limitations"), "limitations"))
    key = next((k for k in RETURN_KEYS if k in obj), None)
    if key is not None and isinstance(obj[key], str):  # a prose answer description: keep it as a schema
        out["returns"] = {"description": obj[key]}
    elif key is not None and obj[key] is not None:
        out["returns"] = read_schema(ctx, obj, position, RETURN_KEYS)
    return out


def slugify(text: str) -> str:
    """'Swagger Petstore - OpenAPI 3.0' → 'swagger-petstore-openapi-3-0', '天気予報 API' → '天気予報-api'.

    Every run of what is not a letter or digit is one '-', so there is no dot (ids are namespace.name). The
    letters were ASCII only, which left a word in another script out ('天気予報 API' and '郵便 API' were both
    'api'): a title with such a word keeps the letters and digits of every script (with the marks that
    complete them), NFKC-folded and lowercased. Any other title slugs as it always did ('Café API' is still
    'caf-api'), so the ids of catalogs indexed before stay what they were.
    """
    words = [word for word in text.split() if _unicode_slug(word)]
    if all(_ascii_slug(word) for word in words) and _ascii_slug(text):
        return _ascii_slug(text)
    return _unicode_slug(text)


def _ascii_slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _unicode_slug(text: str) -> str:
    folded = unicodedata.normalize("NFKC", text).lower()
    kept = "".join(c if c.isalnum() or unicodedata.category(c).startswith("M") else "-" for c in folded)
    return re.sub(r"-+", "-", kept).strip("-")


def make_tool(ctx: Context, position: str, namespace: str | None, name: str, **fields: Any) -> Tool:
    """The tool the catalog item at `position` describes; a field `Tool` refuses is the catalog's error,
    naming the file and the item (lenient loading skips the item)."""
    parameters = fields.get("parameters")
    problem = parameters_problem(parameters) if ctx.as_served else None  # `Tool` checks every other load
    kept = problem is not None and _kept_as_served(ctx, problem)
    try:
        tool = Tool(id=qualified_id(namespace, name), name=name, namespace=namespace,
                    **{**fields, "parameters": None if kept else parameters})
    except InvalidRequest as exc:
        raise ctx.error(position, str(exc)) from None
    return tool.keeping_parameters(parameters) if kept else tool
