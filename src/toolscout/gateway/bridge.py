"""A gateway attached to the owner of its index (hosts.py): its host's MCP session relayed to the owner, and
the index taken over when the owner stops.

Messages pass line by line, unchanged, both ways: every request, notification and answer of the protocol
(searches, calls with their progress, cancellation and elicitation, prompts, resources), whatever the host
speaks. The bridge keeps just enough to survive the owner's going:

- the host's requests the owner has not answered yet: when the owner's connection drops, each gets an error
  that says so (`-32603`), never silence: "try again", or for a call of a tool, which may have run, "call
  it again only if running it twice is safe" (a call is never re-sent: it may have acted);
- the host's requests sent once the owner said it stops (`hosts.LEAVING`): held, and sent to the next owner
  (the bridge answers `hosts.QUIET`, after which it sends the stopping owner answers and cancellations only);
- the owner's requests to the host (elicitation, pings): the host's answers to a previous owner are dropped;
- the host's `initialize` and `notifications/initialized` (2025 protocol), replayed to the next owner under a
  request id of the bridge's own (whose answer the host never sees), so the host's session goes on as it was.
  A 2026-protocol host carries its protocol in every request: there is nothing to replay;
- the host's latest searches, as their answers pass (task, tools found, calls since), handed to the next owner
  when attaching to it (`hosts.attach`): what the host learns by calling a tool that a search made through the
  previous owner returned is not lost at a take-over, and it stays the host's own (attribution.py).

When the owner's connection drops, the bridge takes the index's lock if it can and becomes the owner: it
opens the index and starts the upstreams (in a worker thread, then in its event loop), serves other hosts
over the socket, and relays its own host to itself like any other. Otherwise it attaches to whichever gateway
took the lock, as soon as that one serves. Meanwhile its host's messages wait. If no gateway serves the index
within `ATTACH_WITHIN_S`, the bridge stops with an error that says why.
"""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import sys
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, AsyncIterator, Callable

import anyio
import anyio.to_thread

from ..errors import ToolScoutError
from .attribution import SEARCHES_KEPT
from .hosts import FOUND_KEPT, LEAVING, QUIET, AttachFailed, Endpoint, IndexLock, attach, serve_hosts

logger = logging.getLogger(__name__)
ATTACH_WITHIN_S = 120.0  # the longest a host's messages wait for a gateway to serve the index
FLUSH_S = 0.1
_REPLAY_ID = "toolscout-bridge-initialize-"


@dataclass
class _Link:
    """The connection to the owner of the index."""

    reader: Any  # asyncio.StreamReader
    writer: Any  # asyncio.StreamWriter
    pid: int
    leaving: bool = False  # it said it stops: the host's requests wait for the next owner


@dataclass
class _Seen:
    """A search of the host's, as its answer passed: its task, the tools it found, the host's calls since."""

    task: str
    found: list[str]
    calls: int = 0


@dataclass
class _Owned:
    """The index, once this gateway owns it: its gateway, MCP server and lock."""

    gateway: Any
    mcp: Any
    lock: IndexLock


def say(message: str) -> None:
    print(f"toolscout gateway: {message}", file=sys.stderr, flush=True)


