"""What an agent connected to the gateway sees over MCP (stdio or streamable HTTP): three tools in place of
every upstream's.

- `search_tools(task, k=5, namespaces=None)`: the best tools for a task, as `toolscout serve` ranks them,
  each with its id, name, namespace (the upstream), description, input schema, score, match and
  `available` (whether its upstream answers now); `abstained` when no tool fits.
- `call_tool(name, arguments)`: forwards the call to the upstream that runs the tool (`name` is an id that
  `search_tools` returned, or a bare tool name that only one tool carries) and returns its result as it
  came: content blocks, `structuredContent`, `isError`. A call that cannot be forwarded is an error result
  that names the upstream and says why.
- `record_tool_use(task, tool_ids, outcome=None)`: explicit feedback, as `toolscout serve` takes it.

With `expose="found"`, the tools a session's searches found are also listed as the session's own tools
(named by their ids) and the host is told with `notifications/tools/list_changed`, for hosts that refresh
their tool list; calling one is the same as `call_tool`.

A session is what the gateway attributes calls to: the stdio connection, an HTTP client's `Mcp-Session-Id`,
or else the caller's token (core.Gateway._source says whose feedback it is).
"""

# No `from __future__ import annotations` needed by the SDK here (handlers are plain callables), but the
# pydantic models below are read at run time, so their annotations stay real.
import logging
import re
from collections import OrderedDict
from typing import Any, Literal, Optional

import mcp_types as types
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler, ToolsListChanged
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from mcp_types import PROTOCOL_VERSION_META_KEY as PROTOCOL_VERSION_META
from pydantic import BaseModel, Field, ValidationError

from ..errors import Conflict, Forbidden, InvalidRequest, NotFound, RateLimited
from ..serve.auth import ANONYMOUS, AuthConfig, AuthError
from ..serve.mcp import RECORD_DESCRIPTION, FoundTool, RecordedUse
from ..serve.service import Principal
from ..version import __version__
from .core import STDIO, Gateway, http_session
from .upstream import ToolResult, UpstreamUnavailable, error_result, text_result

logger = logging.getLogger(__name__)
EXPOSE = ("none", "found")
EXPOSED_PER_SESSION = 64
_NATIVE_NAME = re.compile(r"[^A-Za-z0-9_.-]")

INSTRUCTIONS = ("toolscout is a gateway to many tool servers. Call search_tools with the task in plain language to "
                "find the tools that fit it, then call_tool with a found tool's id and its arguments: the call "
                "goes to the server that runs the tool, and its result comes back unchanged. toolscout learns "
                "from the calls which tools serve which tasks. An empty search result means no tool fits.")
SEARCH_DESCRIPTION = ("Find the tools that fit a task, best first, among every server behind this gateway. Returns "
                      "each tool's id (pass it to call_tool), name, description and input schema (JSON Schema), "
                      "with the namespace (server) that runs it and whether that server answers now. Returns no "
                      "tools when nothing fits.")
CALL_DESCRIPTION = ("Call a tool that search_tools found: name is its id (or its name, when only one tool has it), "
                    "arguments an object matching its input schema. Returns the tool's own result.")


class GatewayFoundTool(FoundTool):
    available: bool = Field(description="Whether the server that runs the tool answers now.")


class GatewaySearchResult(BaseModel):
    tools: list[GatewayFoundTool]
    abstained: bool = Field(description="True when no tool fits the task.")


class SearchArgs(BaseModel, extra="forbid"):
    task: str = Field(min_length=1, max_length=1 << 20,
                      description="The task in plain language (a whole conversation is fine), or a tool's name.")
    k: int = Field(5, ge=1, le=50, description="How many tools to return at most.")
    namespaces: Optional[list[str]] = Field(None, description="Only tools of these namespaces (servers).")


