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
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import stat
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Protocol

logger = logging.getLogger(__name__)
LINE_LIMIT = 64 << 20  # bytes of one JSON-RPC message


class FastLane(Protocol):
    """Requests the gateway answers itself, ahead of the SDK's dispatch (see `pipe_stdio`)."""

    def claims(self, message: dict) -> bool:
        """Whether this JSON-RPC message is one the lane answers."""
        ...

    async def answer(self, message: dict) -> dict:
        """The JSON-RPC response to a claimed request."""
        ...


class _Lines:
    """Lines of a pipe, as the SDK's transport iterates a text file; requests the fast lane claims are
    answered on the side and never reach the SDK."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, lane: FastLane | None):
        self.reader, self.writer, self.lane = reader, writer, lane
        self.tasks: set[asyncio.Task] = set()

    def __aiter__(self) -> "_Lines":
        return self

    async def __anext__(self) -> str:
        while True:
            line = await self.reader.readline()
            if not line:
                raise StopAsyncIteration
            message = self._claimed(line)
            if message is None:
                return line.decode("utf-8", errors="replace")
            task = asyncio.get_running_loop().create_task(self._answer(message))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def _claimed(self, line: bytes) -> dict | None:
        if self.lane is None or b'"tools/call"' not in line or b'"call_tool"' not in line:  # others: the SDK's
            return None
        try:
            message = json.loads(line)
        except ValueError:
            return None
        return message if isinstance(message, dict) and self.lane.claims(message) else None

    async def _answer(self, message: dict) -> None:
        try:
            response = await self.lane.answer(message)
        except Exception:  # a bug: the client still gets an answer, never a hang
            logger.exception("the gateway failed to answer a request")
            response = {"jsonrpc": "2.0", "id": message.get("id"),
                        "error": {"code": -32603, "message": "internal error in the toolscout gateway (logged)"}}
        self.writer.write(json.dumps(response, separators=(",", ":")).encode("utf-8") + b"\n")
        await self.writer.drain()  # a host that stops reading holds answers back rather than piling them up

    def cancel(self) -> None:
        for task in list(self.tasks):
            task.cancel()


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
    lines = _Lines(reader, writer, lane)
    try:
        yield lines, _Writer(writer)
    finally:
        lines.cancel()
        read_transport.close()
        write_transport.close()
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)