class Bridge:
    """See the module doc. `make_owner()` opens the index and returns (Gateway, GatewayMcp); it runs in a
    worker thread, once this gateway holds the index's lock."""

    def __init__(self, folder: Path, make_owner: Callable[[], tuple[Any, Any]]):
        self.folder, self.make_owner = folder, make_owner
        self.owned: _Owned | None = None
        self.pending: dict[Any, str] = {}  # the host's requests in flight at the owner: id -> method
        self.asked: set[Any] = set()  # the owner's requests in flight at the host
        self.initialize: dict | None = None  # the host's initialize request (2025 protocol)
        self.initialized: str | None = None  # its notifications/initialized line
        self.replayed: set[str] = set()  # ids of the initialize requests the bridge replayed
        self.searching: dict[Any, str] = {}  # the host's search_tools requests in flight: id -> task
        self.calling: set[Any] = set()  # its other tools/call requests in flight (calls of upstream tools)
        self.searches: deque[_Seen] = deque(maxlen=SEARCHES_KEPT)  # its latest searches, for the next owner
        self.held: deque[str] = deque()  # its requests sent once the owner said it stops, for the next owner
        self.out: Any = None  # the host's stdout (text writer)
        self._host_send: Any = None  # the host's lines, read as they come, relayed to whichever owner serves
        self._host_receive: Any = None
        self._tasks: Any = None
        self.host_left = False  # its stdin ended: once what it sent is relayed, the bridge stops

    def close(self) -> None:
        """After the event loop: close the index this gateway owned (a snapshot), then release its lock."""
        if self.owned is not None:
            try:
                self.owned.gateway.close()
                self.owned.gateway.service.close()
            finally:
                self.owned.lock.release()

    async def run(self) -> None:
        """Relay the host to the owner (re-attaching, or taking the index over) until the host leaves."""
        self._host_send, self._host_receive = anyio.create_memory_object_stream[str](math.inf)
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with _host_pipes() as (host_in, self.out), anyio.create_task_group() as tasks:
                self._tasks = tasks
                tasks.start_soon(self._read_host, host_in)
                tasks.start_soon(self._on_signal, signals)
                while True:
                    link = await self._connect()
                    if link is None or await self._relay(link):
                        break  # the host left
                    await self._fail_pending(link.pid)
                await self._finish()

    async def _read_host(self, host_in: Any) -> None:
        async with self._host_send:
            async for line in host_in:
                await self._host_send.send(line)
        self.host_left = True

    async def _on_signal(self, signals: Any) -> None:
        async for _signal in signals:
            await self._finish()
            return

    async def _finish(self) -> None:
        """The host is gone (or a signal came): calls in flight for other hosts get their grace, then all stops."""
        if self.owned is not None:
            await self.owned.gateway.shutdown()
            await anyio.sleep(FLUSH_S)
        self._tasks.cancel_scope.cancel()

    # attaching --------------------------------------------------------------------------------
    async def _connect(self) -> _Link | None:
        """Attach to the index's owner; take the index over when no gateway holds it. None: the host left
        meanwhile (nobody is waiting for answers)."""
        deadline = anyio.current_time() + ATTACH_WITHIN_S
        delay, why = 0.05, "no gateway has served it yet"
        while not self.host_left:
            if self.owned is None:
                lock = IndexLock.claim(self.folder)
                if lock is not None:
                    await self._take_over(lock)
            endpoint = Endpoint.read(self.folder)
            if endpoint is not None:
                try:
                    reader, writer, pid = await attach(endpoint, [asdict(seen) for seen in self.searches])
                    return await self._greet(_Link(reader, writer, pid))
                except (AttachFailed, OSError) as exc:  # not serving yet, or gone already
                    why = str(exc)
            if anyio.current_time() > deadline:
                raise ToolScoutError(f"{self.folder}: another gateway holds this index ({self.folder / 'gateway.lock'}) "
                                     f"but none served it within {ATTACH_WITHIN_S:g} s: {why}")
            await anyio.sleep(delay)  # the owner is still opening the index, or just stopped
            delay = min(delay * 2, 0.5)
        return None

    async def _take_over(self, lock: IndexLock) -> None:
        say(f"no gateway serves {self.folder} now: this one (pid {os.getpid()}) opens it and starts the upstreams")
        try:
            gateway, mcp = await anyio.to_thread.run_sync(self.make_owner)
        except BaseException:
            lock.release()
            raise
        self.owned = _Owned(gateway, mcp, lock)
        await self._tasks.start(self._own, gateway, mcp)

    async def _own(self, gateway: Any, mcp: Any, *, task_status: Any = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as owner:
            owner.start_soon(gateway.run)
            endpoint = await owner.start(serve_hosts, mcp, self.folder)
            if endpoint is None:
                raise ToolScoutError(f"{self.folder}: this gateway took the index over but cannot serve its own host "
                                     "through the index's socket (see the warning above)")
            say(f"serving {self.folder} (pid {os.getpid()}); other hosts attach through {endpoint.socket}")
            task_status.started()

    async def _greet(self, link: _Link) -> _Link:
        """Say to a new owner what the host said to the first: its initialize (answered to the bridge)."""
        owner = "this gateway" if link.pid == os.getpid() else f"the gateway served by pid {link.pid}"
        say(f"attached to {owner} ({self.folder})")
        if self.initialize is not None:
            replay_id = f"{_REPLAY_ID}{len(self.replayed) + 1}"
            self.replayed.add(replay_id)
            await _write(link, json.dumps({**self.initialize, "id": replay_id}) + "\n")
            if self.initialized is not None:
                await _write(link, self.initialized)
        return link

    # relaying ---------------------------------------------------------------------------------
    async def _relay(self, link: _Link) -> bool:
        """Relay both ways until the owner's connection or the host ends; True when the host did."""
        host_left = False
        async with anyio.create_task_group() as relay:
            async def from_owner() -> None:
                while True:
                    try:
                        line = await link.reader.readline()
                    except ValueError:  # longer than the limit: dropped (the owner answers nothing that long)
                        continue
                    except OSError:
                        line = b""
                    if not line:
                        break
                    if line == LEAVING:
                        await self._owner_leaving(link)
                        continue
                    text = line.decode("utf-8", errors="replace")
                    if self._from_owner(text):
                        await self.out.write(text)
                        await self.out.flush()
                say(f"the gateway served by pid {link.pid} stopped")
                relay.cancel_scope.cancel()

            async def from_host() -> None:
                nonlocal host_left
                while self.held and not link.leaving:  # what waited for this owner goes first, in order
                    if not await self._pass_on(link, self.held.popleft()):
                        return
                async for line in self._host_receive:
                    if not await self._pass_on(link, line):
                        return  # the owner is gone: from_owner hears it too
                host_left = True
                relay.cancel_scope.cancel()

            relay.start_soon(from_owner)
            relay.start_soon(from_host)
        link.writer.close()
        return host_left

    async def _owner_leaving(self, link: _Link) -> None:
        """The owner stops: from now on the host's requests wait for the next owner; the owner is told no
        request follows (`_pass_on` holds them from the moment `leaving` is set: no request passes it)."""
        link.leaving = True
        say(f"the gateway served by pid {link.pid} stops: this host's requests wait for the gateway that takes "
            "the index over")
        try:
            await _write(link, QUIET.decode())
        except OSError:
            pass  # gone already: from_owner hears it

    async def _pass_on(self, link: _Link, line: str) -> bool:
        """Relay one line of the host's to the owner, or hold it for the next owner (a request, while this one
        stops); False when the owner is gone (a request written then fails with the others pending)."""
        if link.leaving and _is_request(line):
            self.held.append(line)
            return True
        if self.held and self._cancels_held(line):
            return True
        if not self._from_host(line):
            return True
        try:
            await _write(link, line)
        except OSError:
            return False
        return True

    def _cancels_held(self, line: str) -> bool:
        """Whether `line` cancels a held request: then both are dropped (a cancelled call is never sent)."""
        message = _message(line)
        params = message.get("params") if message is not None else None
        if message is None or message.get("method") != "notifications/cancelled" or not isinstance(params, dict):
            return False
        cancelled = _id(params.get("requestId"))
        for held in list(self.held):
            if _id((_message(held) or {}).get("id")) == cancelled:
                self.held.remove(held)
                return True
        return False

    def _from_host(self, line: str) -> bool:
        """Note a message of the host's on its way to the owner; False: drop it (an answer to a past owner)."""
        message = _message(line)
        if message is None:
            return True
        method, request_id = message.get("method"), _id(message.get("id"))
        if method is None:
            if request_id in self.asked:
                self.asked.discard(request_id)
                return True
            return False
        if request_id is not None:
            self.pending[request_id] = str(method)
            if method == "initialize":
                self.initialize = message
            elif method == "tools/call":
                self._note_call(request_id, message.get("params"))
        elif method == "notifications/initialized":
            self.initialized = line if line.endswith("\n") else line + "\n"
        elif method == "notifications/cancelled" and isinstance(message.get("params"), dict):
            self._forget(_id(message["params"].get("requestId")))  # no answer comes, nor is one owed
        return True

    def _note_call(self, request_id: Any, params: Any) -> None:
        """A tools/call of the host's: a search (its task kept until its answer), or a call of a tool."""
        params = params if isinstance(params, dict) else {}
        arguments = params.get("arguments") if isinstance(params.get("arguments"), dict) else {}
        if params.get("name") == "search_tools":
            if isinstance(arguments.get("task"), str):
                self.searching[request_id] = arguments["task"]
        elif params.get("name") != "record_tool_use":
            self.calling.add(request_id)

    def _noted_answer(self, request_id: Any, message: dict) -> None:
        """The owner answered a request of the host's: a search's result is kept, and a call's counts against
        the searches before it (the owner's attribution window). Every result of a call counts, the
        gateway's own refusals too (which the owner does not count): a search may leave the window a little
        early, never late."""
        task = self.searching.pop(request_id, None)
        called = request_id in self.calling
        self.calling.discard(request_id)
        result = message.get("result")
        if not isinstance(result, dict):
            return
        if task is not None and not result.get("isError"):
            found = _found(result)
            if found is not None:
                self.searches.append(_Seen(task, found))
        elif called:
            for seen in self.searches:
                seen.calls += 1

    def _forget(self, request_id: Any) -> None:
        self.pending.pop(request_id, None)
        self.searching.pop(request_id, None)
        self.calling.discard(request_id)

    def _from_owner(self, line: str) -> bool:
        """Note a message of the owner's on its way to the host; False: keep it (the answer to a replay)."""
        message = _message(line)
        if message is None:
            return True
        request_id = _id(message.get("id"))
        if request_id is None:
            return True
        if "method" in message:
            self.asked.add(request_id)
            return True
        if request_id in self.replayed:
            self.replayed.discard(request_id)
            return False
        self.pending.pop(request_id, None)
        self._noted_answer(request_id, message)
        return True

    async def _fail_pending(self, pid: int) -> None:
        """The owner left: each request of the host's that it had not answered gets an error saying so, and
        whether sending it again is safe (a call of a tool may have run before the owner went)."""
        for request_id, method in list(self.pending.items()):
            if method == "initialize":
                self.initialize = None  # never answered: nothing to replay
            again = ("call it again only if running it twice is safe (it may have run)" if request_id in self.calling
                     else "try again")
            error = {"code": -32603, "message": f"the toolscout gateway that served this index (pid {pid}) stopped "
                                                f"before it answered {method}; another gateway takes over the "
                                                f"index: {again}"}
            await self.out.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "error": error}) + "\n")
        await self.out.flush()
        self.pending.clear()
        self.searching.clear()
        self.calling.clear()
        self.asked.clear()
        self.replayed.clear()


