"""An MCP server behind the gateway, over stdio (a command the gateway starts) or streamable HTTP, through
the official SDK's client.

One connection per upstream carries every call (JSON-RPC multiplexes them, so a slow call holds up no
other). The supervisor (`run`) connects, lists the tools, hands them to the gateway and then waits for the
connection to end: a stdio server that exits closes its stdout, which ends the connection at once; an HTTP
server that stops answering fails the next call or re-list, which ends it too. Then it reconnects with
backoff (`upstream.Backoff`), restarting a stdio server's process.

The listing is kept current by the server's `notifications/tools/list_changed` (on the 2025 protocol) or a
`subscriptions/listen` stream (on the 2026 one), and by a periodic re-list whatever the server supports.
Listings and calls go through the session's raw requests: a tool whose schema the SDK's models would
refuse is skipped alone (the ingest parser says why), and call results are forwarded as the server sent
them, without revalidating them against the tool's output schema.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import sys
import time
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Mapping

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import ClientMessageMetadata, SessionMessage
from mcp_types.jsonrpc import JSONRPCRequest, JSONRPCResponse
from mcp_types.methods import validate_server_result
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import TypeAdapter, ValidationError

from ..ingest import parse_tools
from ..ingest.common import LoadReport
from ..ingest.live_mcp import error_reason
from ..tool import Tool
from ..version import __version__
from .config import UpstreamSpec
from .upstream import Backoff, Listing, ListingSink, ToolResult, UpstreamStatus, UpstreamUnavailable, error_result

logger = logging.getLogger(__name__)
MAX_PAGES = 1000
_RESULT = TypeAdapter(dict[str, Any])  # results stay the dicts they came as (the SDK has checked their shape)
CONNECT_TIMEOUT_S = 60.0
LOG_LIMIT_BYTES = 1 << 20


class McpUpstream:
    """One MCP server behind the gateway (see the module doc)."""

    def __init__(self, spec: UpstreamSpec, *, log_dir: Path | None = None, relist_every: float = 300.0):
        self.spec = spec
        self.name, self.timeout, self.forward_headers = spec.name, spec.timeout, spec.forward_headers
        self.status = UpstreamStatus(spec.name, spec.kind, spec.describe())
        self.relist_every = relist_every
        self.log_path = (log_dir / f"{spec.name}.log") if log_dir is not None and spec.kind == "stdio" else None
        self._client: Any = None
        self._connection: _Connection | None = None
        self._sink: ListingSink | None = None
        self._events: Any = None  # _Signals, made inside the event loop by run()

    # supervision -------------------------------------------------------------------------------
    async def run(self, sink: ListingSink) -> None:
        self._sink, self._events = sink, _Signals()
        backoff = Backoff()
        while True:
            started = time.monotonic()
            try:
                await self._connect_and_serve()
                why = "the connection closed" + self._stderr_tail()
            except Exception as exc:  # every failure of one upstream ends here, never in the gateway
                why = error_reason(exc) + self._stderr_tail()
            self._client = self._connection = None
            self._events.disconnected()
            delay = backoff.next(time.monotonic() - started)
            repeated = self.status.state != "up" and (self.status.last_error or "").startswith(why)
            self.status.change("down", f"{why}; reconnecting in {delay:.1f} s")
            logger.log(logging.INFO if repeated else logging.WARNING, "upstream %s is down: %s", self.name,
                       self.status.last_error)
            await anyio.sleep(delay)
            self.status.change("starting")

    async def _connect_and_serve(self) -> None:
        """One connection, from the handshake (within a deadline) until it ends."""
        connect_within = min(CONNECT_TIMEOUT_S, max(self.timeout, 10.0))
        with anyio.CancelScope(deadline=anyio.current_time() + connect_within) as deadline:
            async with AsyncExitStack() as stack:
                connection = _Connection(self._transport(stack))
                client = await stack.enter_async_context(Client(
                    connection.streams(), message_handler=self._on_message, cache=None,
                    client_info=types.Implementation(name="toolscout-gateway", version=__version__)))
                connection.protocol = client.protocol_version
                await self._publish(await self._list(client, connection))
                deadline.deadline = math.inf  # connected: from here on the connection lasts as long as it can
                self._client, self._connection = client, connection
                self.status.connects += 1
                self.status.change("up")
                self._events.connected()
                async with anyio.create_task_group() as tasks:
                    tasks.start_soon(self._listen_for_changes, client)
                    tasks.start_soon(self._keep_listing_current, client, connection)
                    await connection.closed.wait()
                    tasks.cancel_scope.cancel()
        if deadline.cancelled_caught:
            raise TimeoutError(f"no answer to the MCP handshake and tools/list within {connect_within:g} s")

    def _transport(self, stack: AsyncExitStack) -> Any:
        if self.spec.kind == "stdio":
            params = StdioServerParameters(command=_command(self.spec.command or ""), args=list(self.spec.args),
                                           env=dict(self.spec.env) or None, cwd=self.spec.cwd)
            return stdio_client(params, errlog=stack.enter_context(self._open_log()))
        http = httpx2.AsyncClient(headers=dict(self.spec.headers), timeout=httpx2.Timeout(30.0, read=None))
        return streamable_http_client(self.spec.url, http_client=http)

    # listing -----------------------------------------------------------------------------------
    async def _list(self, client: Any, connection: "_Connection") -> Listing:
        """Every page of tools/list, each tool parsed on its own: a broken one is skipped with its reason
        (by the connection's screen when the SDK would refuse it, else by the ingest parser)."""
        connection.skipped.clear()
        raw: list[Any] = []
        cursor = None
        for _ in range(MAX_PAGES):
            page = await client.session.send_request(
                types.ListToolsRequest(params=types.PaginatedRequestParams(cursor=cursor)),
                _RESULT, request_read_timeout_seconds=self.timeout)
            tools = page.get("tools")
            raw.extend(tools if isinstance(tools, list) else [])
            cursor = page.get("nextCursor")
            if not cursor:
                break
        report = LoadReport()
        tools = parse_tools({"tools": raw}, format="mcp", lenient=True, source=f"upstream {self.name}",
                            namespace=self.name, report=report)
        return Listing(self.name, tools, tuple(connection.skipped) + tuple(report.skipped))

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

    async def _keep_listing_current(self, client: Any, connection: "_Connection") -> None:
        """Re-list on every change notification, and every `relist_every` seconds whatever happens."""
        while True:
            with anyio.move_on_after(self.relist_every):
                await self._events.relist.wait()
            self._events.relist = anyio.Event()
            try:
                await self._publish(await self._list(client, connection))
            except Exception as exc:  # the server stopped answering: reconnect
                self.status.last_error = f"re-listing failed: {error_reason(exc)}"
                connection.closed.set()
                return

    async def _on_message(self, message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification) and self._events is not None:
            self._events.relist.set()

    async def _listen_for_changes(self, client: Any) -> None:
        """On the 2026 protocol, change notifications come on a `subscriptions/listen` stream."""
        tools = getattr(client.server_capabilities, "tools", None)
        if client.protocol_version not in MODERN_PROTOCOL_VERSIONS or not getattr(tools, "list_changed", False):
            return  # 2025 servers notify through _on_message; others are re-listed periodically
        try:
            async with client.listen(tools_list_changed=True) as subscription:
                async for _event in subscription:
                    self._events.relist.set()
        except Exception as exc:  # the periodic re-list still keeps the index current
            logger.info("upstream %s: no change notifications (%s); re-listing every %.0f s", self.name,
                        error_reason(exc), self.relist_every)

    # calls -------------------------------------------------------------------------------------
    async def call(self, tool: Tool, arguments: Mapping[str, Any], headers: Mapping[str, str]) -> ToolResult:
        client = await self._connected_client()
        request = types.CallToolRequest(params=types.CallToolRequestParams(name=tool.name, arguments=dict(arguments)))
        metadata = _header_metadata(headers) if self.spec.kind == "http" else None
        try:
            with anyio.fail_after(self.timeout):
                return await client.session.send_request(request, _RESULT, metadata=metadata)
        except TimeoutError:
            raise UpstreamUnavailable(f"upstream {self.name!r} did not answer {tool.name} within its timeout of "
                                      f"{self.timeout:g} s", timed_out=True) from None
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED:
                self._drop()
                raise UpstreamUnavailable(f"upstream {self.name!r} failed during the call of {tool.name}: "
                                          f"{exc}{self._stderr_tail()}; it is being reconnected") from None
            return error_result(f"upstream {self.name!r} refused the call of {tool.name}: {exc} (code {exc.code})")
        except ValidationError as exc:  # an answer, but not an MCP tool result: the upstream's bug
            return error_result(f"upstream {self.name!r} answered the call of {tool.name} with a result that is "
                                f"not valid MCP: {_first_error(exc)}")
        except Exception as exc:  # the transport failed (an HTTP server went away)
            self._drop()
            raise UpstreamUnavailable(f"upstream {self.name!r} failed during the call of {tool.name}: "
                                      f"{error_reason(exc)}") from None

    async def _connected_client(self) -> Any:
        """The live client; while (re)connecting, wait for it up to the call's timeout."""
        if self._client is not None:
            return self._client
        if self.status.state == "starting" and self._events is not None:
            with anyio.move_on_after(self.timeout):
                await self._events.up.wait()
            if self._client is not None:
                return self._client
            raise UpstreamUnavailable(f"upstream {self.name!r} did not come up within {self.timeout:g} s"
                                      f"{': ' + self.status.last_error if self.status.last_error else ''}",
                                      timed_out=True)
        raise UpstreamUnavailable(f"upstream {self.name!r} is unavailable: {self.status.last_error or 'not connected'}")

    def _drop(self) -> None:
        """The connection is broken: end it, so the supervisor reconnects."""
        if self._connection is not None:
            self._connection.closed.set()

    # the server's stderr -----------------------------------------------------------------------
    def _open_log(self) -> Any:
        if self.log_path is None:
            return contextlib.nullcontext(None)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        if self.log_path.exists() and self.log_path.stat().st_size > LOG_LIMIT_BYTES:
            os.replace(self.log_path, self.log_path.with_suffix(".log.1"))
        log = open(self.log_path, "a", encoding="utf-8", errors="replace")
        log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {self.spec.describe()}\n")
        log.flush()
        return log

    def _stderr_tail(self) -> str:
        """The last line the server wrote to stderr (where to read the rest), or ''."""
        if self.log_path is None or not self.log_path.exists():
            return ""
        with open(self.log_path, "rb") as fh:
            fh.seek(max(0, self.log_path.stat().st_size - 2000))
            lines = [line.strip() for line in fh.read().decode("utf-8", "replace").splitlines()]
        lines = [line for line in lines if line]
        if not lines or lines[-1].startswith("--- "):
            return ""
        return f" (its last words on stderr: {lines[-1][:300]!r}; see {self.log_path})"


class _Signals:
    """The supervisor's events, made inside the event loop (anyio events belong to one loop)."""

    def __init__(self) -> None:
        self.up = anyio.Event()
        self.relist = anyio.Event()

    def connected(self) -> None:
        self.up.set()

    def disconnected(self) -> None:
        self.up = anyio.Event()


class _Connection:
    """The transport of one connection, watched and screened:

    - `closed` is set as soon as the server's side ends (a stdio server that exits closes its stdout);
    - each tool of a tools/list reply is checked as the SDK checks the whole reply, for the negotiated
      `protocol`; a tool it would refuse is taken out (its reason kept in `skipped`), so one broken tool
      does not cost the server its whole listing."""

    def __init__(self, transport: Any):
        self.transport = transport
        self.closed = anyio.Event()
        self.protocol: str | None = None
        self.skipped: list[tuple[str, str]] = []
        self._listing_ids: set[Any] = set()

    @asynccontextmanager
    async def streams(self) -> AsyncIterator[Any]:
        async with self.transport as (read, write):
            send, receive = anyio.create_memory_object_stream(0)

            async def relay() -> None:
                try:
                    async with send:
                        async for item in read:
                            await send.send(self._screen(item))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    pass
                finally:
                    self.closed.set()

            async with anyio.create_task_group() as tasks:
                tasks.start_soon(relay)
                try:
                    yield receive, _ListingWatch(write, self._listing_ids)
                finally:
                    tasks.cancel_scope.cancel()

    def _screen(self, item: Any) -> Any:
        message = getattr(item, "message", None)
        if not isinstance(message, JSONRPCResponse) or message.id not in self._listing_ids:
            return item
        self._listing_ids.discard(message.id)
        tools = message.result.get("tools")
        if not isinstance(tools, list):
            return item
        kept = []
        for i, tool in enumerate(tools):
            try:
                validate_server_result("tools/list", self.protocol or "2025-11-25", {**message.result, "tools": [tool]})
                kept.append(tool)
            except ValidationError as exc:
                name = tool.get("name") if isinstance(tool, dict) else None
                self.skipped.append((f"tools[{i}]" + (f" ({name})" if name else ""), _first_error(exc)))
            except (KeyError, ValueError):  # a method or version the SDK does not check: nothing to screen
                kept.append(tool)
        if len(kept) == len(tools):
            return item
        return SessionMessage(message.model_copy(update={"result": {**message.result, "tools": kept}}), item.metadata)


class _ListingWatch:
    """The write side of a connection, noting the ids of tools/list requests (their replies are screened)."""

    def __init__(self, stream: Any, ids: set[Any]):
        self.stream, self.ids = stream, ids

    async def send(self, item: Any) -> None:
        message = getattr(item, "message", None)
        if isinstance(message, JSONRPCRequest) and message.method == "tools/list":
            self.ids.add(message.id)
        await self.stream.send(item)

    async def aclose(self) -> None:
        await self.stream.aclose()

    async def __aenter__(self) -> "_ListingWatch":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{where}: {first.get('msg')}" if where else str(first.get("msg"))


def _command(command: str) -> str:
    """A bare command found on PATH, else beside the gateway's own interpreter (a server installed into the
    gateway's virtual environment, which need not be activated), else as given (its start then fails)."""
    if os.sep in command or shutil.which(command):
        return command
    beside = Path(sys.executable).parent / command
    return str(beside) if beside.exists() else command


def _header_metadata(headers: Mapping[str, str]) -> Any:
    if not headers:
        return None
    return ClientMessageMetadata(headers=dict(headers))