class CallArgs(BaseModel, extra="forbid"):
    name: str = Field(min_length=1, max_length=1000, description="The tool's id, as search_tools returned it.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="The tool's arguments.")


class RecordArgs(BaseModel, extra="forbid"):
    task: str = Field(min_length=1, max_length=20000, description="The task as it was searched for.")
    tool_ids: list[str] = Field(min_length=1, max_length=64,
                                description="The ids (from search_tools) of the tools that served it.")
    outcome: Optional[Literal["success", "failure"]] = Field(None, description="Whether they served it "
                                                                               "(default success).")


def _tool(name: str, title: str, description: str, args: type[BaseModel], result: type[BaseModel] | None) -> Any:
    return types.Tool(name=name, title=title, description=description, input_schema=args.model_json_schema(),
                      output_schema=result.model_json_schema() if result is not None else None)


OWN_TOOLS = [_tool("search_tools", "Search tools", SEARCH_DESCRIPTION, SearchArgs, GatewaySearchResult),
             _tool("call_tool", "Call a tool", CALL_DESCRIPTION, CallArgs, None),
             _tool("record_tool_use", "Record tool use", RECORD_DESCRIPTION, RecordArgs, RecordedUse)]


class GatewayMcp:
    """The gateway's MCP server (see the module doc); `server` is the SDK's low-level `Server`."""

    def __init__(self, gateway: Gateway, *, auth: AuthConfig | None = None, stdio_principal: Principal = STDIO,
                 expose: str = "none", metrics: Any = None):
        if expose not in EXPOSE:
            raise ValueError(f"unknown --expose {expose!r}; known: {', '.join(EXPOSE)}")
        self.gateway, self.auth, self.stdio_principal = gateway, auth, stdio_principal
        self.expose, self.metrics = expose, metrics
        self.bus = InMemorySubscriptionBus()
        self._exposed: OrderedDict[str, OrderedDict[str, str]] = OrderedDict()  # session -> native name -> id
        self.server = Server("toolscout-gateway", version=__version__, instructions=INSTRUCTIONS,
                             on_list_tools=self._list_tools, on_call_tool=self._call_tool,
                             on_subscriptions_listen=ListenHandler(self.bus))
        self.server.middleware = []  # the SDK's tracing layer: a span per message, for nothing without an exporter

    def initialization_options(self) -> Any:
        return self.server.create_initialization_options(NotificationOptions(tools_changed=self.expose == "found"))

    async def run_stdio(self) -> None:
        from mcp.server.stdio import stdio_server

        from .stdio import pipe_stdio

        async with pipe_stdio(self) as (stdin, stdout), stdio_server(stdin, stdout) as (read, write):
            await self.server.run(read, write, self.initialization_options())

    # the fast lane over stdio (stdio.FastLane) ----------------------------------------------------
    def claims(self, message: dict) -> bool:
        """`call_tool` requests over stdio are answered ahead of the SDK (stdio.py says why)."""
        params = message.get("params")
        return (message.get("method") == "tools/call" and "id" in message and isinstance(params, dict)
                and params.get("name") == "call_tool" and isinstance(params.get("arguments", {}), dict))

    async def answer(self, message: dict) -> dict:
        params = message["params"]
        meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
        request = _StdioRequest(str(meta.get(PROTOCOL_VERSION_META, "")), "call_tool", params.get("arguments") or {})
        return {"jsonrpc": "2.0", "id": message["id"], "result": await self._call_tool(request, request)}

    # handlers ----------------------------------------------------------------------------------
    async def _list_tools(self, ctx: Any, params: Any) -> Any:
        tools = list(OWN_TOOLS)
        found = self._exposed.get(self._session(ctx))
        if found:
            principal = self._principal(ctx)
            for native, tool_id in found.items():
                try:
                    tool = self.gateway.service.get(tool_id, principal)
                except NotFound:  # removed by its upstream since it was found
                    continue
                tools.append(types.Tool(name=native, description=tool.description or tool.name,
                                        input_schema=tool.input_schema(), title=tool.title))
        return types.ListToolsResult(tools=tools)

    async def _call_tool(self, ctx: Any, params: Any) -> Any:
        result = await self._answer(ctx, params.name, params.arguments or {})
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:  # the 2026 wire tags every result with its type
            result.setdefault("resultType", "complete")
        return result

    async def _answer(self, ctx: Any, name: str, arguments: dict[str, Any]) -> ToolResult:
        try:
            principal = self._principal(ctx)
            if name == "call_tool":
                args = CallArgs.model_validate(arguments)
                return await self._forward(ctx, principal, args.name, args.arguments)
            if name == "search_tools":
                return await self._search(ctx, principal, SearchArgs.model_validate(arguments))
            if name == "record_tool_use":
                return self._record(principal, RecordArgs.model_validate(arguments))
            exposed = self._exposed.get(self._session(ctx), {}).get(name)
            if exposed is not None:
                return await self._forward(ctx, principal, exposed, arguments)
            raise NotFound(f"no tool {name!r} here: this gateway's tools are search_tools, call_tool and "
                           "record_tool_use (call_tool forwards to the tools that search_tools finds)")
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or "arguments"
            return error_result(f"{name}: {where}: {first.get('msg')}")
        except (NotFound, Forbidden, InvalidRequest, Conflict, RateLimited, UpstreamUnavailable) as exc:
            return error_result(str(exc))
        except AuthError as exc:
            return error_result(exc.message)
        except Exception:  # a bug inside toolscout: logged; the agent gets an error, not a hang
            logger.exception("gateway: %s failed", name)
            return error_result(f"{name}: an internal error in toolscout (logged on the gateway)")

    async def _search(self, ctx: Any, principal: Principal, args: SearchArgs) -> Any:
        if not args.task.strip():
            raise InvalidRequest("task must not be blank")
        session = self._session(ctx)
        hits = await self.gateway.search(args.task, args.k, principal=principal, session=session,
                                         namespaces=args.namespaces)
        if self.metrics is not None:
            self.metrics.count("queries")
            self.metrics.count("abstained", not hits)
        found = [_found(h.to_dict()) for h in hits]
        payload = {"tools": found, "abstained": not hits}
        if self.expose == "found" and self._expose(session, [h.tool.id for h in hits]):
            await self._announce_tools_changed(ctx)
        return text_result(payload)

    async def _forward(self, ctx: Any, principal: Principal, name: str, arguments: dict[str, Any]) -> Any:
        if not isinstance(arguments, dict):
            raise InvalidRequest("call_tool: arguments must be an object")
        if principal is ANONYMOUS:  # reads are open, but a call acts on someone's behalf
            raise Forbidden("calling tools through this gateway needs a bearer token")
        request = getattr(ctx, "request", None)
        headers = dict(request.headers) if request is not None else {}
        return await self.gateway.call(name, arguments, principal=principal, session=self._session(ctx),
                                       headers=headers)

    def _record(self, principal: Principal, args: RecordArgs) -> Any:
        result = self.gateway.record(args.task, args.tool_ids, args.outcome, principal)
        payload = RecordedUse(learned=len(result.learned), duplicate=bool(result.duplicates),
                              unknown_tools=result.unknown).model_dump()
        return text_result(payload)

    # sessions ----------------------------------------------------------------------------------
    def _principal(self, ctx: Any) -> Principal:
        request = getattr(ctx, "request", None)
        if request is None or self.auth is None:  # stdio
            return self.stdio_principal
        return self.auth.authenticate(request.headers.get("authorization"), write=False)

    def _session(self, ctx: Any) -> str:
        request = getattr(ctx, "request", None)
        if request is None:
            return "stdio"
        session_id = request.headers.get("mcp-session-id")
        if session_id:
            return f"mcp:{session_id}"
        return http_session(self._principal(ctx))

    def _expose(self, session: str, ids: list[str]) -> bool:
        """Add `ids` to the session's own tools; True when that changed its tool list."""
        exposed = self._exposed.setdefault(session, OrderedDict())
        self._exposed.move_to_end(session)
        while len(self._exposed) > 10_000:
            self._exposed.popitem(last=False)
        added = False
        for tool_id in ids:
            native = _NATIVE_NAME.sub("_", tool_id)[:128]
            if native in ("search_tools", "call_tool", "record_tool_use"):
                native = f"{native}_"
            added |= native not in exposed
            exposed[native] = tool_id
            exposed.move_to_end(native)
        while len(exposed) > EXPOSED_PER_SESSION:
            exposed.popitem(last=False)
        return added

    async def _announce_tools_changed(self, ctx: Any) -> None:
        """Tell the host to list tools again: on the 2025 protocol through the session, on the 2026 one to
        every `subscriptions/listen` stream (that protocol has no sessions to address)."""
        try:
            await ctx.session.send_tool_list_changed()
        except Exception as exc:  # a session that cannot take notifications still has its search result
            logger.debug("tools/list_changed not sent: %s", exc)
        await self.bus.publish(ToolsListChanged())


def _found(hit: dict[str, Any]) -> dict[str, Any]:
    """The fields of a hit's JSON (`Hit.to_dict`) that `search_tools` returns."""
    found = {key: hit.get(key) for key in GatewayFoundTool.model_fields}
    found["available"] = hit.get("available", True) is not False
    return found


class _StdioRequest:
    """A fast-lane request as the handlers read it: its context (no HTTP request) and its params."""

    request = None

    def __init__(self, protocol_version: str, name: str, arguments: dict):
        self.protocol_version, self.name, self.arguments = protocol_version, name, arguments
