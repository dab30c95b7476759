"""One connection to an MCP upstream, below the SDK's client: its transport watched and screened, and the
stderr log of a server the gateway started.

- `Connection.closed` is set as soon as the server's side ends (a stdio server that exits closes its
  stdout), or when the gateway ends it (`hung`: it stopped answering);
- each tool of a tools/list reply is checked as the SDK checks the whole reply, for the negotiated
  `protocol`; a tool it would refuse is taken out (its reason kept in `skipped`), so one broken tool does
  not cost the server its whole listing;
- a line on a server's stdout that is not JSON-RPC costs one log line per connection (the SDK would log a
  traceback for each), and never reaches the session;
- `ServerLog` is the server's stderr, kept in `INDEX/upstream-logs/NAME.log`; its `last_words` are the lines
  written since the server last answered, so a crash is quoted, never an earlier call's complaint.
"""

from __future__ import annotations

import logging
import os
import re
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator

import anyio
from mcp.shared.message import SessionMessage
from mcp_types.jsonrpc import JSONRPCRequest, JSONRPCResponse
from mcp_types.methods import validate_server_result
from pydantic import ValidationError

logger = logging.getLogger(__name__)
LOG_LIMIT_BYTES = 1 << 20
_SDK_PARSE_ERROR = "Failed to parse JSONRPC message from server"


class Connection:
    """The transport of one connection, watched and screened (see the module doc)."""

    def __init__(self, transport: Any, upstream: str):
        self.transport, self.upstream = transport, upstream
        self.closed = anyio.Event()
        self.hung: str | None = None  # why the gateway ended it for not answering (None: it did not)
        self.protocol: str | None = None
        self.handshaken = False  # the MCP handshake (initialize) is done
        self.skipped: list[tuple[str, str]] = []
        self.noise = 0  # lines on stdout that were not JSON-RPC
        self._listing_ids: set[Any] = set()

    def end(self, hung: str | None = None) -> None:
        """End the connection (the supervisor then reconnects); `hung`: the server stopped answering."""
        self.hung = self.hung or hung
        self.closed.set()

    @asynccontextmanager
    async def streams(self) -> AsyncIterator[Any]:
        async with self.transport as (read, write):
            send, receive = anyio.create_memory_object_stream(0)

            async def relay() -> None:
                try:
                    async with send:
                        async for item in read:
                            if isinstance(item, Exception):
                                self._noisy(item)
                                continue
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

    def _noisy(self, exc: Exception) -> None:
        """A line of the server's stdout that is not a JSON-RPC message: said once per connection."""
        self.noise += 1
        if self.noise == 1:
            found = re.search(r"input_value=(.*?), input_type=", str(exc))
            line = found.group(1) if found else str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            logger.warning("upstream %s wrote to stdout a line that is not JSON-RPC (ignored, as are any more on "
                           "this connection): %s", self.upstream, line[:300])

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
                self.skipped.append((f"tools[{i}]" + (f" ({name})" if name else ""), first_error(exc)))
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


class ServerLog:
    """A stdio server's stderr, appended to `path` (rotated past LOG_LIMIT_BYTES); `answered` marks where the
    server last answered, so `last_words` quotes only what it wrote after that."""

    def __init__(self, path: Path | None):
        self.path = path
        self._file: Any = None
        self._quiet_since = 0

    def open(self, describe: str) -> Any:
        """The file the server's stderr goes to, for one run of it (a context manager)."""
        if self.path is None:
            return _Null()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists() and self.path.stat().st_size > LOG_LIMIT_BYTES:
            os.replace(self.path, self.path.with_suffix(".log.1"))
        self._file = open(self.path, "a", encoding="utf-8", errors="replace")
        self._file.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {describe}\n")
        self._file.flush()
        self.answered()
        return self._file

    def answered(self) -> None:
        """The server just answered: what it wrote so far is not its last words."""
        if self._file is not None:
            try:
                self._quiet_since = os.fstat(self._file.fileno()).st_size
            except (OSError, ValueError):  # closed: the next run opens it again
                pass

    def last_words(self) -> str:
        """The last line the server wrote to stderr since it last answered (where to read the rest), or ''."""
        if self.path is None or not self.path.exists():
            return ""
        size = self.path.stat().st_size
        if size < self._quiet_since:  # rotated meanwhile
            self._quiet_since = 0
        with open(self.path, "rb") as fh:
            fh.seek(max(self._quiet_since, size - 2000))
            lines = [line.strip() for line in fh.read().decode("utf-8", "replace").splitlines()]
        lines = [line for line in lines if line and not line.startswith("--- ")]
        if not lines:
            return ""
        return f" (its last words on stderr: {lines[-1][:300]!r}; see {self.path})"


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


class _QuietParseErrors(logging.Filter):
    """Drops the SDK's traceback for each line of a server's stdout that is not JSON-RPC (`Connection` says
    it once per connection instead)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != _SDK_PARSE_ERROR


def quiet_sdk_parse_errors() -> None:
    """Install `_QuietParseErrors` on the SDK's stdio client logger (once)."""
    sdk = logging.getLogger("mcp.client.stdio")
    if not any(isinstance(f, _QuietParseErrors) for f in sdk.filters):
        sdk.addFilter(_QuietParseErrors())


def first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    where = ".".join(str(p) for p in first.get("loc", ()))
    return f"{where}: {first.get('msg')}" if where else str(first.get("msg"))
