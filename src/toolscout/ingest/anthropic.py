"""Anthropic Messages-API tools: `{name, description, input_schema}`, as a list or `{"tools": [...]}`.

Server tools (a dated `type` such as `web_search_20250305`, `bash_20250124`, and no `input_schema`)
run on Anthropic's side and carry no description to retrieve by: they are skipped, each with an entry
in `LoadReport.skipped`, in strict and lenient mode alike. `cache_control` and other keys stay in `raw`.
"""

from __future__ import annotations

from typing import Any

from ..tool import Tool
from .common import (
    PARAMETER_KEYS,
    Context,
    Entry,
    brief,
    collect,
    make_tool,
    read_description,
    read_extras,
    read_name,
    read_schema,
    require_mapping,
    tool_items,
)

# input_schema is Anthropic's name; the other aliases are accepted for hand-written catalogs.
_SCHEMA_KEYS = ("input_schema",) + tuple(k for k in PARAMETER_KEYS if k != "input_schema")


def parse(obj: Any, ctx: Context) -> list[Entry]:
    return collect(ctx, tool_items(obj, ctx), lambda pos, item: _tool(ctx, pos, item))


def _tool(ctx: Context, position: str, item: Any) -> Tool | None:
    item = require_mapping(ctx, item, position)
    kind = item.get("type")
    if kind not in (None, "custom") and not any(k in item for k in _SCHEMA_KEYS):
        label = item.get("name") or kind
        ctx.skip(position, f"{ctx.source}: {position}: Anthropic server tool {brief(label)} (type {brief(kind)}) "
                           "runs on Anthropic's side and has no input_schema to retrieve by")
        return None
    fields = read_extras(ctx, item, position)
    return make_tool(ctx, position, ctx.namespace, read_name(ctx, item, position),
                     description=read_description(ctx, item, position),
                     parameters=read_schema(ctx, item, position, _SCHEMA_KEYS, must_be_object=True),
                     raw=item, **fields)
