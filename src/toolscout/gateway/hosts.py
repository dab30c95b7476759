"""Several hosts on one machine, one index: the gateway that holds the index serves the others.

Two or more MCP hosts (a desktop chat app, an editor, a CLI agent) that launch `toolscout gateway CONFIG`
over stdio with the same config share one index directory. The first to start takes the index's lock
(`IndexLock`, `INDEX/gateway.lock`) and owns it: it loads the index, runs the upstreams, and besides its own
host serves the hosts of later gateways over a unix socket (`serve_hosts`). A later gateway finds the lock
held and attaches to the owner (`bridge.py`): it relays its host's MCP session to the owner, so searches,
calls and what the calls teach all go through the one index. When the owner stops, one attached gateway takes
the lock and owns the index in its place, and the others attach to it.

Only the owner's user can attach: the socket (`INDEX/gateway.sock`, or a short path in the temporary folder
when that one is too long for a socket address) is made 0600, and a connection must first present the
random token of `INDEX/gateway.attach` (a 0600 file naming the socket and the owner's pid), which changes
with each owner. The wire is line-delimited JSON-RPC, as over stdio, after one line each way:

    attaching gateway → owner   {"toolscout": "attach", "token": T, "pid": P, "searches": S}
    owner → attaching gateway   {"toolscout": "attached", "pid": OWNER}, or {"toolscout": "refused", "reason": R}

`searches` (optional): the host's searches as they passed through its gateway to the previous owner,
`[{"task", "found": [ids], "calls": n}]`, oldest first: the next owner gives them to the host's session, so
a call made after a take-over teaches the search that returned the tool (attribution.py).

When the owner stops, before it refuses calls, it tells each attached gateway `{"toolscout": "leaving"}`; that
one answers `{"toolscout": "quiet"}` and sends no request after it (its host's next requests wait for the
next owner), and the owner waits for that word (`QUIET_WITHIN_S` at most): every request sent before it has
been read, so it is answered (or refused, saying the call was not made) rather than lost with the
connection. Answers and cancellations still pass both ways until the connection ends.

Each attached host is a session and a feedback source of its own (`session:local:P`, `mcp_server.py`).
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import hmac
import json
import logging
import os
import secrets
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import anyio

from ..errors import ToolScoutError
from ..serve.schemas import MAX_K
from .attribution import SEARCHES_KEPT
from .stdio import LINE_LIMIT

logger = logging.getLogger(__name__)
LOCK_FILE = "gateway.lock"
ENDPOINT_FILE = "gateway.attach"
SOCKET_FILE = "gateway.sock"
RUNTIME_FILES = (LOCK_FILE, ENDPOINT_FILE, SOCKET_FILE)  # what a running gateway adds to its index folder
HELLO_TIMEOUT_S = 5.0
QUIET_WITHIN_S = 2.0  # how long a stopping owner waits for its attached gateways to stop sending requests
LEAVING = b'{"toolscout": "leaving"}\n'  # owner -> attached gateway: it stops (its next requests go elsewhere)
QUIET = b'{"toolscout": "quiet"}\n'  # attached gateway -> owner: no request follows this line
FOUND_KEPT = MAX_K  # tools of one carried search (search_tools returns MAX_K at most)
TASK_KEPT = 20_000  # characters of a carried search's task (as much as feedback keeps)
_SOCKET_PATH_MAX = 100  # bytes of a unix socket's path (the address holds 104 to 108, by system)


class AttachFailed(ToolScoutError):
    """The owner of an index could not be attached to: no socket yet, gone, or it refused (the message
    says which)."""


class IndexLock:
    """The lock that makes one gateway the owner of an index folder; held until `release` (or exit)."""

    def __init__(self, fd: int, folder: Path):
        self.fd, self.folder = fd, folder

    @classmethod
    def claim(cls, folder: Path) -> IndexLock | None:
        """The lock of `folder` (made if new), or None when another gateway holds it."""
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return cls(fd, folder)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclass(frozen=True)
class Endpoint:
    """Where the owner of an index serves other hosts: its socket, the token a host presents, its pid."""

    socket: str
    token: str
    pid: int

    @classmethod
    def read(cls, folder: Path) -> Endpoint | None:
        try:
            data = json.loads((folder / ENDPOINT_FILE).read_text(encoding="utf-8"))
            return cls(str(data["socket"]), str(data["token"]), int(data["pid"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, folder: Path) -> None:
        """Write it where attaching gateways look, readable by this user only, in one step."""
        temporary = folder / f".{ENDPOINT_FILE}.{os.getpid()}"
        temporary.unlink(missing_ok=True)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(asdict(self), out)
        os.replace(temporary, folder / ENDPOINT_FILE)

    def remove(self, folder: Path) -> None:
        """Remove the endpoint file and the socket, if they are still this owner's."""
        if Endpoint.read(folder) == self:
            (folder / ENDPOINT_FILE).unlink(missing_ok=True)
        Path(self.socket).unlink(missing_ok=True)


