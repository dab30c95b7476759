"""An MCP server behind the gateway, over stdio (a command the gateway starts) or streamable HTTP, through
the official SDK's client.

One connection per upstream carries every call (JSON-RPC multiplexes them, so a slow call holds up no
other). The supervisor (`run`) connects, lists the tools (and the prompts, resources and resource
templates the server has), hands them to the gateway and then watches the connection until it ends:

- a stdio server that exits closes its stdout, which ends the connection at once; an HTTP server that goes
  away fails the next call, ping or re-list, which ends it too;
- a server that stays alive but stops answering is caught by pings: one every `ping_every` seconds, and
  one at once after a call times out. A server that misses `MISSED_PINGS` pings in a row (each given
  `PING_TIMEOUT_S`), or times out `TIMED_OUT_CALLS` calls in a row, is hung: it is marked down at once (its
  calls fail, naming it) and its connection ended.

Then it reconnects with backoff (`upstream.Backoff`), restarting a stdio server's process. A server whose
config could not be resolved (`UpstreamSpec.problem`) is never started: it is down with that reason.

The listing is kept current by the server's `notifications/*/list_changed` (on the 2025 protocol) or a
`subscriptions/listen` stream (on the 2026 one), and by a periodic re-list whatever the server supports.
Listings, calls and the requests the gateway forwards go through the session's raw requests: a tool whose
schema the SDK's models would refuse is skipped alone (the ingest parser says why), and results are
forwarded as the server sent them. A forwarded request carries the agent's side (`upstream.Relay`): the
server's progress notifications go to it, and its elicitation requests go to the one call in flight that
can answer them. Cancelling the task that awaits a call sends the server `notifications/cancelled`.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, Mapping

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ClientMessageMetadata
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import TypeAdapter, ValidationError

from ..ingest import parse_tools
from ..ingest.common import LoadReport
from ..ingest.live_mcp import error_reason
from ..tool import Tool
from ..version import __version__
from .config import PING_EVERY_S, UpstreamSpec, find_command
from .mcp_connection import Connection, ServerLog, first_error, quiet_sdk_parse_errors
from .upstream import (
    NO_RELAY,
    Backoff,
    Extras,
    Listing,
    ListingNotRecorded,
    ListingSink,
    Notice,
    Relay,
    ToolResult,
    UpstreamRefused,
    UpstreamStatus,
    UpstreamUnavailable,
    error_result,
    next_attempt,
    sent_and_lost,
    timed_out,
)

logger = logging.getLogger(__name__)
MAX_PAGES = 1000
_RESULT = TypeAdapter(dict[str, Any])  # results stay the dicts they came as (the SDK has checked their shape)
CONNECT_TIMEOUT_S = 60.0
PING_TIMEOUT_S = 5.0
MISSED_PINGS = 2  # in a row (the second sent as soon as the first is missed): the server is hung
TIMED_OUT_CALLS = 3  # in a row, whatever its pings say: the server is hung
RECORD_AGAIN_S = 5.0  # a listing the gateway could not record (its database away) is tried again this often
# the requests the gateway forwards as they are (besides tools/call), and their typed forms
_FORWARDED = {"prompts/get": (types.GetPromptRequest, types.GetPromptRequestParams),
              "resources/read": (types.ReadResourceRequest, types.ReadResourceRequestParams),
              "resources/subscribe": (types.SubscribeRequest, types.SubscribeRequestParams),
              "resources/unsubscribe": (types.UnsubscribeRequest, types.UnsubscribeRequestParams),
              "completion/complete": (types.CompleteRequest, types.CompleteRequestParams)}
_LISTS = (("prompts", types.ListPromptsRequest), ("resources", types.ListResourcesRequest),
          ("resourceTemplates", types.ListResourceTemplatesRequest))


class McpUpstream:
    """One MCP server behind the gateway (see the module doc)."""

    def __init__(self, spec: UpstreamSpec, *, log_dir: Path | None = None, relist_every: float = 300.0,
                 ping_every: float = PING_EVERY_S):
        self.spec = spec
        self.name, self.timeout, self.forward_headers = spec.name, spec.timeout, spec.forward_headers
        self.status = UpstreamStatus(spec.name, spec.kind, spec.describe())
        self.relist_every, self.ping_every = relist_every, ping_every
        self.extras = Extras()
        self.log = ServerLog((log_dir / f"{spec.name}.log") if log_dir is not None and spec.kind == "stdio" else None)
        self.subscribed: set[str] = set()  # resource URIs subscribed upstream (kept across reconnections)
        self._client: Any = None
        self._connection: Connection | None = None
        self._sink: ListingSink | None = None
        self._notice: Notice | None = None
        self._events: Any = None  # _Signals, made inside the event loop (`_signals`)
        self._relays: dict[int, Relay] = {}  # calls in flight that can answer an elicitation
        self._in_flight = 0  # requests in flight, those that cannot answer one too (to say why none did)
        self._timeouts_in_a_row = 0
        quiet_sdk_parse_errors()

    # supervision -------------------------------------------------------------------------------
    async def run(self, sink: ListingSink, notice: Notice | None = None) -> None:
        self._sink, self._notice = sink, notice
        self._signals()
        if self.spec.problem:  # nothing to try until the config is fixed and the gateway restarted
            self.status.change("down", f"not started: {self.spec.problem}")
            logger.warning("upstream %s is down: %s", self.name, self.status.last_error)
            await anyio.sleep_forever()
        backoff = Backoff()
        while True:
            started = time.monotonic()
            try:
                await self._connect_and_serve()
                why = self._ended()
            except Exception as exc:  # every failure of one upstream ends here, never in the gateway
                why = self._failed(exc)
            self._client = self._connection = None
            self._events.disconnected()
            delay = backoff.next(time.monotonic() - started)
            repeated = self.status.state != "up" and (self.status.last_error or "").startswith(why)
            self.status.change("down", f"{why} ({next_attempt(delay)})")
            logger.log(logging.INFO if repeated else logging.WARNING, "upstream %s is down: %s", self.name,
                       self.status.last_error)
            await anyio.sleep(delay)
            self.status.change("starting")

    def _ended(self) -> str:
        connection = self._connection
        if connection is not None and connection.hung:
            return f"it stopped answering ({connection.hung}), so it was restarted"
        return "the connection closed" + self.log.last_words()

    def _failed(self, exc: BaseException) -> str:
        while getattr(exc, "exceptions", None):  # a task group's: the first is what failed
            exc = exc.exceptions[0]  # type: ignore[attr-defined]
        if isinstance(exc, ListingNotRecorded):  # the gateway's failure (its database's), not the server's
            return str(exc)
        if isinstance(exc, OSError) and not isinstance(exc, TimeoutError) and self.spec.kind == "stdio":
            return f"cannot start the command {self.spec.command!r}: {exc.strerror or exc}" + self.log.last_words()
        in_handshake = self._connection is not None and not self._connection.handshaken
        if in_handshake and isinstance(exc, MCPError):
            return self._handshake_failed(exc) + self.log.last_words()
        return error_reason(exc) + self.log.last_words()

    def _handshake_failed(self, exc: MCPError) -> str:
        """Why a server failed the MCP handshake, in words that say what it is ("MCPError: Method not found"
        was all a command that echoes its input, such as /bin/cat, got; "Connection closed", one that exits)."""
        if exc.code == types.CONNECTION_CLOSED:
            return ("its process exited (or closed its stdout) before the MCP handshake" if self.spec.kind == "stdio"
                    else "the connection closed before the MCP handshake")
        if exc.code == types.METHOD_NOT_FOUND:
            return f"it does not speak MCP (it answered the initialize request with {exc})"
        return f"it refused the MCP handshake: {exc} (code {exc.code})"

    async def _connect_and_serve(self) -> None:
        """One connection, from the handshake (within a deadline) until it ends."""
        connect_within = min(CONNECT_TIMEOUT_S, max(self.timeout, 10.0))
        with anyio.CancelScope(deadline=anyio.current_time() + connect_within) as deadline:
            async with AsyncExitStack() as stack:
                connection = self._connection = Connection(self._transport(stack), self.name)
                client = await stack.enter_async_context(Client(
                    connection.streams(), message_handler=self._on_message, cache=None,
                    elicitation_callback=self._elicit,
                    client_info=types.Implementation(name="toolscout-gateway", version=__version__)))
                connection.handshaken, connection.protocol = True, client.protocol_version
                await self._publish(await self._list(client, connection))
                known = await self._list_extras(client)
                await self._resubscribe(client)
                deadline.deadline = math.inf  # connected: from here on the connection lasts as long as it can
                self._client = client
                self._timeouts_in_a_row = 0
                self.status.connects += 1
                self.status.change("up")
                self._events.connected()
                await self._announce(known)  # hosts that listed before it came up hear that it has some
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._listen_for_changes, client)
                    tasks.start_soon(self._keep_listing_current, client, connection)
                    tasks.start_soon(self._watch_health, client, connection)
                    await connection.closed.wait()
                    tasks.cancel_scope.cancel()
        if deadline.cancelled_caught:
            raise TimeoutError(f"no answer to the MCP handshake and tools/list within {connect_within:g} s")

    def _transport(self, stack: AsyncExitStack) -> Any:
        if self.spec.kind == "stdio":
            command = self.spec.command or ""
            params = StdioServerParameters(command=find_command(command) or command, args=list(self.spec.args),
                                           env=dict(self.spec.env) or None, cwd=self.spec.cwd)
            return stdio_client(params, errlog=stack.enter_context(self.log.open(self.spec.describe())))
        http = httpx2.AsyncClient(headers=dict(self.spec.headers), timeout=httpx2.Timeout(30.0, read=None))
        return streamable_http_client(self.spec.url, http_client=http)

    # health ------------------------------------------------------------------------------------
    async def _watch_health(self, client: Any, connection: Connection) -> None:
        """Ping every `ping_every` seconds (0: only after a timed-out call), and at once after a call timed
        out; end the connection of a server that misses MISSED_PINGS in a row or times out
        TIMED_OUT_CALLS calls in a row (see the module doc)."""
        missed = 0
        while True:
            if missed == 0:
                with anyio.move_on_after(self.ping_every if self.ping_every > 0 else math.inf):
                    await self._events.check.wait()
                self._events.check = anyio.Event()
            if self._timeouts_in_a_row >= TIMED_OUT_CALLS:
                return self._hung(connection, f"{self._timeouts_in_a_row} calls in a row got no answer in time")
            missed = 0 if await self._pinged(client) else missed + 1
            if missed >= MISSED_PINGS:
                return self._hung(connection, f"{missed} pings in a row got no answer within {PING_TIMEOUT_S:g} s")

    async def _pinged(self, client: Any) -> bool:
        """Whether the server answered a ping in time (an error is an answer: it is alive)."""
        try:
            await client.session.send_request(types.PingRequest(), _RESULT, request_read_timeout_seconds=PING_TIMEOUT_S)
        except MCPError as exc:
            if exc.code == types.REQUEST_TIMEOUT:
                return False
        self.log.answered()
        return True

    def _hung(self, connection: Connection, why: str) -> None:
        """The server stopped answering: its calls fail from now on, naming it, while it is restarted."""
        self._client = None
        self.status.restarts_for_hangs += 1
        self.status.change("down", f"it stopped answering ({why}); restarting it")
        logger.warning("upstream %s is hung (%s): restarting it", self.name, why)
        connection.end(hung=why)

    # listing -----------------------------------------------------------------------------------
    async def _pages(self, client: Any, request_type: Any, key: str) -> list[Any]:
        """Every item of every page of one of the server's lists."""
        items: list[Any] = []
        cursor = None
        for _ in range(MAX_PAGES):
            page = await client.session.send_request(
                request_type(params=types.PaginatedRequestParams(cursor=cursor)), _RESULT,
                request_read_timeout_seconds=self.timeout)
            found = page.get(key)
            items.extend(found if isinstance(found, list) else [])
            cursor = page.get("nextCursor")
            if not cursor:
                break
        self.log.answered()
        return items

    async def _list(self, client: Any, connection: Connection) -> Listing:
        """Every page of tools/list, each tool parsed on its own: a broken one is skipped with its reason
        (by the connection's screen when the SDK would refuse it, else by the ingest parser)."""
        connection.skipped.clear()
        raw = await self._pages(client, types.ListToolsRequest, "tools")
        report = LoadReport()
        tools = parse_tools({"tools": raw}, format="mcp", lenient=True, source=f"upstream {self.name}",
                            namespace=self.name, report=report, as_served=True)
        for warning in report.warnings:
            logger.warning("%s", warning)
        return Listing(self.name, tools, tuple(connection.skipped) + tuple(report.skipped))

    async def _list_extras(self, client: Any) -> Extras:
        """The server's prompts, resources and resource templates, as its capabilities say it has them; a
        list it fails to give is logged and left empty (its tools still serve). Returns what was known before
        (`_announce` tells the agents what changed)."""
        capabilities = client.server_capabilities
        has = {"prompts": capabilities.prompts is not None, "resources": capabilities.resources is not None,
               "resourceTemplates": capabilities.resources is not None}
        found: dict[str, tuple] = {}
        for key, request_type in _LISTS:
            try:
                found[key] = tuple(d for d in await self._pages(client, request_type, key) if isinstance(d, dict)) \
                    if has[key] else ()
            except (MCPError, ValidationError) as exc:
                logger.info("upstream %s: no %s (%s)", self.name, key, error_reason(exc))
                found[key] = ()
        before, self.extras = self.extras, Extras(
            found["prompts"], found["resources"], found["resourceTemplates"],
            subscribe=bool(getattr(capabilities.resources, "subscribe", False)),
            completions=capabilities.completions is not None)
        return before

    async def _announce(self, before: Extras) -> None:
        """Tell the agents which of the server's lists changed since `before`."""
        if self._notice is None:
            return
        if before.prompts != self.extras.prompts:
            await self._notice(self.name, "prompts", None)
        if (before.resources, before.templates) != (self.extras.resources, self.extras.templates):
            await self._notice(self.name, "resources", None)

    async def _publish(self, listing: Listing) -> None:
        for where, why in listing.skipped:
            logger.warning("upstream %s: tool skipped (%s): %s", self.name, where, why)
        assert self._sink is not None
        await self._sink(listing)
        self.status.tools = len(listing.tools)
        self.status.skipped = [{"where": where, "reason": why} for where, why in listing.skipped]

    async def relist(self) -> None:
        if self._events is not None:
            self._events.relist.set()

    async def _keep_listing_current(self, client: Any, connection: Connection) -> None:
        """Re-list on every change notification, and every `relist_every` seconds whatever happens. A listing
        the gateway could not record is listed and recorded again every RECORD_AGAIN_S on the same connection:
        the server is not at fault, and its calls go on meanwhile."""
        unrecorded, extras_due = False, False
        retry_in = min(self.relist_every, RECORD_AGAIN_S)
        while True:
            tools, extras = await self._relist_due(retry_in if unrecorded else self.relist_every)
            # a listing not recorded yet is listed again whatever woke this (a prompts-only change, say), and
            # prompts or resources that changed while the tools failed to be recorded are still to be listed
            tools, extras = tools or unrecorded, extras or extras_due
            try:
                if tools:
                    await self._publish(await self._list(client, connection))
                if extras:
                    await self._announce(await self._list_extras(client))
            except ListingNotRecorded as exc:
                extras_due = extras
                self.status.last_error = f"{exc} ({next_attempt(retry_in)})"
                logger.log(logging.INFO if unrecorded else logging.WARNING, "upstream %s: %s", self.name,
                           self.status.last_error)
                unrecorded = True
                continue
            except Exception as exc:  # the server stopped answering: reconnect
                self.status.last_error = f"re-listing failed: {error_reason(exc)}"
                connection.end()
                return
            if unrecorded:
                self.status.change("up")  # marks why it was not recorded as past
                logger.warning("upstream %s: its listing is recorded again", self.name)
            unrecorded, extras_due = False, False

    async def _relist_due(self, within: float) -> tuple[bool, bool]:
        """Wait for a change notification, or `within` seconds (then both are due); whether the tools, and
        whether the prompts and resources, are to be listed again."""
        with anyio.move_on_after(within) as periodic:
            async with anyio.create_task_group() as either:
                for event in (self._events.relist, self._events.extras):
                    either.start_soon(_set_then_cancel, event, either.cancel_scope)
        tools, extras = self._events.relist.is_set(), self._events.extras.is_set()
        self._events.relist, self._events.extras = anyio.Event(), anyio.Event()
        return (True, True) if periodic.cancelled_caught else (tools, extras)

    async def _on_message(self, message: Any) -> None:
        if self._events is None or isinstance(message, Exception):
            return
        if isinstance(message, types.ToolListChangedNotification):
            self._events.relist.set()
        elif isinstance(message, (types.PromptListChangedNotification, types.ResourceListChangedNotification)):
            self._events.extras.set()
        elif isinstance(message, types.ResourceUpdatedNotification) and self._notice is not None:
            await self._notice(self.name, "updated", str(message.params.uri))

    async def _listen_for_changes(self, client: Any) -> None:
        """On the 2026 protocol, change notifications come on a `subscriptions/listen` stream, which is opened
        again with the new set of URIs whenever the resources subscribed to change."""
        capabilities = client.server_capabilities
        if client.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return  # 2025 servers notify through _on_message; others are re-listed periodically
        wanted = {"tools_list_changed": bool(getattr(capabilities.tools, "list_changed", False)),
                  "prompts_list_changed": bool(getattr(capabilities.prompts, "list_changed", False)),
                  "resources_list_changed": bool(getattr(capabilities.resources, "list_changed", False))}
        while True:
            self._events.resubscribe = anyio.Event()  # made before `subscribed` is read: no change is missed
            if not any(wanted.values()) and not self.subscribed:
                await self._events.resubscribe.wait()
                continue
            try:
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(_set_then_cancel, self._events.resubscribe, tasks.cancel_scope)
                    async with client.listen(**wanted, resource_subscriptions=sorted(self.subscribed)) as events:
                        async for event in events:
                            await self._heard(event)
                    return
            except Exception as exc:  # the periodic re-list still keeps the index current
                logger.info("upstream %s: no change notifications (%s); re-listing every %.0f s", self.name,
                            error_reason(exc), self.relist_every)
                return

    async def _heard(self, event: Any) -> None:
        kind = type(event).__name__
        if kind == "ToolsListChanged":
            self._events.relist.set()
        elif kind in ("PromptsListChanged", "ResourcesListChanged"):
            self._events.extras.set()
        elif kind == "ResourceUpdated" and self._notice is not None:
            await self._notice(self.name, "updated", event.uri)

    # calls -------------------------------------------------------------------------------------
    async def call(self, tool: Tool, arguments: Mapping[str, Any], headers: Mapping[str, str],
                   relay: Relay = NO_RELAY) -> ToolResult:
        request = types.CallToolRequest(params=types.CallToolRequestParams(name=tool.name, arguments=dict(arguments)))
        metadata = _header_metadata(headers) if self.spec.kind == "http" else None
        try:
            return await self._send(request, f"the call of {tool.name}", relay, metadata)
        except UpstreamRefused as exc:  # a refused call is the tool's failure, as the agent sees it
            return error_result(str(exc))
        except ValidationError as exc:  # an answer, but not an MCP tool result: the upstream's bug
            return error_result(f"upstream {self.name!r} answered the call of {tool.name} with a result that is "
                                f"not valid MCP: {first_error(exc)}")

    async def request(self, method: str, params: Mapping[str, Any], relay: Relay = NO_RELAY) -> dict[str, Any]:
        request_type, params_type = _FORWARDED[method]
        request = request_type(params=params_type.model_validate(dict(params)))
        if method == "resources/subscribe":
            self.subscribed.add(str(params.get("uri")))
        elif method == "resources/unsubscribe":
            self.subscribed.discard(str(params.get("uri")))
        if method.startswith("resources/") and method != "resources/read" and self._listens():
            self._events.resubscribe.set()  # a 2026 server: the listen stream carries subscriptions
            return {}
        return await self._send(request, method, relay)

    def _listens(self) -> bool:
        client = self._client
        return client is not None and client.protocol_version in MODERN_PROTOCOL_VERSIONS

    async def _send(self, request: Any, what: str, relay: Relay, metadata: Any = None) -> dict[str, Any]:
        """Forward one request within the timeout; UpstreamUnavailable (naming this upstream) when it cannot
        be answered, UpstreamRefused when the server answered with an error."""
        client = await self._connected_client()
        if self._connection is not None and self._connection.closed.is_set():  # ended, not yet torn down
            raise UpstreamUnavailable(f"upstream {self.name!r} had just closed its connection, so {what} was not "
                                      "sent; it is being reconnected: call again")
        key = id(relay)
        if relay.elicit is not None:
            self._relays[key] = relay
        self._in_flight += 1
        try:
            with anyio.fail_after(self.timeout):
                result = await client.session.send_request(request, _RESULT, metadata=metadata,
                                                           progress_callback=relay.progress)
        except TimeoutError:
            self._timed_out()
            raise timed_out("mcpServers", self.name, what, self.timeout, "it was told to cancel; ") from None
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED:
                self._drop()
                raise UpstreamUnavailable(self._lost(what)) from None
            self.log.answered()
            raise UpstreamRefused(f"upstream {self.name!r} refused {what}: {exc} (code {exc.code})", exc.code) from None
        except ValidationError:
            self.log.answered()
            raise
        except Exception as exc:  # the transport failed (an HTTP server went away)
            self._drop()
            raise sent_and_lost(self.name, what, error_reason(exc)) from None
        finally:
            self._relays.pop(key, None)
            self._in_flight -= 1
        self._timeouts_in_a_row = 0
        self.log.answered()
        return result

    def _lost(self, what: str) -> str:
        connection = self._connection
        if connection is not None and connection.hung:
            return f"upstream {self.name!r} stopped answering ({connection.hung}) during {what}; it is being restarted"
        return str(sent_and_lost(self.name, what, f"Connection closed{self.log.last_words()}",
                                 "; it is being reconnected"))

    def _timed_out(self) -> None:
        """A call got no answer in time: count it, and ping the server now."""
        self._timeouts_in_a_row += 1
        if self._events is not None:
            self._events.check.set()

    async def _connected_client(self) -> Any:
        """The live client; while (re)connecting, wait for it up to the call's timeout."""
        if self._client is not None:
            return self._client
        if await self.wait_up(self.timeout):
            return self._client
        if self.status.state == "starting":
            raise UpstreamUnavailable(f"upstream {self.name!r} did not come up within {self.timeout:g} s"
                                      f"{': ' + self.status.last_error if self.status.last_error else ''}",
                                      timed_out=True)
        raise UpstreamUnavailable(f"upstream {self.name!r} is down: {self.status.last_error or 'not connected'}")

    async def wait_up(self, within: float) -> bool:
        if self._client is None and self.status.state == "starting":
            with anyio.move_on_after(within):
                await self._signals().up.wait()
        return self._client is not None

    def _signals(self) -> "_Signals":
        """The supervisor's events, made in the event loop by the first that needs them: `run`, or a call that
        waits for an upstream whose start is scheduled but has not run yet."""
        if self._events is None:
            self._events = _Signals()
        return self._events

    def _drop(self) -> None:
        """The connection is broken: end it, so the supervisor reconnects."""
        if self._connection is not None:
            self._connection.end()

    async def _elicit(self, _context: Any, params: Any) -> Any:
        """The server asks the user something: the one call in flight whose agent can answer does; with none
        (or several: the question cannot be told apart), the server gets an error that says so."""
        relays = list(self._relays.values())
        if len(relays) != 1:
            why = f"{len(relays)} calls that could are in flight, and it is not known which one asks" if relays else \
                "no request of this server's is in flight" if not self._in_flight else \
                "no client whose request is in flight can answer it (none declared elicitation, or its protocol " \
                "carries no requests to the client)"
            return types.ErrorData(code=types.INVALID_REQUEST, message=f"the toolscout gateway cannot pass this "
                                                                       f"elicitation on to its client: {why}")
        try:
            answer = await relays[0].elicit(params.model_dump(by_alias=True, mode="json", exclude_none=True))
            return types.ElicitResult.model_validate(answer)
        except Exception as exc:  # the agent's client refused or failed: the server hears why
            return types.ErrorData(code=types.INTERNAL_ERROR, message=f"the gateway's client did not answer the "
                                                                      f"elicitation: {error_reason(exc)}")

    async def _resubscribe(self, client: Any) -> None:
        """After a reconnection, subscribe again to what the agents subscribed to (2025 servers; a 2026
        server's listen stream carries them)."""
        if client.protocol_version in MODERN_PROTOCOL_VERSIONS or not self.subscribed:
            return
        for uri in sorted(self.subscribed):
            try:
                await client.session.send_request(types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri)),
                                                  _RESULT, request_read_timeout_seconds=self.timeout)
            except MCPError as exc:
                logger.info("upstream %s: resubscribing to %s failed: %s", self.name, uri, exc)


class _Signals:
    """The supervisor's events, made inside the event loop (anyio events belong to one loop)."""

    def __init__(self) -> None:
        self.up = anyio.Event()
        self.relist = anyio.Event()
        self.extras = anyio.Event()
        self.check = anyio.Event()
        self.resubscribe = anyio.Event()

    def connected(self) -> None:
        self.up.set()

    def disconnected(self) -> None:
        """A connection ended, or an attempt failed: whoever waited for this attempt (`wait_up`) hears now
        that it did not come up, and later waits are for the next attempt."""
        self.up.set()
        self.up = anyio.Event()


async def _set_then_cancel(event: Any, scope: Any) -> None:
    await event.wait()
    scope.cancel()


def _header_metadata(headers: Mapping[str, str]) -> Any:
    if not headers:
        return None
    return ClientMessageMetadata(headers=dict(headers))
