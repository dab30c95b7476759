"""The gateway: one catalog of every upstream's tools, searched like `toolscout serve`, with calls forwarded
to the upstream that runs each tool, and learning from the calls it forwards.

    upstreams (config.py) ──listings──▶ index (the service's catalog, a pipeline directory)
    agent ── search ──▶ ToolService.search ──▶ hits (held tools left out, `available` from upstream state)
    agent ── call ──▶ resolve the id ──▶ the upstream's `call` ──▶ its result, as it came
                                      └──▶ attribution (attribution.py) ──▶ feedback, learned in the background

The interfaces (the MCP server in `mcp_server.py`, the HTTP routes in `http.py`) only translate: every
policy of the gateway is here. Who may see and call what is the service's `Principal`: a caller that cannot
see a tool's namespace can neither find nor call it.
"""

from __future__ import annotations

import asyncio
import difflib
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import anyio
import anyio.to_thread

from ..errors import Conflict, InvalidRequest, NotFound, RateLimited
from ..feedback import FeedbackEvent, LearnResult
from ..hits import Hit
from ..serve.auth import ANONYMOUS
from ..serve.service import ADMIN, Principal, Reach, ToolService
from ..tool import Tool
from .attribution import CallAttribution
from .definitions import DefinitionLedger
from .upstream import Listing, ToolResult, Upstream

logger = logging.getLogger(__name__)
# the host that launched a stdio gateway: its explicit feedback and its calls' count as one source
STDIO = Principal("stdio", None, False, feedback=True, source="session:stdio")
SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"


@dataclass(frozen=True)
class GatewayOptions:
    """`hide_unavailable`: leave the tools of a down upstream out of search (else they are marked
    `available: false`). `disabled`: upstreams the config turned off (their tools stay indexed, hidden)."""

    hide_unavailable: bool = False
    disabled: frozenset[str] = frozenset()


def http_session(principal: Principal) -> str:
    """The session of an HTTP caller without an MCP session: its token (one agent per token), or anonymous."""
    return f"http:{principal.name}"