def in_use(folder: Path) -> str:
    """Who holds the index `folder`, in words."""
    endpoint = Endpoint.read(folder)
    owner = f"the gateway of pid {endpoint.pid}" if endpoint is not None else "another gateway"
    return f"{folder}: {owner} holds this index ({folder / LOCK_FILE})"


def socket_path(folder: Path) -> str:
    """`INDEX/gateway.sock`, or, when that path is too long for a unix socket, one in the temporary folder
    named after the index (and the user)."""
    inside = str(folder.resolve() / SOCKET_FILE)
    if len(inside.encode()) <= _SOCKET_PATH_MAX:
        return inside
    digest = hashlib.sha256(str(folder.resolve()).encode()).hexdigest()[:20]
    return str(Path(tempfile.gettempdir()) / f"toolscout-{os.getuid()}-{digest}.sock")


async def serve_hosts(mcp: Any, folder: Path, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
    """Serve attached hosts over the index's socket until cancelled (`mcp`: the `GatewayMcp` whose
    `run_local` serves one). Started once the socket listens and the endpoint file is written (with the
    `Endpoint`, or None when the socket could not be made: then this gateway serves its own host only)."""
    endpoint = Endpoint(socket_path(folder), secrets.token_urlsafe(32), os.getpid())
    attached = _Attached()
    mcp.gateway.before_shutdown(attached.leave)
    async with anyio.create_task_group() as connections:
        try:
            server = await _listen(endpoint, connections, mcp, attached)
        except OSError as exc:
            logger.warning("other hosts cannot attach to this gateway: no socket at %s (%s)", endpoint.socket, exc)
            task_status.started(None)
            await anyio.sleep_forever()
        try:
            endpoint.write(folder)
            task_status.started(endpoint)
            await anyio.sleep_forever()
        finally:
            server.close()
            endpoint.remove(folder)
            connections.cancel_scope.cancel()


async def _listen(endpoint: Endpoint, connections: Any, mcp: Any, attached: "_Attached") -> Any:
    Path(endpoint.socket).unlink(missing_ok=True)  # a crashed owner's: the lock holder's to replace
    server = await asyncio.start_unix_server(
        lambda reader, writer: connections.start_soon(_serve_host, mcp, endpoint, attached, reader, writer),
        path=endpoint.socket, limit=LINE_LIMIT)
    os.chmod(endpoint.socket, 0o600)
    return server


class _Attached:
    """The attached gateways' connections, each with the event of its `QUIET` word (or its end)."""

    def __init__(self) -> None:
        self.quiet: dict[asyncio.StreamWriter, anyio.Event] = {}

    async def leave(self) -> None:
        """Tell each attached gateway this owner stops, and wait until each sent its last request (see the
        module doc), `QUIET_WITHIN_S` at most: a gateway that does not answer holds up no shutdown."""
        waiting = list(self.quiet.items())
        for writer, _quiet in waiting:
            if not writer.is_closing():
                writer.write(LEAVING)
        with anyio.move_on_after(QUIET_WITHIN_S):
            for _writer, quiet in waiting:
                await quiet.wait()


class _QuietReader:
    """An attached gateway's lines, less its `QUIET` word, which sets `quiet` (as does the connection's end, a
    reset included)."""

    def __init__(self, reader: asyncio.StreamReader, quiet: anyio.Event):
        self.reader, self.quiet = reader, quiet

    async def readline(self) -> bytes:
        while True:
            try:
                line = await self.reader.readline()
            except ConnectionError:  # it closed with lines of ours unread (a reset): it left, as at an end
                line = b""
            if line == QUIET or not line:
                self.quiet.set()
            if line != QUIET:
                return line


async def _serve_host(mcp: Any, endpoint: Endpoint, attached: _Attached, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
    """One attached host: its gateway's hello (the token), then its MCP session until it leaves."""
    pid = None
    try:
        with anyio.fail_after(HELLO_TIMEOUT_S):
            hello = _parse(await reader.readline())
        if not hmac.compare_digest(str(hello.get("token", "")).encode(), endpoint.token.encode()):
            await _send(writer, {"toolscout": "refused", "reason": "wrong token (stale or foreign gateway.attach)"})
            return
        pid = int(hello.get("pid", 0))
        await _send(writer, {"toolscout": "attached", "pid": os.getpid()})
        logger.info("the host of gateway pid %d attached (session local:%d)", pid, pid)
        quiet = attached.quiet[writer] = anyio.Event()
        await mcp.run_local(_QuietReader(reader, quiet), writer, pid, carried_searches(hello.get("searches")))
    except (TimeoutError, ValueError, OSError) as exc:
        logger.info("an attaching gateway%s was dropped: %s", f" (pid {pid})" if pid else "", exc or type(exc).__name__)
    finally:
        gone = attached.quiet.pop(writer, None)
        if gone is not None:
            gone.set()  # a leaving owner waits for no connection that ended
        writer.close()
        if pid:
            logger.info("the host of gateway pid %d left", pid)


def carried_searches(value: Any) -> list[tuple[str, list[str], int]]:
    """The searches of an attaching gateway's hello, as (task, found, calls): what is not one is left out (it
    comes from this user's own gateway, but a host's session is no place for a malformed search)."""
    if not isinstance(value, list):
        return []
    searches = []
    for item in value[-SEARCHES_KEPT:]:
        if not isinstance(item, dict):
            continue
        task, found, calls = item.get("task"), item.get("found"), item.get("calls")
        if isinstance(task, str) and isinstance(found, list) and isinstance(calls, int):
            searches.append((task[:TASK_KEPT], [f for f in found[:FOUND_KEPT] if isinstance(f, str)], calls))
    return searches


async def attach(endpoint: Endpoint, searches: list[dict] | None = None
                 ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int]:
    """Connect to an owner and say hello (with the host's `searches` through the previous owner, if any);
    (reader, writer, the owner's pid). AttachFailed otherwise."""
    try:
        reader, writer = await asyncio.open_unix_connection(endpoint.socket, limit=LINE_LIMIT)
    except OSError as exc:
        raise AttachFailed(f"no gateway answers at {endpoint.socket} ({exc.strerror or exc})") from None
    hello = {"toolscout": "attach", "token": endpoint.token, "pid": os.getpid()}
    if searches:
        hello["searches"] = searches
    try:
        await _send(writer, hello)
        with anyio.fail_after(HELLO_TIMEOUT_S):
            answer = _parse(await reader.readline())
    except (TimeoutError, ValueError, OSError) as exc:
        writer.close()
        raise AttachFailed(f"the gateway at {endpoint.socket} did not welcome this one: {exc or 'no answer'}") from None
    if answer.get("toolscout") != "attached":
        writer.close()
        raise AttachFailed(f"the gateway at {endpoint.socket} refused: {answer.get('reason', answer)}")
    return reader, writer, int(answer.get("pid", endpoint.pid))


def _parse(line: bytes) -> dict:
    if not line:
        raise ValueError("the connection closed")
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError("not a hello")
    return message


async def _send(writer: asyncio.StreamWriter, message: dict) -> None:
    writer.write(json.dumps(message).encode() + b"\n")
    await writer.drain()
