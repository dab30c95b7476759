"""What an agent connected to the gateway sees over MCP (stdio or streamable HTTP): three tools in place of
every upstream's.

- `search_tools(task, k=5, namespaces=None)`: the best tools for a task, as `toolscout serve` ranks them,
  each with its id, name, namespace (the upstream), description, input schema, score, `probability` (how
  likely it is a tool the task needs, calibrated), match and `available` (whether its upstream answers
  now); `abstained` when no tool is likely relevant (the gateway abstains by default: `gateway/runtime.py`);
  `not_searchable`: the upstreams whose tools it could not search (still starting once the gateway waited
  for them, or down).
- `call_tool(name, arguments)`: forwards the call to the upstream that runs the tool (`name` is an id that
  `search_tools` returned, or a bare tool name that only one tool carries) and returns its result as it
  came: content blocks, `structuredContent`, `isError`. A call that cannot be forwarded is an error result
  that names the upstream and says why.
- `record_tool_use(task, tool_ids, outcome=None)`: explicit feedback, as `toolscout serve` takes it.

With `expose="found"`, the tools a session's searches found are also listed as the session's own tools
(named by their ids) and the host is told with `notifications/tools/list_changed`, for hosts that refresh
their tool list; calling one is the same as `call_tool`.

Besides tools, what the protocol carries passes through (`core.Gateway` holds the policies):

- a call's progress: a request with a `progressToken` gets the upstream's `notifications/progress`;
- cancellation: `notifications/cancelled` cancels the handler (the SDK does), which cancels the call upstream;
- elicitation: an upstream's `elicitation/create` during a call goes to the agent's client when it declared
  the capability and its channel can carry a request;
- the upstreams' prompts and resources (`prompts/*`, `resources/*`, `completion/complete`), named as the
  gateway names them, with their list-changed and updated notifications (to each 2025-protocol session, and
  to every `subscriptions/listen` stream on the 2026 protocol).

A session is what the gateway attributes calls to: the stdio connection, an HTTP client's `Mcp-Session-Id`,
or else the caller's token (core.Gateway._source says whose feedback it is). Hosts attached over the index's
socket (`hosts.py`, several hosts on one machine) are served like the stdio host, each a session and a
feedback source of its own (`local:PID`, `session:local:PID`).
"""

# No `from __future__ import annotations` needed by the SDK here (handlers are plain callables), but the
# pydantic models below are read at run time, so their annotations stay real.
import contextvars
import dataclasses
import difflib
import logging
import os
import re
from collections import OrderedDict
from typing import Any, Literal, Optional

import anyio
import mcp_types as types
from mcp.server.caching import CacheHint
from mcp.server.lowlevel.server import NotificationOptions, Server
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    ListenHandler,
    PromptsListChanged,
    ResourcesListChanged,
    ResourceUpdated,
    ToolsListChanged,
)
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ServerMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from mcp_types import PROTOCOL_VERSION_META_KEY as PROTOCOL_VERSION_META
from pydantic import BaseModel, Field

from ..errors import Conflict, Forbidden, InvalidRequest, NotFound, RateLimited, Unavailable
from ..hits import Hits
from ..serve.auth import ANONYMOUS, AuthConfig, AuthError
from ..serve.mcp import (
    DEGRADED,
    RECORD_DESCRIPTION,
    UNKNOWN_NAMESPACES,
    Arguments,
    FoundTool,
    RecordArgs,
    RecordedUse,
    SearchArgs,
    ToolSearchMcp,
    checked_arguments,
)
from ..serve.service import Principal
from ..version import __version__
from .core import STDIO, Gateway, ShuttingDown, http_session
from .upstream import Relay, ToolResult, UpstreamRefused, UpstreamUnavailable, error_result, text_result

logger = logging.getLogger(__name__)
EXPOSE = ("none", "found")
EXPOSED_PER_SESSION = 64
UNSUBSCRIBE_WITHIN_S = 10.0  # when a listen stream ends, the upstream unsubscriptions it leaves behind
SESSIONS_KEPT = 10_000  # 2025-protocol sessions told of prompt and resource changes (the latest ones)
# 2026 clients may cache lists and reads: these change with the upstreams and differ per token, so a result
# is stale at once and never shared (an upstream's own hints on a read pass through)
CACHE_HINTS = {method: CacheHint(0, "private")
               for method in ("prompts/list", "resources/list", "resources/templates/list", "resources/read")}
