"""MCP `tools/list` results, alone or grouped by server.

Accepted shapes:
- a result `{"tools": [{name, title?, description?, inputSchema, outputSchema?, annotations?}]}`,
  a bare list of such tools, or the JSON-RPC response around it `{"jsonrpc": "2.0", "id": .., "result": ...}`;
- several servers: `[{"server" | "name": "github", "tools": [...]}, ...]`, `{"servers": [...]}`, or a
  mapping `{"servers" | "mcpServers": {"github": <tools list | result | JSON-RPC response | {.., "tools"}>}}`.

Each server's name becomes the namespace of its tools, so equal tool names on two servers get distinct
ids (`github.search`, `jira.search`). Ungrouped tools take the caller's namespace; in a grouped file the
server names win (a caller namespace is ignored with a warning). `outputSchema` → `returns`; `title`
(or `annotations.title`) stays in `raw` and stands in for a missing description; annotation hints that
are true become tags: readOnlyHint → read-only, destructiveHint → destructive, idempotentHint →
idempotent, openWorldHint → open-world (hints left out are not guessed from MCP's defaults).
"""

from __future__ import annotations

import shlex
from typing import Any, Iterator, Mapping

from ..tool import Tool, json_type
from .common import (
    PARAMETER_KEYS,
    Context,
    Entry,
    at,
    collect,
    make_tool,
    read_description,
    read_extras,
    read_name,
    read_schema,
    read_text,
    require_mapping,
)

_SCHEMA_KEYS = ("inputSchema",) + tuple(k for k in PARAMETER_KEYS if k != "inputSchema")
HINT_TAGS = {"readOnlyHint": "read-only", "destructiveHint": "destructive", "idempotentHint": "idempotent",
             "openWorldHint": "open-world"}


def parse(obj: Any, ctx: Context) -> list[Entry]:
    entries: list[Entry] = []
    groups = list(_groups(obj, ctx, ""))
    if ctx.namespace and any(server for server, _ in groups):
        ctx.warn(f"namespace {ctx.namespace!r} ignored: this file names its servers, "
                 "which become the namespaces")
    for server, items in groups:
        namespace = server or ctx.namespace
        entries.extend(collect(ctx, items, lambda pos, item, ns=namespace: _tool(ctx, pos, item, ns)))
    return entries


def _groups(obj: Any, ctx: Context, position: str,
            server: str | None = None) -> Iterator[tuple[str | None, list[tuple[str, Any]]]]:
    """(server name or None, its tools as (position, tool object)) for every group in `obj`."""
    if isinstance(obj, list):
        if obj and all(isinstance(x, Mapping) and "tools" in x for x in obj):  # a list of server entries
            for i, entry in enumerate(obj):
                where = at(position, i) if position else f"[{i}]"
                yield from _groups(entry, ctx, where, _server_name(ctx, entry, where))
        else:
            yield server, _positioned(position, obj)
        return
    obj = require_mapping(ctx, obj, position or "", "an MCP tools/list result or a list of servers")
    if "jsonrpc" in obj or "result" in obj or "error" in obj:
        if isinstance(obj.get("error"), Mapping):
            message = obj["error"].get("message", obj["error"])
            raise ctx.error(at(position, "error"), f"the JSON-RPC response is an error: {message}",
                            "save a successful tools/list response")
        yield from _groups(obj.get("result"), ctx, at(position, "result"), server)
        return
    for key in ("mcpServers", "servers"):
        if key in obj:
            servers = obj[key]
            if isinstance(servers, list):
                yield from _groups(servers, ctx, key)
                return
            servers = require_mapping(ctx, servers, key, "a mapping of server name to tools")
            for name, value in servers.items():
                yield from _groups(value, ctx, at(key, str(name)), str(name))
            return
    if "tools" not in obj and "name" in obj:  # one tool object, as the other formats take one
        yield server, [(position or "tool", obj)]
        return
    if "tools" not in obj and ("command" in obj or "url" in obj):  # a host's/gateway's config: how to reach a server
        raise ctx.error(position, "this is how to launch or reach a server (a gateway config, or a host's "
                                  "mcp.json), not its tools", _launch_hint(obj))
    if "tools" not in obj:
        raise ctx.error(position, "expected a 'tools' list (an MCP tools/list result) or one tool object")
    if not isinstance(obj["tools"], list):
        raise ctx.error(at(position, "tools"), f"expected a list of tools, got {json_type(obj['tools'])}")
    yield server, _positioned(at(position, "tools"), obj["tools"])


def _launch_hint(entry: Mapping) -> str:
    """How to index the server an `mcpServers` entry launches or reaches: `mcp:COMMAND ARGS` lists a running one."""
    if "command" in entry:
        args = entry.get("args") if isinstance(entry.get("args"), list) else []
        launch = shlex.join([str(entry["command"]), *map(str, args)])
        return (f"index the server itself: toolscout index {shlex.quote('mcp:' + launch)} --out DIR (it is started "
                "and its tools listed), or put the file's servers behind `toolscout gateway FILE`")
    return (f"index the server itself: toolscout index {shlex.quote(str(entry['url']))} --out DIR, or put the "
            "file's servers behind `toolscout gateway FILE`")


def _positioned(position: str, tools: list) -> list[tuple[str, Any]]:
    return [(at(position, i), item) for i, item in enumerate(tools)]


def _server_name(ctx: Context, entry: Mapping, where: str) -> str:
    info = entry.get("serverInfo") if isinstance(entry.get("serverInfo"), Mapping) else {}
    name = entry.get("server") or entry.get("name") or info.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ctx.error(where, "a server entry needs a 'server' or 'name' string", "it becomes the tools' namespace")
    return name.strip()


def _tool(ctx: Context, position: str, item: Any, namespace: str | None) -> Tool:
    item = require_mapping(ctx, item, position)
    annotations = item.get("annotations") or {}
    if not isinstance(annotations, Mapping):
        raise ctx.error(at(position, "annotations"),
                        f"field 'annotations' must be an object, got {json_type(annotations)}")
    fields = read_extras(ctx, item, position)  # outputSchema → returns is one of its aliases
    hint_tags = tuple(tag for hint, tag in HINT_TAGS.items() if annotations.get(hint) is True)
    fields["tags"] = tuple(dict.fromkeys(fields.get("tags", ()) + hint_tags))
    title = read_text(ctx, item, position, "title") or read_text(ctx, annotations, at(position, "annotations"), "title")
    return make_tool(ctx, position, namespace, read_name(ctx, item, position),
                     description=read_description(ctx, item, position) or title, title=title,
                     parameters=read_schema(ctx, item, position, _SCHEMA_KEYS, must_be_object=True),
                     raw=item, **fields)