class Gateway:
    """See the module doc. Its async methods run in the gateway's event loop; the service is thread-safe."""

    def __init__(self, service: ToolService, upstreams: Iterable[Upstream], definitions: DefinitionLedger,
                 attribution: CallAttribution, options: GatewayOptions = GatewayOptions()):
        self.service, self.definitions, self.attribution, self.options = service, definitions, attribution, options
        self.upstreams: dict[str, Upstream] = {u.name: u for u in upstreams}
        self.learner = CallLearner(service)
        self._names: dict[str, set[str]] = {}  # bare tool name -> ids, for calls by name
        self._names_lock = threading.Lock()  # listings are indexed in worker threads
        for tool in service.tools:
            self._names.setdefault(tool.name, set()).add(tool.id)
        service.reach = self.reach

    # running -----------------------------------------------------------------------------------
    async def run(self) -> None:
        """Supervise every enabled upstream at once (a slow one holds up no other), until cancelled."""
        async with anyio.create_task_group() as tasks:
            for upstream in self.upstreams.values():
                if upstream.name not in self.options.disabled:
                    tasks.start_soon(upstream.run, self.index_listing, name=f"upstream {upstream.name}")
                else:
                    upstream.status.change("disabled")

    def close(self) -> None:
        self.learner.close()

    async def index_listing(self, listing: Listing) -> None:
        """Bring the index in line with one upstream's listing: new and changed tools are embedded, tools
        it no longer lists are removed, unchanged ones (and what feedback taught them) stay as they are."""
        changed = await anyio.to_thread.run_sync(self.definitions.observe, listing.tools)
        for tool_id in changed:
            logger.warning("upstream %s changed the definition of %s%s", listing.upstream, tool_id,
                           " (held until approved: toolscout gateway approve)" if self.definitions.pin else "")
        await anyio.to_thread.run_sync(self._write_listing, listing)

    def _write_listing(self, listing: Listing) -> None:
        _total, indexed = self.service.list(ADMIN, namespace=listing.upstream, limit=1 << 30)
        listed = {t.id for t in listing.tools}
        gone = [t for t in indexed if t.id not in listed]
        if listing.tools:
            self.service.upsert(listing.tools)
        if gone:
            self.service.delete([t.id for t in gone])
        with self._names_lock:
            for tool in gone:
                self._names.get(tool.name, set()).discard(tool.id)
            for tool in listing.tools:
                self._names.setdefault(tool.name, set()).add(tool.id)

    def prune(self, namespaces: Iterable[str]) -> list[str]:
        """Remove the indexed tools of namespaces no upstream serves any more (a server taken out of the
        config); returns their ids."""
        keep = set(namespaces)
        stale = [t.id for t in self.service.tools if (t.namespace or "") not in keep]
        if stale:
            self.service.delete(stale)
            logger.warning("removed %d tools of servers no longer in the config", len(stale))
        return stale

    # what search may return --------------------------------------------------------------------
    def reach(self) -> Reach:
        down = frozenset(name for name, u in self.upstreams.items()
                         if name not in self.options.disabled and u.status.state != "up")
        usable = frozenset(self.upstreams) - self.options.disabled
        if self.options.hide_unavailable:
            usable -= down
        return Reach(namespaces=usable, held=self.definitions.held_ids(), down=down)

    async def search(self, task: str, k: int, *, principal: Principal, session: str,
                     namespaces: list[str] | None = None) -> list[Hit]:
        """The default pipeline's best tools for `task`, as `toolscout serve` ranks them; remembered as the
        session's latest search (for attributing its calls)."""
        future = self.service.search_future(task, k, principal=principal, namespaces=namespaces)
        if future is not None:
            hits = await asyncio.wrap_future(future)
        else:
            hits = await anyio.to_thread.run_sync(lambda: self.service.search(task, k, principal=principal,
                                                                              namespaces=namespaces))
        self.searched(session, task, hits)
        return hits

    def searched(self, session: str, task: str, hits: list[Hit]) -> None:
        self.attribution.searched(session, task, [h.tool.id for h in hits])

    # calls -------------------------------------------------------------------------------------
    def resolve(self, name: str, principal: Principal) -> Tool:
        """The tool `name` means: its id, or a bare tool name that only one tool the caller sees carries.
        NotFound (with the nearest ids) or InvalidRequest (an ambiguous name) otherwise."""
        try:
            return self.service.get(name, principal)
        except NotFound:
            pass
        with self._names_lock:
            named = list(self._names.get(name, ()))
        visible = [tool for tid in sorted(named) if (tool := self._visible(tid, principal)) is not None]
        if len(visible) == 1:
            return visible[0]
        if visible:
            ids = ", ".join(t.id for t in visible[:10])
            raise InvalidRequest(f"{len(visible)} tools are named {name!r} ({ids}); call one by its id")
        near = difflib.get_close_matches(name, [t.id for t in self.service.tools if principal.sees(t)], n=3)
        hint = f"; did you mean {', '.join(near)}?" if near else "; search_tools finds tools and gives their ids"
        raise NotFound(f"no tool {name!r}{hint}")

    def _visible(self, tool_id: str, principal: Principal) -> Tool | None:
        """The tool `tool_id` if the caller may see it (and search may return it), else None."""
        try:
            return self.service.get(tool_id, principal)
        except NotFound:
            return None

    async def call(self, name: str, arguments: Mapping[str, Any], *, principal: Principal, session: str,
                   headers: Mapping[str, str] | None = None) -> ToolResult:
        """Forward one call; the upstream's result (`ToolResult`), as it came. Raises NotFound (no such tool for
        this caller), Conflict (held until approved), or `UpstreamUnavailable` (naming the upstream)."""
        tool = self.resolve(name, principal)
        upstream = self.upstreams.get(tool.namespace or "")
        if upstream is None or upstream.name in self.options.disabled:
            raise NotFound(f"tool {tool.id!r}: its server {tool.namespace!r} is not enabled in the gateway's config")
        if self.definitions.held(tool.id):
            raise Conflict(f"tool {tool.id!r} changed since it was approved (see GET /tools/{tool.id}); an operator "
                           f"approves it with: toolscout gateway approve {tool.id}")
        lowered = {k.lower(): v for k, v in (headers or {}).items()}
        forwarded = {h: lowered[h] for h in upstream.forward_headers if h in lowered}
        result = await upstream.call(tool, arguments, forwarded)
        self._learn_from(session, principal, tool.id, failed=result.get("isError") is True)
        return _as_forwarded(result)

    def _learn_from(self, session: str, principal: Principal, tool_id: str, failed: bool) -> None:
        task = self.attribution.called(session, tool_id)
        if task is None:
            return
        self.learner.submit(FeedbackEvent(task[:20_000], (tool_id,), self._source(principal, session),
                                          "failure" if failed else "success"))

    @staticmethod
    def _source(principal: Principal, session: str) -> str:
        """Whose feedback a call is: the principal's own `source` (a tokens file's, or stdio's `session:stdio`),
        a token's client (its name), else the session (the admin token and anonymous callers stand for no
        one client)."""
        if principal.source:
            return principal.source
        if principal in (ADMIN, ANONYMOUS):
            return f"session:{session}"[:200]
        return principal.name

    def record(self, task: str, tool_ids: list[str], outcome: str | None, principal: Principal) -> LearnResult:
        """Explicit feedback (`record_tool_use`), as `POST /feedback` takes it."""
        return self.service.feedback([{"query": task, "tool_ids": tool_ids, "outcome": outcome}], principal)

    # status ------------------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return {"upstreams": [u.status.to_dict() for u in self.upstreams.values()],
                "learning_from_calls": {"rule": self.attribution.rule, "window": self.attribution.window,
                                        **self.learner.stats()},
                "pinned": self.definitions.pin, "held_tools": len(self.definitions.held_ids())}

    def tool_details(self, tool_id: str) -> dict[str, Any]:
        """What `/tools/{id}` adds for a gateway tool: its upstream, whether it answers, its definition record."""
        tool = self.service.get(tool_id)
        upstream = self.upstreams.get(tool.namespace or "")
        return {"upstream": upstream.name if upstream else None,
                "available": upstream is not None and upstream.status.state == "up",
                "definition": self.definitions.describe(tool_id)}