_NATIVE_NAME = re.compile(r"[^A-Za-z0-9_.-]")

INSTRUCTIONS = ("toolscout is a gateway to many tool servers. Call search_tools with the task in plain language to "
                "find the tools that fit it, then call_tool with a found tool's id and its arguments: the call "
                "goes to the server that runs the tool, and its result comes back unchanged. toolscout learns "
                "from the calls which tools serve which tasks. An empty search result means no tool fits, unless "
                "not_searchable names servers whose tools could not be searched yet.")
SEARCH_DESCRIPTION = ("Find the tools that fit a task, best first, among every server behind this gateway. Returns "
                      "each tool's id (pass it to call_tool), name, description and input schema (JSON Schema), "
                      "with the namespace (server) that runs it and whether that server answers now. Returns no "
                      "tools when nothing fits; not_searchable names the servers whose tools could not be "
                      "searched (still starting, or down).")
CALL_DESCRIPTION = ("Call a tool that search_tools found: name is its id (or its name, when only one tool has it), "
                    "arguments an object matching its input schema. Returns the tool's own result.")


@dataclasses.dataclass
class _Host:
    """A host served over a pipe (the gateway's stdio, or a host attached over the index's socket): who it is
    and what its `initialize` declared it can answer."""

    principal: Principal
    session: str
    capabilities: dict = dataclasses.field(default_factory=dict)


# the host whose connection a handler serves: set by the task that serves it, inherited by its handlers
_HOST: "contextvars.ContextVar[Optional[_Host]]" = contextvars.ContextVar("toolscout_gateway_host", default=None)


class GatewayFoundTool(FoundTool):
    available: bool = Field(description="Whether the server that runs the tool answers now.")


class NotSearchable(BaseModel):
    server: str = Field(description="The server (namespace) whose tools the search could not find.")
    status: Literal["starting", "down"] = Field(description="starting: it has not listed its tools yet; down: it "
                                                            "does not answer, and its tools are not in the index.")
    reason: str = Field(description="Why, in words.")


class GatewaySearchResult(BaseModel):
    tools: list[GatewayFoundTool]
    abstained: bool = Field(description="True when no tool fits the task.")
    unknown_namespaces: list[str] = Field(default_factory=list, description=UNKNOWN_NAMESPACES)
    not_searchable: list[NotSearchable] = Field(
        default_factory=list, description="Servers whose tools this search could not find (still starting after "
                                          "the gateway waited for them, or down); search again later for theirs.")
    degraded: Optional[dict[str, str]] = Field(None, description=DEGRADED)


class CallArgs(Arguments):
    name: str = Field(min_length=1, max_length=1000, description="The tool's id, as search_tools returned it.")
    arguments: dict[str, Any] = Field(default_factory=dict, description="The tool's arguments.")


def _tool(name: str, title: str, description: str, args: type[BaseModel], result: type[BaseModel] | None) -> Any:
    return types.Tool(name=name, title=title, description=description, input_schema=args.model_json_schema(),
                      output_schema=result.model_json_schema() if result is not None else None)


OWN_TOOLS = [_tool("search_tools", "Search tools", SEARCH_DESCRIPTION, SearchArgs, GatewaySearchResult),
             _tool("call_tool", "Call a tool", CALL_DESCRIPTION, CallArgs, None),
             _tool("record_tool_use", "Record tool use", RECORD_DESCRIPTION, RecordArgs, RecordedUse)]


