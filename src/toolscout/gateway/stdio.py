"""The gateway's own stdin and stdout as non-blocking pipes, for the SDK's stdio transport, with a fast lane.

The SDK reads and writes the standard streams through worker threads (a thread hop per line read and
per line written); a gateway forwards every call through two such transports, so it reads them as the
event loop's own pipes instead. Like the SDK, it keeps the wire to itself: while serving, file
descriptor 0 reads the null device and 1 writes to stderr, so a stray print from any library lands in
the log instead of corrupting the protocol. Standard streams that are not pipes (a file, a terminal)
are served by the SDK's own transport.

The fast lane: a forwarded call is a pass-through, and the SDK's per-message layers (era replay, a
connection and middleware per request, result validation) cost more than the forwarding itself. So the
requests a `FastLane` claims (`call_tool`, see `mcp_server.GatewayMcp.claims`) are answered here, each in a
task of its own, and everything else goes to the SDK as it came. Responses are whole lines, written by
the event loop's one thread, so they never interleave with the SDK's.

The lane speaks the rest of the protocol for the requests it claims, as the SDK would: a
`notifications/cancelled` naming one cancels it (upstream too) and it gets no answer; its progress goes
out as `notifications/progress` with the host's token; an upstream's elicitation during it goes to the host
as an `elicitation/create` request of the lane's own (ids `toolscout-lane-N`), whose answer the lane takes
back. A line longer than LINE_LIMIT is answered with a JSON-RPC error, never the end of the connection.

`stream_pipes` serves any pair of asyncio streams the same way: a host attached over the index's socket
(`hosts.py`) gets the fast lane too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Protocol

import anyio

from .upstream import Relay

logger = logging.getLogger(__name__)
LINE_LIMIT = 64 << 20  # bytes of one JSON-RPC message


class FastLane(Protocol):
    """Requests the gateway answers itself, ahead of the SDK's dispatch (see `pipe_stdio`)."""

    def claims(self, message: dict) -> bool:
        """Whether this JSON-RPC message is one the lane answers."""
        ...

    async def answer(self, message: dict, lane: "LaneChannel") -> dict:
        """The JSON-RPC response to a claimed request (`lane`: its progress and requests to the host)."""
        ...

    def observe(self, message: dict) -> None:
        """An `initialize` on its way to the SDK (what the host declared it can answer)."""
        ...


class LaneChannel:
    """What one claimed request may send the host besides its answer: progress with the host's token, and
    elicitation requests (`relay`)."""

    def __init__(self, lines: "_Lines"):
        self.lines = lines

    def relay(self, progress_token: Any, elicits: bool) -> Relay:
        progress = elicit = None
        if progress_token is not None:
            async def progress(value: float, total: float | None, message: str | None) -> None:
                params = {"progressToken": progress_token, "progress": value, "total": total, "message": message}
                await self.lines.write({"jsonrpc": "2.0", "method": "notifications/progress",
                                        "params": {k: v for k, v in params.items() if v is not None}})
        if elicits:
            async def elicit(params: dict) -> dict:
                return await self.lines.ask("elicitation/create", params)
        return Relay(progress, elicit)


