"""Which format a catalog is in, and reading a JSON or YAML catalog file (`text.py`, `yaml_loader.py`).

The rules are listed in the package docstring (`toolscout.ingest`); keep the two in step.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Mapping

from ..errors import CatalogError
from ..tool import Tool, json_type
from . import yaml_loader
from .common import at, catalog_error
from .guard import check_tree
from .text import decode, parse_json

FORMATS = ("openai", "anthropic", "mcp", "openapi", "python", "jsonl")
FORMAT_HINT = f"pass format= one of {', '.join(FORMATS)} (CLI: --format NAME)"
# What a catalog may be, said wherever a source is none of them (a missing file, a CSV file).
CATALOG_KINDS = ("OpenAI or Anthropic tools (JSON, YAML, or JSONL one tool a line), an MCP tools/list or "
                 "server file, an OpenAPI 3 or Swagger 2 spec (JSON or YAML), benchmark rows (tools.jsonl, or "
                 "its folder), or Python callables (a .py file, or 'package.module:attr')")
STRUCTURED_SUFFIXES = (".json", ".yaml", ".yml")

# Anthropic server tools carry a dated type, e.g. web_search_20250305, bash_20250124.
ANTHROPIC_SERVER_TYPE = re.compile(r"^[a-z][a-z0-9_]*_\d{8}$")
# Built-in tools of the OpenAI Responses API: no parameters of their own.
OPENAI_BUILTIN_TYPES = frozenset({"web_search", "web_search_preview", "file_search", "code_interpreter",
                                  "computer_use_preview", "image_generation", "local_shell", "mcp"})


def format_of_path(path: Path) -> str | None:
    """The format a path's kind alone decides (folder, .jsonl, .py); None means 'read it and look'."""
    if path.is_dir():
        return "jsonl"
    return {".jsonl": "jsonl", ".py": "python"}.get(path.suffix.lower())


# Formats whose tool definitions a .jsonl file may hold one per line (README, "Catalog formats").
LINE_FORMATS = ("openai", "anthropic", "mcp")


def format_of_row(row: Any) -> str:
    """The format of a .jsonl file by its first row: a tool definition of a `LINE_FORMATS` format (it has no
    `id`, which every benchmark row needs), else benchmark rows ("jsonl"), whose reader names what is wrong."""
    shape = format_of_item(row) if isinstance(row, Mapping) and "id" not in row else None
    return shape if shape in LINE_FORMATS else "jsonl"


def format_of_item(item: Any) -> str | None:
    """The format one tool object (or MCP server entry) looks like; None when it gives no sign."""
    if callable(item) and not isinstance(item, Mapping):
        return "python"
    if not isinstance(item, Mapping):
        return None
    kind = item.get("type")
    kind = kind if isinstance(kind, str) else None  # any other value says nothing (and may be unhashable)
    if isinstance(item.get("function"), Mapping):
        return "openai"
    if "inputSchema" in item or "outputSchema" in item or "annotations" in item:
        return "mcp"
    if "tools" in item and any(k in item for k in ("server", "name", "serverInfo")):
        return "mcp"  # one server's entry in a multi-server file
    if "input_schema" in item:
        return "anthropic"
    if kind == "function" or kind in OPENAI_BUILTIN_TYPES:
        return "openai"
    if kind and ANTHROPIC_SERVER_TYPE.match(kind):
        return "anthropic"
    if "id" in item and "name" in item and ("doc" in item or "category" in item):
        return "jsonl"  # a benchmark tools.jsonl row
    if "parameters" in item or ("name" in item and set(item) <= {"name", "description", "strict"}):
        return "openai"  # OpenAI function objects; parameters are optional there, unlike Anthropic and MCP
    return None