class GatewayMcp(ToolSearchMcp):
    """The gateway's MCP server (see the module doc); `server` is the SDK's low-level `Server`. What
    `search_tools` and `record_tool_use` do, and who calls, is `toolscout serve`'s (`ToolSearchMcp`); the
    gateway's search waits for upstreams and says which it could not search, and its found tools say
    whether their upstream answers."""

    found_tool = GatewayFoundTool

    def __init__(self, gateway: Gateway, *, auth: AuthConfig | None = None, stdio_principal: Principal = STDIO,
                 expose: str = "none", metrics: Any = None):
        if expose not in EXPOSE:
            raise ValueError(f"unknown --expose {expose!r}; known: {', '.join(EXPOSE)}")
        super().__init__(gateway.service, auth=auth, stdio_principal=stdio_principal, metrics=metrics)
        self.gateway, self.expose = gateway, expose
        # 2026-protocol listen streams, one bus per set of namespaces a caller sees (a stream has no session to
        # address; a change of a server's lists reaches the streams of callers who may see that server)
        self._buses: dict[frozenset[str] | None, _Bus] = {}
        self._exposed: OrderedDict[str, OrderedDict[str, str]] = OrderedDict()  # session -> native name -> id
        # 2025-protocol sessions: key -> (ServerSession, who it is)
        self._sessions: OrderedDict[str, tuple[Any, Principal]] = OrderedDict()
        self._subscribers: dict[str, dict[str, str]] = {}  # resource (gateway's key) -> session key -> its URI
        self.server = _Announcing("toolscout-gateway", version=__version__, instructions=INSTRUCTIONS,
                                   on_list_tools=self._list_tools, on_call_tool=self._call_tool,
                                   on_subscriptions_listen=self._listen_for_events,
                                   on_list_prompts=self._list_prompts, on_get_prompt=self._get_prompt,
                                   on_list_resources=self._list_resources, on_read_resource=self._read_resource,
                                   on_list_resource_templates=self._list_resource_templates,
                                   on_subscribe_resource=self._subscribe, on_unsubscribe_resource=self._unsubscribe,
                                   on_completion=self._complete, cache_hints=CACHE_HINTS)
        self.server.middleware = []  # the SDK's tracing layer: a span per message, for nothing without an exporter
        self.server.notifications = NotificationOptions(tools_changed=self.expose == "found", prompts_changed=True,
                                                        resources_changed=True)
        gateway.listen(self._changed)

    def initialization_options(self) -> Any:
        return self.server.create_initialization_options()

    async def run_stdio(self) -> None:
        from mcp.server.stdio import stdio_server

        from .stdio import pipe_stdio

        serving = _HOST.set(_Host(self.stdio_principal, "stdio"))
        try:
            async with pipe_stdio(self) as (stdin, stdout), stdio_server(stdin, stdout) as (read, write):
                await self.server.run(read, write, self.initialization_options())
        finally:
            _HOST.reset(serving)

    async def run_local(self, reader: Any, writer: Any, pid: int,
                        searches: list[tuple[str, list[str], int]] = ()) -> None:
        """Serve a host attached over the index's socket (asyncio streams; `hosts.py`) until it leaves, as the
        stdio host is served, but as a session and feedback source of its own: `local:PID` (the process that
        bridges that host), `session:local:PID`. `searches`: those it made through the previous owner."""
        from mcp.server.stdio import stdio_server

        from .stdio import stream_pipes

        name = f"local:{pid}"
        self.gateway.resume_session(name, list(searches))
        serving = _HOST.set(_Host(dataclasses.replace(self.stdio_principal, name=name, source=f"session:{name}"), name))
        try:
            async with stream_pipes(reader, writer, self) as (lines, out), stdio_server(lines, out) as (read, write):
                await self.server.run(read, write, self.initialization_options())
        finally:
            _HOST.reset(serving)

    # the fast lane over stdio (stdio.FastLane) ----------------------------------------------------
    def claims(self, message: dict) -> bool:
        """`call_tool` requests over stdio are answered ahead of the SDK (stdio.py says why)."""
        params = message.get("params")
        return (message.get("method") == "tools/call" and "id" in message and isinstance(params, dict)
                and params.get("name") == "call_tool" and isinstance(params.get("arguments", {}), dict))

    async def answer(self, message: dict, lane: Any) -> dict:
        """The response to a claimed request; `lane` (stdio.LaneChannel) carries its progress notifications
        and the elicitation requests it makes of the host."""
        params = message["params"]
        meta = params.get("_meta") if isinstance(params.get("_meta"), dict) else {}
        request = _StdioRequest(str(meta.get(PROTOCOL_VERSION_META, "")), "call_tool", params.get("arguments") or {})
        host = _HOST.get()
        elicits = host is not None and host.capabilities.get("elicitation") is not None
        request.relay = lane.relay(meta.get("progressToken"), elicits=elicits)
        return {"jsonrpc": "2.0", "id": message["id"], "result": await self._call_tool(request, request)}

    # handlers ----------------------------------------------------------------------------------
    async def _list_tools(self, ctx: Any, params: Any) -> Any:
        tools = list(OWN_TOOLS)
        found = self._exposed.get(self._session(ctx))
        if found:
            principal = self._principal(ctx)
            for native, tool_id in found.items():
                try:
                    tool = self.gateway.service.get(tool_id, principal, held_first=True)
                except NotFound:  # removed by its upstream since it was found
                    continue
                tools.append(types.Tool(name=native, description=tool.description or tool.name,
                                        input_schema=tool.input_schema(), title=tool.title))
        return types.ListToolsResult(tools=tools)

    async def _call_tool(self, ctx: Any, params: Any) -> Any:
        return _tagged(ctx, await self._answer(ctx, params.name, params.arguments or {}))

    async def _answer(self, ctx: Any, name: str, arguments: dict[str, Any]) -> ToolResult:
        try:
            principal = self._principal(ctx)
            if name == "call_tool":
                args = checked_arguments(name, CallArgs, arguments)
                return await self._forward(ctx, principal, args.name, args.arguments)
            if name == "search_tools":
                return await self._search(ctx, principal, checked_arguments(name, SearchArgs, arguments))
            if name == "record_tool_use":
                return self._record(principal, checked_arguments(name, RecordArgs, arguments))
            exposed = self._exposed.get(self._session(ctx), {}).get(name)
            if exposed is not None:
                return await self._forward(ctx, principal, exposed, arguments)
            raise NotFound(self._no_such_tool(ctx, name))
        except ShuttingDown as exc:
            return error_result(_stopping(exc))
        except (NotFound, Forbidden, InvalidRequest, Conflict, RateLimited, Unavailable, UpstreamUnavailable) as exc:
            return error_result(str(exc))
        except AuthError as exc:
            return error_result(exc.message)
        except Exception:  # a bug inside toolscout: logged; the agent gets an error, not a hang
            logger.exception("gateway: %s failed", name)
            return error_result(f"{name}: an internal error in toolscout (logged on the gateway)")

    def _no_such_tool(self, ctx: Any, name: str) -> str:
        """Why `name` is no tool of this session: its tools are the gateway's own and, with --expose found, those
        its searches found (named, the nearest first, as tools/list lists them)."""
        own = "search_tools, call_tool and record_tool_use (call_tool forwards to the tools that search_tools finds)"
        if self.expose != "found":
            return f"no tool {name!r} here: this gateway's tools are {own}"
        found = list(self._exposed.get(self._session(ctx), {}))
        if not found:
            return f"no tool {name!r} here: this session's tools are {own}, and the tools its searches find (none yet)"
        near = difflib.get_close_matches(name, found, n=3)
        shown = near + [native for native in reversed(found) if native not in near][:10 - len(near)]
        more = f" and {len(found) - len(shown)} more (tools/list lists them)" if len(found) > len(shown) else ""
        return (f"no tool {name!r} here: this session's tools are {own}, and the {len(found)} its searches found: "
                f"{', '.join(shown)}{more}")

    async def _search(self, ctx: Any, principal: Principal, args: SearchArgs) -> Any:
        session = self._session(ctx)
        answer = await self.search_tools(args.task, args.k, principal, args.namespaces, session)
        if self.expose == "found" and self._expose(session, [tool["id"] for tool in answer["tools"]]):
            await self._announce_tools_changed(ctx, principal)
        return text_result(answer)

    async def search(self, task: str, k: int, principal: Principal, namespaces: list[str] | None,
                     session: str) -> tuple[Hits, dict[str, Any]]:
        """The gateway's search (it waits for upstreams still starting), and the upstreams it could not search."""
        searched = await self.gateway.search(task, k, principal=principal, session=session, namespaces=namespaces)
        return searched.hits, {"not_searchable": searched.not_searchable}

    def found(self, hit: dict[str, Any]) -> dict[str, Any]:
        found = super().found(hit)
        found["available"] = hit.get("available", True) is not False
        return found

    async def _forward(self, ctx: Any, principal: Principal, name: str, arguments: dict[str, Any]) -> Any:
        if not isinstance(arguments, dict):
            raise InvalidRequest("call_tool: arguments must be an object")
        if principal is ANONYMOUS:  # reads are open, but a call acts on someone's behalf
            raise Forbidden("calling tools through this gateway needs a bearer token")
        request = getattr(ctx, "request", None)
        headers = dict(request.headers) if request is not None else {}
        return await self.gateway.call(name, arguments, principal=principal, session=self._session(ctx),
                                       headers=headers, relay=self._relay(ctx))

    def _record(self, principal: Principal, args: RecordArgs) -> Any:
        return text_result(self.record_tool_use(args.task, args.tool_ids, args.outcome, principal).model_dump())

    # what passes through ------------------------------------------------------------------------
    def _relay(self, ctx: Any) -> Relay:
        """The agent's side of one forwarded request: its progress token, its client's elicitation."""
        relay = getattr(ctx, "relay", None)
        if relay is not None:  # the stdio fast lane made it
            return relay
        self._remember(ctx)
        meta = ctx.meta or {}
        progress = elicit = None
        if meta.get("progressToken", meta.get("progress_token")) is not None:
            async def progress(value: float, total: float | None, message: str | None) -> None:
                await ctx.session.report_progress(value, total, message)
        capabilities = ctx.session.client_capabilities
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS and ctx.session.can_send_request \
                and capabilities is not None and capabilities.elicitation is not None:
            async def elicit(params: dict[str, Any]) -> dict[str, Any]:
                request = types.ElicitRequest(params=types.ElicitRequestFormParams.model_validate(params)
                                              if params.get("mode", "form") == "form"
                                              else types.ElicitRequestURLParams.model_validate(params))
                answer = await ctx.session.send_request(request, types.ElicitResult,
                                                        metadata=ServerMessageMetadata(related_request_id=ctx.request_id))
                return answer.model_dump(by_alias=True, mode="json", exclude_none=True)
        return Relay(progress, elicit)

    def observe(self, message: dict) -> None:
        """A message the stdio lane saw go to the SDK: the host's initialize tells what it can answer."""
        host = _HOST.get()
        if host is not None and message.get("method") == "initialize" and isinstance(message.get("params"), dict):
            capabilities = message["params"].get("capabilities")
            host.capabilities = capabilities if isinstance(capabilities, dict) else {}

    async def _list_prompts(self, ctx: Any, params: Any) -> Any:
        self._remember(ctx)
        principal = self._principal(ctx)
        await self.gateway.extras_listed(principal)
        return _tagged(ctx, {"prompts": self.gateway.prompts(principal)})

    async def _list_resources(self, ctx: Any, params: Any) -> Any:
        self._remember(ctx)
        principal = self._principal(ctx)
        await self.gateway.extras_listed(principal)
        return _tagged(ctx, {"resources": self.gateway.resources(principal)})

    async def _list_resource_templates(self, ctx: Any, params: Any) -> Any:
        principal = self._principal(ctx)
        await self.gateway.extras_listed(principal)
        return _tagged(ctx, {"resourceTemplates": self.gateway.resource_templates(principal)})

    async def _get_prompt(self, ctx: Any, params: Any) -> Any:
        async with _as_rpc_errors():
            return _tagged(ctx, await self.gateway.get_prompt(params.name, params.arguments, self._principal(ctx),
                                                              self._relay(ctx)))

    async def _read_resource(self, ctx: Any, params: Any) -> Any:
        async with _as_rpc_errors():
            return _tagged(ctx, await self.gateway.read_resource(str(params.uri), self._principal(ctx),
                                                                 self._relay(ctx)))

    async def _subscribe(self, ctx: Any, params: Any) -> Any:
        async with _as_rpc_errors():
            key = await self.gateway.subscribe(str(params.uri), self._principal(ctx))
        self._remember(ctx)
        self._subscribers.setdefault(key, {})[self._session(ctx)] = str(params.uri)
        return {}

    async def _unsubscribe(self, ctx: Any, params: Any) -> Any:
        async with _as_rpc_errors():
            key = await self.gateway.unsubscribe(str(params.uri), self._principal(ctx))
        self._subscribers.get(key, {}).pop(self._session(ctx), None)
        return {}

    async def _complete(self, ctx: Any, params: Any) -> Any:
        ref = params.ref.model_dump(by_alias=True, mode="json", exclude_none=True)
        argument = params.argument.model_dump(by_alias=True, mode="json", exclude_none=True)
        context = params.context.model_dump(by_alias=True, mode="json", exclude_none=True) if params.context else None
        async with _as_rpc_errors():
            return _tagged(ctx, await self.gateway.complete(ref, argument, context, self._principal(ctx)))

    async def _listen_for_events(self, ctx: Any, params: Any) -> Any:
        """A 2026-protocol listen stream: the resources it names are subscribed upstream while it lasts."""
        uris = list(params.notifications.resource_subscriptions or [])
        principal, keys = self._principal(ctx), []
        try:
            for uri in uris:
                async with _as_rpc_errors():
                    keys.append((await self.gateway.subscribe(uri, principal), uri))
            return await self._bus(principal).handler(ctx, params)
        finally:  # the stream ends by cancellation: the unsubscribing is shielded from it (and bounded)
            with anyio.CancelScope(shield=True), anyio.move_on_after(UNSUBSCRIBE_WITHIN_S):
                for key, uri in keys:
                    try:
                        await self.gateway.unsubscribe(uri, principal)
                    except Exception as exc:  # the stream is over either way
                        logger.debug("unsubscribing %s after its listen stream ended: %s", key, exc)

    def _bus(self, principal: Principal) -> "_Bus":
        """The listen streams' bus of the callers who see what `principal` sees (made on first use; as many as
        the token rules have namespace sets)."""
        bus = self._buses.get(principal.namespaces)
        if bus is None:
            bus = self._buses[principal.namespaces] = _Bus(principal)
        return bus

    async def _changed(self, upstream: str, what: str, uri: str | None) -> None:
        """An upstream's prompts or resources changed (core.Listener): tell the clients of the agents who may
        see that upstream."""
        sees = [bus.events for bus in list(self._buses.values()) if bus.seen_by.sees_namespace(upstream)]
        if what == "updated" and uri is not None:
            for bus in sees:
                await bus.publish(ResourceUpdated(uri=uri))
            for session, subscribed_as in list(self._subscribers.get(uri, {}).items()):
                await self._notify(session, lambda s, u=subscribed_as: s.send_resource_updated(u))
            return
        for bus in sees:
            await bus.publish(PromptsListChanged() if what == "prompts" else ResourcesListChanged())
        for session, (_s, principal) in list(self._sessions.items()):
            if principal.sees_namespace(upstream):
                await self._notify(session, lambda s: s.send_prompt_list_changed() if what == "prompts"
                                   else s.send_resource_list_changed())

    async def _notify(self, session: str, send: Any) -> None:
        server_session = self._sessions.get(session, (None, None))[0]
        if server_session is None:
            return
        try:
            await send(server_session)
        except Exception as exc:  # a session that is gone: forget it
            logger.debug("session %s not told of a change: %s", session, exc)
            self._sessions.pop(session, None)

    def _remember(self, ctx: Any) -> None:
        """Keep a 2025-protocol session, to tell it later when prompts or resources change."""
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return
        key = self._session(ctx)
        self._sessions[key] = (ctx.session, self._principal(ctx))
        self._sessions.move_to_end(key)
        while len(self._sessions) > SESSIONS_KEPT:
            self._sessions.popitem(last=False)

    # sessions ----------------------------------------------------------------------------------
    def _principal(self, ctx: Any) -> Principal:
        return self.principal(getattr(ctx, "request", None))

    def piped_principal(self) -> Principal:
        """A host over a pipe: the gateway's stdio, or one attached over the socket (each its own principal)."""
        host = _HOST.get()
        return host.principal if host is not None else self.stdio_principal

    def _session(self, ctx: Any) -> str:
        request = getattr(ctx, "request", None)
        if request is None:
            host = _HOST.get()
            return host.session if host is not None else "stdio"
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

    async def _announce_tools_changed(self, ctx: Any, principal: Principal) -> None:
        """Tell the host to list tools again: on the 2025 protocol through the session, on the 2026 one to the
        `subscriptions/listen` streams of callers who see what this one sees (that protocol has no sessions)."""
        try:
            await ctx.session.send_tool_list_changed()
        except Exception as exc:  # a session that cannot take notifications still has its search result
            logger.debug("tools/list_changed not sent: %s", exc)
        await self._bus(principal).events.publish(ToolsListChanged())