class CallLearner:
    """Feedback from forwarded calls, learned on a thread of its own so that no call waits for it."""

    def __init__(self, service: ToolService):
        self.service = service
        self.learned = self.dropped = self.submitted = self.done = 0
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="toolscout-call-learner", daemon=True)
        self._thread.start()

    def submit(self, event: FeedbackEvent) -> None:
        self.submitted += 1
        self._queue.put(event)

    def stats(self) -> dict[str, int]:
        return {"events": self.submitted, "pending": self.submitted - self.done, "learned": self.learned,
                "dropped": self.dropped}

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            batch = [self._queue.get()]
            while len(batch) < 256 and not self._queue.empty():
                batch.append(self._queue.get())
            stop = None in batch
            events = [e for e in batch if e is not None]
            if events:
                self._learn(events)
            if stop:
                return

    def _learn(self, events: list[FeedbackEvent]) -> None:
        try:
            result = self.service.feedback(events, ADMIN)  # trusted: each event names its own source
            self.learned += len(result.learned)
        except RateLimited as exc:
            self.dropped += len(events)
            logger.warning("feedback from %d forwarded calls dropped: %s", len(events), exc)
        except Exception:  # a bug: logged, and the gateway goes on forwarding calls
            self.dropped += len(events)
            logger.exception("learning from %d forwarded calls failed", len(events))
        finally:
            self.done += len(events)


def _as_forwarded(result: ToolResult) -> ToolResult:
    """The upstream's result as the agent gets it: unchanged, but for the wire's own bookkeeping (the
    upstream's identity stamp and result type: the agent's connection is to the gateway, which adds its own)."""
    forwarded = {key: value for key, value in result.items() if key not in ("resultType", "_meta")}
    meta = {key: value for key, value in (result.get("_meta") or {}).items() if key != SERVER_INFO_META}
    if meta:
        forwarded["_meta"] = meta
    return forwarded