class _Lines:
    """Lines of a pipe, as the SDK's transport iterates a text file; requests the fast lane claims are
    answered on the side and never reach the SDK, nor do cancellations of them or answers to the lane's
    own requests."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, lane: FastLane | None):
        self.reader, self.writer, self.lane = reader, writer, lane
        self.tasks: set[asyncio.Task] = set()
        self.scopes: dict[Any, anyio.CancelScope] = {}  # claimed requests in flight, by JSON-RPC id
        self.asked: dict[str, asyncio.Future] = {}  # the lane's own requests to the host, by id
        self._asked = 0

    def __aiter__(self) -> "_Lines":
        return self

    async def __anext__(self) -> str:
        while True:
            try:
                line = await self.reader.readline()
            except ValueError:  # longer than LINE_LIMIT: say so, skip it, go on
                await self._too_long()
                continue
            if not line:
                raise StopAsyncIteration
            message = self._claimed(line)
            if message is None:
                return line.decode("utf-8", errors="replace")
            if message.get("method") == "tools/call":
                task = asyncio.get_running_loop().create_task(self._answer(message))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    def _claimed(self, line: bytes) -> dict | None:
        """The message when the lane takes it (a call it answers, a cancellation or answer that is its own),
        else None (the SDK's)."""
        if self.lane is None or not any(mark in line for mark in _LANE_MARKS):  # others: the SDK's
            return None
        try:
            message = json.loads(line)
        except ValueError:
            return None
        if not isinstance(message, dict):
            return None
        if message.get("method") == "initialize":
            self.lane.observe(message)
            return None
        if message.get("method") == "notifications/cancelled":
            scope = self.scopes.get((message.get("params") or {}).get("requestId"))
            if scope is None:
                return None
            scope.cancel()
            return message
        if "method" not in message and message.get("id") in self.asked:
            self._answered(message)
            return message
        return message if self.lane.claims(message) else None

    async def _answer(self, message: dict) -> None:
        with anyio.CancelScope() as scope:
            self.scopes[message["id"]] = scope
            try:
                response = await self.lane.answer(message, LaneChannel(self))
            except Exception:  # a bug: the client still gets an answer, never a hang
                logger.exception("the gateway failed to answer a request")
                response = {"jsonrpc": "2.0", "id": message.get("id"),
                            "error": {"code": -32603, "message": "internal error in the toolscout gateway (logged)"}}
            finally:
                self.scopes.pop(message["id"], None)
        if scope.cancel_called:  # the host cancelled it: no answer (the spec's rule)
            return
        await self.write(response)

    async def write(self, message: dict) -> None:
        self.writer.write(json.dumps(message, separators=(",", ":")).encode("utf-8") + b"\n")
        await self.writer.drain()  # a host that stops reading holds answers back rather than piling them up

    async def ask(self, method: str, params: dict) -> dict:
        """Send the host a request of the lane's own and return its result (raise on its error)."""
        self._asked += 1
        request_id = f"toolscout-lane-{self._asked}"
        future = asyncio.get_running_loop().create_future()
        self.asked[request_id] = future
        try:
            await self.write({"jsonrpc": "2.0", "id": request_id, "method": method, "params": params})
            return await future
        finally:
            self.asked.pop(request_id, None)

    def _answered(self, message: dict) -> None:
        future = self.asked.get(message["id"])
        if future is None or future.done():
            return
        error = message.get("error")
        if isinstance(error, dict):
            future.set_exception(RuntimeError(f"the host refused: {error.get('message')} (code {error.get('code')})"))
        else:
            future.set_result(message.get("result") or {})

    async def _too_long(self) -> None:
        """A line over LINE_LIMIT was dropped (asyncio drops what it read of it): the host is told (its id is
        not known: null); what is left of the line reads as a line of its own, which the SDK refuses."""
        await self.write({"jsonrpc": "2.0", "id": None, "error": {
            "code": -32600, "message": f"a message longer than the gateway's limit of {LINE_LIMIT} bytes was "
                                       "dropped"}})

    def cancel(self) -> None:
        for task in list(self.tasks):
            task.cancel()


# substrings of the lines the lane may take: calls of call_tool, cancellations, answers to its own requests,
# the host's initialize (observed, then passed on)
_LANE_MARKS = (b'"call_tool"', b'"notifications/cancelled"', b"toolscout-lane-", b'"initialize"')


class _Writer:
    """Writes to a pipe, as the SDK's transport writes to a text file."""

    def __init__(self, writer: asyncio.StreamWriter):
        self.writer = writer

    async def write(self, text: str) -> None:
        self.writer.write(text.encode("utf-8"))

    async def flush(self) -> None:
        await self.writer.drain()


def _is_pipe(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


@asynccontextmanager
async def pipe_stdio(lane: FastLane | None = None) -> AsyncIterator[tuple[Any, Any]]:
    """(stdin lines, stdout writer) for `mcp.server.stdio.stdio_server(stdin, stdout)`; (None, None) when
    the standard streams are not both pipes (the SDK then serves them its own way)."""
    if not (_is_pipe(0) and _is_pipe(1)):
        yield None, None
        return
    loop = asyncio.get_running_loop()
    wire_in, wire_out = os.dup(0), os.dup(1)
    saved_in, saved_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(2, 1)
    os.close(null)
    reader = asyncio.StreamReader(limit=LINE_LIMIT)
    read_transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                     os.fdopen(wire_in, "rb", buffering=0))
    write_transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin,
                                                              os.fdopen(wire_out, "wb", buffering=0))
    writer = asyncio.StreamWriter(write_transport, protocol, None, loop)
    try:
        async with stream_pipes(reader, writer, lane) as pipes:
            yield pipes
    finally:
        read_transport.close()
        write_transport.close()
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)


@asynccontextmanager
async def stream_pipes(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                       lane: FastLane | None = None) -> AsyncIterator[tuple[Any, Any]]:
    """(lines, writer) for `stdio_server` over any pair of asyncio streams (a host attached over a socket,
    `hosts.py`), with the fast lane as over the gateway's own stdio; claimed requests still in flight are
    cancelled at the end."""
    lines = _Lines(reader, writer, lane)
    try:
        yield lines, _Writer(writer)
    finally:
        lines.cancel()


def has_uvloop() -> bool:
    """Whether uvloop is installed (the gateway's event loop then runs on it)."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True