class _Bus:
    """The 2026-protocol listen streams of callers who see what `seen_by` sees, and the events they hear."""

    def __init__(self, seen_by: Principal):
        self.seen_by = seen_by
        self.events = InMemorySubscriptionBus()
        self.handler = ListenHandler(self.events)


class _Announcing(Server):
    """The SDK's server, announcing the list changes the gateway sends (`notifications`) whichever transport
    answers the handshake: the streamable-HTTP session manager asks the server itself, with no options, and
    its hosts were told no list ever changes."""

    notifications = NotificationOptions()

    def create_initialization_options(self, notification_options: NotificationOptions | None = None,
                                      *args: Any, **kwargs: Any) -> Any:
        return super().create_initialization_options(notification_options or self.notifications, *args, **kwargs)


def _stopping(exc: ShuttingDown) -> str:
    """What a call refused or cancelled at shutdown says. An attached host (hosts.py) is not losing its
    gateway: its bridge takes it on to the gateway that takes the index over, so it is told the owner
    changed, and whether calling again is safe: a refused call did nothing; a cancelled one may have acted."""
    host = _HOST.get()
    if host is None or not host.session.startswith("local:") or not exc.what:
        return str(exc)
    stopped = f"the toolscout gateway that served this index (pid {os.getpid()}) stopped"
    if exc.ran:
        return (f"{stopped} while {exc.what} ran: it was cancelled (its server was told) and may have acted "
                "already; another gateway takes the index over: call it again only if running it twice is safe")
    return f"{stopped} before {exc.what} was made (nothing was done); another gateway takes the index over: call it again"