async def _write(link: _Link, line: str) -> None:
    link.writer.write(line.encode("utf-8") if line.endswith("\n") else (line + "\n").encode("utf-8"))
    await link.writer.drain()


def _is_request(line: str) -> bool:
    message = _message(line)
    return message is not None and "method" in message and _id(message.get("id")) is not None


def _id(value: Any) -> str | int | None:
    """A JSON-RPC id as the bridge keeps it (None: none, or not one the protocol allows)."""
    return value if isinstance(value, (str, int)) and not isinstance(value, bool) else None


def _found(result: dict) -> list[str] | None:
    """The ids of the tools a search_tools result holds (its structured content, else its text), or None."""
    content = result.get("structuredContent")
    if not isinstance(content, dict):
        blocks = result.get("content")
        text = blocks[0].get("text") if isinstance(blocks, list) and blocks and isinstance(blocks[0], dict) else None
        content = _message(text) if isinstance(text, str) else None
    tools = content.get("tools") if isinstance(content, dict) else None
    if not isinstance(tools, list):
        return None
    return [t["id"] for t in tools[:FOUND_KEPT] if isinstance(t, dict) and isinstance(t.get("id"), str)]


def _message(line: str) -> dict | None:
    try:
        message = json.loads(line)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


@asynccontextmanager
async def _host_pipes() -> AsyncIterator[tuple[Any, Any]]:
    """The host's stdin lines and stdout writer: the event loop's own pipes, or (a terminal, a file) threads."""
    from .stdio import pipe_stdio

    async with pipe_stdio() as (lines, out):
        if lines is not None:
            yield lines, out
            return
        yield anyio.wrap_file(sys.stdin), anyio.wrap_file(sys.stdout)


def attach_stdio(folder: Path, make_owner: Callable[[], tuple[Any, Any]]) -> None:
    """Serve the host on stdio through the gateway that owns `folder`, taking the index over when that one
    stops: then `make_owner()` (in a worker thread) opens it and returns (Gateway, GatewayMcp)."""
    from .stdio import has_uvloop

    bridge = Bridge(folder, make_owner)
    try:
        anyio.run(bridge.run, backend_options={"use_uvloop": has_uvloop()})
    finally:
        bridge.close()