def detect_format(obj: Any, source: str = "<object>") -> str:
    """The format of an already-parsed catalog object; raises CatalogError listing the formats."""
    if isinstance(obj, Mapping):
        if "openapi" in obj or "swagger" in obj:
            return "openapi"
        if "jsonrpc" in obj or "mcpServers" in obj or "servers" in obj:
            return "mcp"
        if isinstance(obj.get("functions"), list):
            return "openai"
        if isinstance(obj.get("result"), Mapping) and "tools" in obj["result"]:
            return "mcp"
        if "tools" in obj:
            if not isinstance(obj["tools"], list):
                raise catalog_error(source, "tools", f"expected a list of tools, got {json_type(obj['tools'])}")
            items, prefix = obj["tools"], "tools"
        else:
            items, prefix = [obj], ""
    elif isinstance(obj, (list, tuple)) or callable(obj):
        items, prefix = (list(obj) if not callable(obj) else [obj]), ""
    else:
        raise catalog_error(source, "", f"expected a tool catalog (an object or a list), got {json_type(obj)}")
    if not items:  # no tools reads alike in every format that lists them: none, with `finish`'s warning
        return "mcp" if prefix == "tools" else "openai"
    made = next((i for i, item in enumerate(items) if isinstance(item, Tool)), None)
    if made is not None:  # no format to read: they are toolscout's own records already
        raise catalog_error(source, at(prefix, made) if prefix else f"[{made}]", "is a toolscout Tool already, "
                            "not a catalog entry to read; give Tool objects to ToolScout.from_tools(tools) or "
                            "scout.add(tools) directly")
    first_seen: dict[str, str] = {}
    for i, item in enumerate(items):
        fmt = format_of_item(item)
        if fmt:
            first_seen.setdefault(fmt, at(prefix, i) if prefix else f"[{i}]")
    if len(first_seen) == 1:
        return next(iter(first_seen))
    if not first_seen:
        raise catalog_error(source, "", "cannot tell which tool format this is: no tool object looks like "
                            "OpenAI, Anthropic, MCP, OpenAPI, Python callables or benchmark JSONL rows", FORMAT_HINT)
    mixed = ", ".join(f"{fmt} ({where})" for fmt, where in first_seen.items())
    raise catalog_error(source, "", f"the tools look like different formats: {mixed}", FORMAT_HINT)


# ------------------------------------------------------------------------------------ reading files

def read_structured(path: Path, source: str | None = None, unique: bool = True, lenient: bool = False) -> Any:
    """A .json/.yaml/.yml file (or one without those suffixes: JSON first, then YAML) as Python objects,
    checked by `guard.check_tree` (bounded, acyclic, JSON data only). `unique`: a key written twice is an
    error (DuplicateKey), else the last is kept. `lenient`: a NaN or Infinity is left for the parser to
    skip the tool holding it (`guard.check_tree`'s `non_finite_ok`)."""
    return parse_structured(path.read_bytes(), source or str(path), path.suffix.lower(), unique, lenient)


def parse_structured(data: bytes, source: str, suffix: str, unique: bool = True, lenient: bool = False) -> Any:
    """`read_structured` for bytes already read (a file's, or a downloaded document's); `suffix`: the
    name's extension, lower case ('' when it has none)."""
    text = decode(data, source)
    if suffix == ".json" or (suffix not in (".yaml", ".yml") and text.lstrip()[:1] in ("{", "[")):
        obj = parse_json(text, source, unique)
    else:
        obj = yaml_loader.load(text, source, unique)
    if not isinstance(obj, (Mapping, list)):
        # a file of another kind (a CSV table) reads as YAML to one string: say what toolscout reads
        read_as = "" if suffix in STRUCTURED_SUFFIXES else (
            f" (a {suffix} file is not a catalog format; it was read as YAML)" if suffix else " (read as YAML)")
        raise CatalogError(f"{source}: not a tool catalog: expected a JSON or YAML object or list of tools, got "
                           f"{json_type(obj)}{read_as}. Catalogs toolscout reads: {CATALOG_KINDS}")
    check_tree(obj, source, json_only=True, non_finite_ok=lenient)
    return obj