def _tagged(ctx: Any, result: dict[str, Any]) -> dict[str, Any]:
    """`result` as the protocol of `ctx` wants it: the 2026 wire tags every result with its type."""
    if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
        result.setdefault("resultType", "complete")
    return result


class _StdioRequest:
    """A fast-lane request as the handlers read it: its context (no HTTP request), its params, and its relay
    (the lane's progress notifications and elicitation requests)."""

    request = None
    relay: Relay | None = None

    def __init__(self, protocol_version: str, name: str, arguments: dict):
        self.protocol_version, self.name, self.arguments = protocol_version, name, arguments


# toolscout's errors as the JSON-RPC errors a client shows (prompts, resources and completions answer with
# errors, not error results); a refusal keeps the upstream's own code
_RPC_CODES = ((NotFound, types.INVALID_PARAMS), (InvalidRequest, types.INVALID_PARAMS),
              (Forbidden, types.INVALID_REQUEST), (AuthError, types.INVALID_REQUEST),
              (UpstreamUnavailable, types.INTERNAL_ERROR), (ShuttingDown, types.INTERNAL_ERROR))


class _as_rpc_errors:
    """`async with _as_rpc_errors():` turns toolscout's errors into MCPError, with their message."""

    async def __aenter__(self) -> None:
        return None

    async def __aexit__(self, kind: Any, exc: Any, _tb: Any) -> bool:
        if exc is None or isinstance(exc, MCPError):
            return False
        if isinstance(exc, UpstreamRefused):
            raise MCPError(code=exc.code, message=str(exc)) from None
        for error, code in _RPC_CODES:
            if isinstance(exc, error):
                raise MCPError(code=code, message=getattr(exc, "message", None) or str(exc)) from None
        return False
