"""OpenAI tool definitions.

Accepted shapes: Chat Completions tools `{"type": "function", "function": {name, description,
parameters, strict?}}`, the flat Responses-API form `{"type": "function", "name", "description",
"parameters"}`, legacy `functions` entries `{name, description, parameters}`; as a bare list, as
`{"tools": [...]}`, as `{"functions": [...]}` or one object alone. Built-in Responses tools
(`web_search`, `file_search`, ...) have no name or schema of their own: they are skipped and reported;
`custom` tools (free-text input) load with a name and description and no parameters.
"""

from __future__ import annotations

from typing import Any

from ..tool import Tool
from .common import (
    PARAMETER_KEYS,
    Context,
    Entry,
    at,
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


def parse(obj: Any, ctx: Context) -> list[Entry]:
    return collect(ctx, tool_items(obj, ctx, ("tools", "functions")), lambda pos, item: _tool(ctx, pos, item))


def _tool(ctx: Context, position: str, item: Any) -> Tool | None:
    item = require_mapping(ctx, item, position)
    kind = item.get("type")
    if "function" in item:
        fn = require_mapping(ctx, item["function"], at(position, "function"), "a function object")
        where = at(position, "function")
    elif kind in (None, "function", "custom"):  # custom tools take free text: a name and description, no schema
        fn, where = item, position
    else:
        ctx.skip(position, f"{ctx.source}: {position}: built-in OpenAI tool of type {brief(kind)} "
                           "has no name and parameters of its own to retrieve by")
        return None
    fields = read_extras(ctx, fn, where)
    return make_tool(ctx, position, ctx.namespace, read_name(ctx, fn, where), description=read_description(ctx, fn, where),
                     parameters=read_schema(ctx, fn, where, PARAMETER_KEYS, must_be_object=True),
                     raw=item, **fields)
