"""The gateway's own stdin and stdout as non-blocking pipes, for the SDK's stdio transport.

The SDK reads and writes the standard streams through worker threads (a thread hop per line read and
per line written); a gateway forwards every call through two such transports, so it reads them as the
event loop's own pipes instead. Like the SDK, it keeps the wire to itself: while serving, file
descriptor 0 reads the null device and 1 writes to stderr, so a stray print from any library lands in
the log instead of corrupting the protocol. Standard streams that are not pipes (a file, a terminal)
are served by the SDK's own transport.
"""

from __future__ import annotations

import asyncio
import os
import stat
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

LINE_LIMIT = 64 << 20  # bytes of one JSON-RPC message


class _Lines:
    """Lines of a pipe, as the SDK's transport iterates a text file."""

    def __init__(self, reader: asyncio.StreamReader):
        self.reader = reader

    def __aiter__(self) -> "_Lines":
        return self

    async def __anext__(self) -> str:
        line = await self.reader.readline()
        if not line:
            raise StopAsyncIteration
        return line.decode("utf-8", errors="replace")


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
async def pipe_stdio() -> AsyncIterator[tuple[Any, Any]]:
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
        yield _Lines(reader), _Writer(writer)
    finally:
        read_transport.close()
        write_transport.close()
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        os.close(saved_in)
        os.close(saved_out)
