"""The gateway: one catalog of every upstream's tools, searched like `toolscout serve`, with calls forwarded
to the upstream that runs each tool, and learning from the calls it forwards.

    upstreams (config.py) ──listings──▶ index (the service's catalog: a pipeline directory, or PostgreSQL
                                        shared by replicas; listings.py says what a listing lets go)
    agent ── search ──▶ ToolService.search ──▶ hits (held tools left out, `available` from upstream state)
    agent ── call ──▶ resolve the id ──▶ the upstream's `call` ──▶ its result, as it came
                                      └──▶ attribution (attribution.py) ──▶ feedback, learned in the background

The interfaces (the MCP server in `mcp_server.py`, the HTTP routes in `http.py`) only translate: every
policy of the gateway is here. Who may see and call what is the service's `Principal`: a caller that cannot
see a tool's namespace can neither find nor call it.

- A search waits for the upstreams it could find tools of that are starting and have none in the index yet
  (a new index, a server new to the config), `GatewayOptions.search_wait` seconds at most for each, counted
  from the first search that waited for it; its answer names the upstreams whose tools it could not search
  (`searchable`), so a search is never empty only because upstreams were still starting.
- Upstreams start a few at a time (`run`), those with no tools in the index first, so a gateway restarted over
  its kept index answers searches while its servers load; one that a search or a call waits for starts at once.
- A call names its server even when the tool is unknown: `NS.tool` of a server that is still starting waits
  for it (up to its timeout; its listing may bring the tool), and of a server that is down fails at once
  with the reason (an unset variable, a missing command, a crash...).
- Prompts and resources of MCP upstreams pass through, namespaced like tools: a prompt `NS.name`, a resource
  `toolscout://NS/URI` (a template the same way; a URI as an upstream gave it is found by which upstream
  listed it or has a template that matches it). Listing them is a read; getting, reading, subscribing and
  completing act on a server, so they need a token as calls do. Their changes reach the interfaces through
  `listen`.
- Shutdown (`shutdown`): the hooks given to `before_shutdown` run first (the hosts attached to this gateway
  are told it stops), then new calls are refused, calls in flight get `SHUTDOWN_GRACE_S` to finish, then are
  cancelled (upstream too); every caller gets an error that says so (`ShuttingDown`: whether the call ran).
"""

from __future__ import annotations

import difflib
import logging
import queue
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Mapping

import anyio
import anyio.lowlevel
import anyio.to_thread

from ..errors import Conflict, Forbidden, InvalidRequest, NotFound, RateLimited, TooLarge, Unavailable
from ..feedback import FeedbackEvent, likely_renames, renames_note
from ..hits import Hit, Hits
from ..ingest.live_mcp import error_reason
from ..serve.auth import ANONYMOUS
from ..serve.errors import ServiceError
from ..serve.service import ADMIN, Principal, Reach, ToolService
from ..tool import Tool
from .attribution import CallAttribution
from .config import LEARN_GATHER_S, SEARCH_WAIT_S, START_TURN_S, starts_at_once
from .definitions import DefinitionLedger
from .listings import OwnListings
from .upstream import NO_RELAY, Listing, ListingNotRecorded, Relay, ToolResult, Upstream, UpstreamUnavailable

logger = logging.getLogger(__name__)
# the host that launched a stdio gateway: its explicit feedback and its calls' count as one source
STDIO = Principal("stdio", None, False, feedback=True, source="session:stdio")
SERVER_INFO_META = "io.modelcontextprotocol/serverInfo"
SHUTDOWN_GRACE_S = 1.5  # what calls in flight get to finish when the gateway stops, before they are cancelled
RESOURCE_PREFIX = "toolscout://"  # a resource of upstream NS is toolscout://NS/<its own URI>
# What an interface is told of the upstreams' prompts and resources: (upstream, what, uri) with what "prompts"
# or "resources" (a list of that upstream's changed) or "updated" (the resource `uri`, as `subscribe` returned
# it, changed); the upstream, so that only those who may see its namespace are told.
Listener = Callable[[str, str, "str | None"], Awaitable[None]]


class ShuttingDown(ServiceError):
    """The gateway is stopping: a call is refused (`ran` False: nothing was done), or was cancelled in flight
    (`ran` True: its server was told, and it may have acted already). `what`: the call, in words."""

    def __init__(self, message: str, what: str = "", ran: bool = False):
        super().__init__(message)
        self.what, self.ran = what, ran


@dataclass(frozen=True)
class GatewayOptions:
    """`hide_unavailable`: leave the tools of a down upstream out of search (else they are marked
    `available: false`). `disabled`: upstreams the config turned off (their tools stay indexed, hidden).
    `search_wait`: seconds searches wait, in all, for an upstream that is starting with no tools indexed.
    `starts_at_once`: how many upstreams start together (`run`)."""

    hide_unavailable: bool = False
    disabled: frozenset[str] = frozenset()
    search_wait: float = SEARCH_WAIT_S
    starts_at_once: int = field(default_factory=starts_at_once)


@dataclass(frozen=True)
class Searched:
    """A search's answer: its hits, and the upstreams whose tools it could not search (`Gateway.searchable`)."""

    hits: Hits
    not_searchable: list[dict[str, str]]


def http_session(principal: Principal) -> str:
    """The session of an HTTP caller without an MCP session: its token (one agent per token), or anonymous."""
    return f"http:{principal.name}"


def upstream_reach(upstreams: Iterable[Upstream], options: GatewayOptions,
                   definitions: DefinitionLedger) -> Callable[[], Reach]:
    """What search may return now, as the gateway's service is given it (`ToolService(reach=...)`): the tools of
    enabled upstreams (with `hide_unavailable`, of those up; with pinning, of those that listed their tools since
    the gateway started, so no tool is offered before its present definition was compared with the approved one),
    none held until approved, each marked with whether its upstream answers."""
    upstreams = list(upstreams)

    def reach() -> Reach:
        down = frozenset(u.name for u in upstreams if u.name not in options.disabled and u.status.state != "up")
        usable = frozenset(u.name for u in upstreams) - options.disabled
        if options.hide_unavailable:
            usable -= down
        if definitions.pin:
            usable -= {u.name for u in upstreams if not u.status.listed}
        return Reach(namespaces=usable, held=definitions.held_ids(), down=down)

    return reach


class Gateway:
    """See the module doc. Its async methods run in the gateway's event loop; the service is thread-safe.
    The service was made with `upstream_reach` of the same upstreams, options and definitions
    (`runtime.open_gateway`), so its searches return what may be called."""

    def __init__(self, service: ToolService, upstreams: Iterable[Upstream], definitions: DefinitionLedger,
                 attribution: CallAttribution, options: GatewayOptions = GatewayOptions(), *,
                 listings: Any = None):
        self.service, self.definitions, self.attribution, self.options = service, definitions, attribution, options
        self.listings = listings or OwnListings()  # what a listing lets go (listings.py)
        self.upstreams: dict[str, Upstream] = {u.name: u for u in upstreams}
        self.learner = CallLearner(service)
        self._names: dict[str, set[str]] = {}  # bare tool name -> ids, for calls by name
        self._names_lock = threading.Lock()  # listings are indexed in worker threads
        for tool in service.tools:
            self._names.setdefault(tool.name, set()).add(tool.id)
        self._indexed = {tool.namespace or "" for tool in service.tools}  # namespaces with tools in the index
        self._listed: set[str] = set()  # upstreams that listed their tools since the gateway started
        self._wait_until: dict[str, float] = {}  # upstream -> when searches stop waiting for it
        self._listeners: list[Listener] = []
        self._subscriptions: dict[str, int] = {}  # resource (as subscribe returns it) -> agents subscribed
        self._calls: set[anyio.CancelScope] = set()  # calls in flight, cancelled at shutdown
        self._closing = False
        self._drained: Any = None  # an anyio.Event while shutting down
        self._before_shutdown: list[Callable[[], Awaitable[None]]] = []
        enabled = [u for u in self.upstreams.values() if u.name not in options.disabled]
        # upstreams not started yet, in the order they start (those a search needs first)
        self._queued = {u.name: u for u in sorted(enabled, key=lambda u: u.name in self._indexed)}
        self._tasks: Any = None  # run's task group, once it runs

    # running -----------------------------------------------------------------------------------
    async def run(self) -> None:
        """Supervise every enabled upstream (a slow one holds up no other), until cancelled. They start
        `options.starts_at_once` at a time (config.START_TURN_S), those with no tools in the index first; one that
        a search or a call waits for starts at once."""
        async with anyio.create_task_group() as tasks:
            self._tasks = tasks
            for upstream in self.upstreams.values():
                if upstream.name in self.options.disabled:
                    upstream.status.change("disabled")
            if self.listings.heartbeat_every:
                tasks.start_soon(self._beat, self.listings.heartbeat_every, name="listings heartbeat")
            turns = anyio.Semaphore(self.options.starts_at_once)
            while self._queued:
                await turns.acquire()
                if self._queued:
                    self._start(next(iter(self._queued)), turns)
                else:
                    turns.release()

    def _start(self, name: str, turns: Any = None) -> None:
        """Start the queued upstream `name` now; `turns` (the pacing's) is given back when its start ends."""
        upstream = self._queued.pop(name)
        self._tasks.start_soon(upstream.run, self.index_listing, self._noticed, name=f"upstream {name}")
        if turns is not None:
            self._tasks.start_soon(self._turn_ends, upstream, turns)

    @staticmethod
    async def _turn_ends(upstream: Upstream, turns: Any) -> None:
        await upstream.wait_up(START_TURN_S)
        turns.release()

    def _needed(self, upstream: Upstream) -> None:
        """A search or a call waits for `upstream`: if it is still queued, it starts now, out of turn."""
        if upstream.name in self._queued and self._tasks is not None:
            self._start(upstream.name)

    async def _beat(self, every: float) -> None:
        """Beat every `every` seconds while the gateway runs (`beat`); a beat the database misses is retried at
        the next one."""
        while True:
            await anyio.sleep(every)
            try:
                await self.beat()
            except Exception as exc:  # the database is away: the next beat tries again
                logger.warning("telling the other replicas this gateway is alive failed: %s", exc)

    async def beat(self) -> None:
        """One beat (`announce`); when it finds this gateway had been taken for gone (paused, or cut off from the
        database, for longer than the others wait), its servers are listed again at once: what only its listings
        kept may have gone meanwhile, and would otherwise be missing until their next periodic relisting."""
        if await anyio.to_thread.run_sync(self.announce):
            up = [u for u in self.upstreams.values() if u.status.state == "up"]
            logger.warning("this replica missed its beats for so long that the others took it for gone, and may "
                           "have let go of tools only it listed: listing its %d servers that are up again", len(up))
            for upstream in up:
                await upstream.relist()

    def announce(self) -> bool:
        """Tell the replicas this gateway shares the catalog with that it is alive and which servers its config
        names, and prune what no server serves any more (listings.py); whether it had been taken for gone."""
        names = list(self.upstreams)
        late = self.listings.heartbeat(names)
        self.prune(names)
        return late

    def close(self) -> None:
        self.learner.close()
        try:
            self.listings.close()
        except Exception as exc:  # the others see it gone after listings.LIVE_S instead
            logger.warning("telling the other replicas this gateway stops failed: %s", exc)

    def before_shutdown(self, hook: Callable[[], Awaitable[None]]) -> None:
        """`hook()` is awaited once, when shutdown begins, before calls are refused (hosts.py tells the hosts
        attached to this gateway, so that they send their next requests to the gateway that takes over)."""
        self._before_shutdown.append(hook)

    async def shutdown(self, grace: float = SHUTDOWN_GRACE_S) -> None:
        """Refuse new calls; give those in flight `grace` seconds to finish, then cancel them (each caller gets
        a `ShuttingDown` error, and each server is told its call was cancelled)."""
        hooks, self._before_shutdown = self._before_shutdown, []  # once, though shutdown may be asked twice
        for hook in hooks:
            await hook()
        self._closing = True
        if self._calls:
            self._drained = anyio.Event()
            with anyio.move_on_after(grace):
                await self._drained.wait()
        for scope in list(self._calls):
            scope.cancel()
        await anyio.lowlevel.checkpoint()

    async def _forwarded(self, work: Awaitable[Any], what: str) -> Any:
        """Await one forwarded request, cancellable by `shutdown`."""
        if self._closing:
            work.close()  # type: ignore[attr-defined]  # a coroutine never started
            raise ShuttingDown(f"the gateway is shutting down: {what} was not forwarded", what)
        with anyio.CancelScope() as scope:
            self._calls.add(scope)
            try:
                return await work
            finally:
                self._calls.discard(scope)
                if self._drained is not None and not self._calls:
                    self._drained.set()
        raise ShuttingDown(f"the gateway is shutting down: {what} was cancelled (its server was told)", what, ran=True)

    async def index_listing(self, listing: Listing) -> None:
        """Bring the index in line with one upstream's listing: new and changed tools are embedded, tools
        it no longer lists are removed, unchanged ones (and what feedback taught them) stay as they are.
        ListingNotRecorded when that fails (the database does not answer): the upstream is not at fault."""
        try:
            changed = await anyio.to_thread.run_sync(self.definitions.observe, listing.tools)
            for tool_id in changed:
                logger.warning("upstream %s changed the definition of %s%s", listing.upstream, tool_id,
                               f" (held until approved: {self.definitions.approve_command(tool_id)})"
                               if self.definitions.pin else "")
            await anyio.to_thread.run_sync(self._write_listing, listing)
        except (Unavailable, OSError) as exc:  # the store's outage; a listing it refuses (a NUL in a tool's
            # text) or a bug inside toolscout is no outage: those end the connection as before
            raise ListingNotRecorded(f"its listing could not be recorded: {error_reason(exc)}") from exc

    def _write_listing(self, listing: Listing) -> None:
        with self.listings.writing(listing.upstream):
            _total, indexed = self.service.list(ADMIN, namespace=listing.upstream, limit=1 << 30)
            kept = self.listings.keep(listing.upstream, [t.id for t in listing.tools])
            gone = [t for t in indexed if t.id not in kept]
            if listing.tools:
                self.service.upsert(listing.tools)
            if gone:
                dropped = self._feedback_dropped(listing, gone)  # asked before the delete takes it
                self.service.delete([t.id for t in gone])
                if dropped:
                    logger.warning("%s", dropped)
        with self._names_lock:
            for tool in gone:
                self._names.get(tool.name, set()).discard(tool.id)
            for tool in listing.tools:
                self._names.setdefault(tool.name, set()).add(tool.id)
            (self._indexed.add if listing.tools else self._indexed.discard)(listing.upstream)
            self._listed.add(listing.upstream)

    def _feedback_dropped(self, listing: Listing, gone: list[Tool]) -> str | None:
        """What to log of the feedback that goes with the tools an upstream no longer lists: how much, and
        the tools they were likely renamed to (an operationId dropped: `feedback.likely_renames`)."""
        taught = self.service.learned_of([t.id for t in gone])
        gone = [t for t in gone if taught[t.id]]
        if not gone:
            return None
        message = (f"upstream {listing.upstream} no longer lists {', '.join(repr(t.id) for t in gone[:5])}"
                   f"{' and more' if len(gone) > 5 else ''}: the {sum(taught.values())} requests their feedback "
                   "taught are dropped with them")
        note = renames_note(likely_renames(gone, listing.tools), gone, listing.tools, namespace_flag=False)
        return f"{message}; {note}" if note else message

    def prune(self, namespaces: Iterable[str]) -> list[str]:
        """Remove the indexed tools of namespaces no upstream serves any more (a server taken out of the
        config; with replicas, out of every replica's for days: listings.py); returns their ids."""
        namespaces, stale, taught = list(namespaces), {}, 0
        for namespace in self.listings.prunable(self.service.namespaces(ADMIN), namespaces):
            with self.listings.writing(namespace):  # no replica lists it meanwhile
                if self.listings.prunable([namespace], namespaces):
                    ids = [t.id for t in self.service.list(ADMIN, namespace=namespace, limit=1 << 30)[1]]
                    if ids:
                        taught += sum(self.service.learned_of(ids).values())  # before they go
                        self.service.delete(ids)
                        stale[namespace] = ids
                    self._indexed.discard(namespace)
        if stale:
            logger.warning("removed %d tools of %s (%s) and the %d requests their feedback taught",
                           sum(map(len, stale.values())), ", ".join(map(repr, stale)), self.listings.gone_because,
                           taught)
        return [tool_id for ids in stale.values() for tool_id in ids]

    # search ------------------------------------------------------------------------------------
    async def search(self, task: str, k: int, *, principal: Principal, session: str,
                     namespaces: list[str] | None = None) -> Searched:
        """The default pipeline's best tools for `task`, as `toolscout serve` ranks them, once the upstreams
        still starting have listed theirs (`searchable`); remembered as the session's latest search (for
        attributing its calls)."""
        not_searchable = await self.searchable(principal, namespaces)
        hits = await self.service.search_async(task, k, principal=principal, namespaces=namespaces)
        self.searched(session, task, hits)
        return Searched(hits, not_searchable)

    async def searchable(self, principal: Principal, namespaces: Iterable[str] | None = None) -> list[dict[str, str]]:
        """Wait for the upstreams a search by `principal` (within `namespaces`) could find tools of that are
        starting and have no tools in the index yet (with pinning, or have not listed them since the gateway
        started: their kept tools are not offered before that), each `options.search_wait` seconds at most in all (counted
        from the first search that waited for it, so one that never comes up delays searches once); then the
        upstreams whose tools the search cannot find: `[{"server", "status": "starting" | "down", "reason"}]`."""
        wanted = None if namespaces is None else set(namespaces)
        offering = [u for u in self._offering(principal) if wanted is None or u.name in wanted]
        await self._wait_for([u for u in offering if u.status.state == "starting" and u.name not in self._listed
                              and (u.name not in self._indexed or self.definitions.pin)])
        return [_not_searchable(u) for u in offering if not self._searchable(u)]

    async def _wait_for(self, upstreams: list[Upstream]) -> None:
        """Wait, together, for each upstream to be up, within `options.search_wait` seconds of the first wait for
        it (those out of time are not waited for)."""
        now = anyio.current_time()
        waits = [(u, self._wait_until.setdefault(u.name, now + self.options.search_wait) - now) for u in upstreams]
        if any(within > 0 for _u, within in waits):
            async with anyio.create_task_group() as tasks:
                for upstream, within in waits:
                    if within > 0:
                        self._needed(upstream)
                        tasks.start_soon(upstream.wait_up, within)

    def _searchable(self, upstream: Upstream) -> bool:
        """Whether search finds the upstream's tools now: it is up (and has listed them), or its tools are in
        the index from before and are shown while it is not up (not `hide_unavailable`; with pinning, only once
        it has listed them since the gateway started: `upstream_reach`)."""
        if upstream.status.state == "up":
            return True
        if self.definitions.pin and not upstream.status.listed:
            return False
        return not self.options.hide_unavailable and upstream.name in self._indexed

    def searched(self, session: str, task: str, hits: list[Hit]) -> None:
        self.attribution.searched(session, task, [h.tool.id for h in hits])

    def resume_session(self, session: str, searches: list[tuple[str, list[str], int]]) -> None:
        """A host whose session went on from the previous owner of the index (hosts.py): the searches it made
        there, so that its calls here still teach them (attribution.py)."""
        if searches:
            self.attribution.resume(session, searches)

    # calls -------------------------------------------------------------------------------------
    def resolve(self, name: str, principal: Principal) -> Tool:
        """The tool `name` means: its id, or a bare tool name that only one tool the caller sees carries.
        NotFound (with the nearest ids) or InvalidRequest (an ambiguous name) otherwise. Read from the catalog
        this process holds first: a call is routed even while a shared database does not answer."""
        try:
            return self.service.get(name, principal, held_first=True)
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
            return self.service.get(tool_id, principal, held_first=True)
        except NotFound:
            return None

    async def call(self, name: str, arguments: Mapping[str, Any], *, principal: Principal, session: str,
                   headers: Mapping[str, str] | None = None, relay: Relay = NO_RELAY) -> ToolResult:
        """Forward one call; the upstream's result (`ToolResult`), as it came. Raises NotFound (no such tool for
        this caller), Conflict (held until approved), `UpstreamUnavailable` (naming the upstream) or
        ShuttingDown. `relay`: where the upstream's progress and questions go."""
        tool = await self._resolve_call(name, principal)
        upstream = self.upstreams.get(tool.namespace or "")
        if upstream is None or upstream.name in self.options.disabled:
            raise NotFound(f"tool {tool.id!r}: its server {tool.namespace!r} is not enabled in the gateway's config")
        self._refuse_if_held(tool)
        self._needed(upstream)
        lowered = {k.lower(): v for k, v in (headers or {}).items()}
        forwarded = {h: lowered[h] for h in upstream.forward_headers if h in lowered}
        result = await self._forwarded(self._call_compared(tool, upstream, arguments, forwarded, relay),
                                       f"the call of {tool.id}")
        self._learn_from(session, principal, tool.id, failed=result.get("isError") is True)
        return _as_forwarded(result)

    def _refuse_if_held(self, tool: Tool) -> None:
        if self.definitions.held(tool.id):
            raise Conflict(f"tool {tool.id!r} changed since it was approved (see GET /tools/{tool.id}); an operator "
                           f"approves it with: {self.definitions.approve_command(tool.id)}")

    async def _call_compared(self, tool: Tool, upstream: Upstream, arguments: Mapping[str, Any],
                             headers: Mapping[str, str], relay: Relay) -> ToolResult:
        """`upstream.call`, but with --pin only once the upstream's listing on its present connection was compared
        with what was approved: a call that came while it (re)connected waits for that listing, and is refused if
        the tool changed. No await comes between the check and the call's being sent on that connection."""
        if self.definitions.pin:
            if not await upstream.wait_up(upstream.timeout):
                raise self._unavailable(tool.id, upstream)
            self._refuse_if_held(tool)
        return await upstream.call(tool, arguments, headers, relay)

    async def _resolve_call(self, name: str, principal: Principal) -> Tool:
        """`resolve`, but a name `NS.tool` of a server that is starting waits for it (its listing may bring the
        tool), and of a server that is down fails naming it, with why."""
        try:
            return self.resolve(name, principal)
        except NotFound:
            upstream = self._named_upstream(name, principal)
            if upstream is None:
                raise
        self._needed(upstream)
        if await upstream.wait_up(upstream.timeout):
            return self.resolve(name, principal)
        raise self._unavailable(name, upstream)

    @staticmethod
    def _unavailable(name: str, upstream: Upstream) -> UpstreamUnavailable:
        """Why a call of `name` cannot go to `upstream`, which did not come up within the call's timeout."""
        state = "still starting" if upstream.status.state == "starting" else "down"
        return UpstreamUnavailable(f"tool {name!r}: its server {upstream.name!r} is {state}: "
                                   f"{upstream.status.last_error or 'it has not listed its tools yet'}",
                                   timed_out=state == "still starting")

    def _named_upstream(self, name: str, principal: Principal) -> Upstream | None:
        """The enabled upstream that `NS.rest` names, if the caller may see its namespace."""
        namespace = name.split(".", 1)[0] if "." in name else ""
        upstream = self.upstreams.get(namespace)
        if upstream is None or namespace in self.options.disabled or not principal.sees_namespace(namespace):
            return None
        return upstream

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

    # prompts and resources --------------------------------------------------------------------
    def listen(self, listener: Listener) -> None:
        """Tell `listener` of every change to the upstreams' prompts and resources (see `Listener`)."""
        self._listeners.append(listener)

    async def _noticed(self, upstream: str, what: str, uri: str | None) -> None:
        """An upstream's prompts or resources changed: tell the interfaces, in the names agents see."""
        exposed = resource_uri(upstream, uri) if uri is not None else None
        if what == "updated" and exposed not in self._subscriptions:
            return  # nobody here subscribed to it
        for listener in list(self._listeners):
            try:
                await listener(upstream, what, exposed)
            except Exception:  # one interface's failure does not stop the others hearing it
                logger.exception("telling an interface that %s's %s changed failed", upstream, what)

    def _offering(self, principal: Principal) -> list[Upstream]:
        return [u for name, u in self.upstreams.items()
                if name not in self.options.disabled and principal.sees_namespace(name)]

    async def extras_listed(self, principal: Principal) -> None:
        """Wait for the upstreams the caller may see that are starting and have not listed their prompts and
        resources since the gateway started (they are not kept in the index), as searches wait for tools: up to
        `options.search_wait` seconds for each, counted from the first search or list that waited for it. One
        that comes up later is announced through `listen`, as ever."""
        await self._wait_for([u for u in self._offering(principal) if u.status.state == "starting"
                              and not u.status.listed])

    def prompts(self, principal: Principal) -> list[dict[str, Any]]:
        """Every upstream's prompts the caller may see, named `NS.prompt`."""
        return [{**prompt, "name": f"{u.name}.{prompt.get('name')}"}
                for u in self._offering(principal) for prompt in u.extras.prompts]

    def resources(self, principal: Principal) -> list[dict[str, Any]]:
        """Every upstream's resources the caller may see, each `uri` as `toolscout://NS/URI`."""
        return [{**resource, "uri": resource_uri(u.name, str(resource.get("uri")))}
                for u in self._offering(principal) for resource in u.extras.resources]

    def resource_templates(self, principal: Principal) -> list[dict[str, Any]]:
        return [{**template, "uriTemplate": resource_uri(u.name, str(template.get("uriTemplate")))}
                for u in self._offering(principal) for template in u.extras.templates]

    async def get_prompt(self, name: str, arguments: Mapping[str, str] | None, principal: Principal,
                         relay: Relay = NO_RELAY) -> dict[str, Any]:
        upstream, original = self._prompt_owner(name, principal)
        params = {"name": original, **({"arguments": dict(arguments)} if arguments else {})}
        return _as_forwarded(await self._forwarded(upstream.request("prompts/get", params, relay),
                                                   f"getting the prompt {name}"))

    async def read_resource(self, uri: str, principal: Principal, relay: Relay = NO_RELAY) -> dict[str, Any]:
        upstream, original = self._resource_owner(uri, principal)
        result = await self._forwarded(upstream.request("resources/read", {"uri": original}, relay),
                                       f"reading the resource {uri}")
        contents = [{**c, "uri": uri} if isinstance(c, dict) and c.get("uri") == original else c
                    for c in result.get("contents") or []]
        return _as_forwarded({**result, "contents": contents})

    async def subscribe(self, uri: str, principal: Principal) -> str:
        """Subscribe to a resource's updates (once upstream, however many agents ask); the URI its updates will
        be announced with (`Listener`)."""
        upstream, original = self._resource_owner(uri, principal, subscribing=True)
        key = resource_uri(upstream.name, original)
        if not self._subscriptions.get(key):
            await self._forwarded(upstream.request("resources/subscribe", {"uri": original}),
                                  f"subscribing to {uri}")
        self._subscriptions[key] = self._subscriptions.get(key, 0) + 1
        return key

    async def unsubscribe(self, uri: str, principal: Principal) -> str:
        """One agent fewer subscribed (the upstream is unsubscribed with the last); the URI `subscribe` gave."""
        upstream, original = self._resource_owner(uri, principal, subscribing=True)
        key = resource_uri(upstream.name, original)
        left = self._subscriptions.get(key, 0) - 1
        if left > 0:
            self._subscriptions[key] = left
            return key
        self._subscriptions.pop(key, None)
        await self._forwarded(upstream.request("resources/unsubscribe", {"uri": original}),
                              f"unsubscribing from {uri}")
        return key

    async def complete(self, ref: Mapping[str, Any], argument: Mapping[str, Any], context: Mapping[str, Any] | None,
                       principal: Principal) -> dict[str, Any]:
        """Completions for a prompt's or resource template's argument, from the upstream that has it."""
        if ref.get("type") == "ref/prompt":
            upstream, original = self._prompt_owner(str(ref.get("name")), principal)
            ref = {**ref, "name": original}
        else:
            upstream, original = self._resource_owner(str(ref.get("uri")), principal, template=True)
            ref = {**ref, "uri": original}
        params = {"ref": ref, "argument": dict(argument), **({"context": dict(context)} if context else {})}
        return _as_forwarded(await self._forwarded(upstream.request("completion/complete", params),
                                                   "a completion"))

    def _prompt_owner(self, name: str, principal: Principal) -> tuple[Upstream, str]:
        self._acting(principal, f"getting the prompt {name!r}")
        original = name.partition(".")[2]
        upstream = self._named_upstream(name, principal)
        if upstream is None or not original:
            known = ", ".join(p["name"] for p in self.prompts(principal)[:10]) or "none"
            raise NotFound(f"no prompt {name!r}: prompts are named SERVER.prompt (known: {known})")
        return upstream, original

    def _resource_owner(self, uri: str, principal: Principal, subscribing: bool = False,
                        template: bool = False) -> tuple[Upstream, str]:
        """The upstream a resource URI belongs to, and the URI as that upstream knows it."""
        self._acting(principal, f"reading the resource {uri!r}")
        if uri.startswith(RESOURCE_PREFIX):
            namespace, _, original = uri[len(RESOURCE_PREFIX):].partition("/")
            upstream = self._named_upstream(f"{namespace}.", principal)
            if upstream is None or not original:
                raise NotFound(f"no resource {uri!r}: no server {namespace!r} here (resources are "
                               f"{RESOURCE_PREFIX}SERVER/URI)")
        else:
            upstream, original = self._raw_resource_owner(uri, principal, template), uri
        if subscribing and not upstream.extras.subscribe:
            raise InvalidRequest(f"server {upstream.name!r} does not take resource subscriptions")
        return upstream, original

    def _raw_resource_owner(self, uri: str, principal: Principal, template: bool) -> Upstream:
        """A URI as an upstream gave it (in a tool result, say): the one upstream that listed it or has a
        template that matches it."""
        offering = self._offering(principal)
        owners = [u for u in offering if any(r.get("uri") == uri for r in u.extras.resources)
                  or any(_matches(str(t.get("uriTemplate")), uri, template) for t in u.extras.templates)]
        if len(owners) == 1:
            return owners[0]
        if not owners:
            raise NotFound(f"no resource {uri!r}: no server here lists it (resources are {RESOURCE_PREFIX}SERVER/URI)")
        raise InvalidRequest(f"the resource {uri!r} is offered by {len(owners)} servers "
                             f"({', '.join(u.name for u in owners)}); name one: {RESOURCE_PREFIX}SERVER/{uri}")

    @staticmethod
    def _acting(principal: Principal, what: str) -> None:
        if principal is ANONYMOUS:  # reads are open, but this acts on a server on someone's behalf
            raise Forbidden(f"{what} through this gateway needs a bearer token")

    # status ------------------------------------------------------------------------------------
    def health(self, principal: Principal = ADMIN) -> dict[str, Any]:
        """/health's gateway fields for `principal`: the upstreams it may read (each serves one namespace);
        the counts of calls, their learning and held tools only to a caller who may read every namespace,
        as they total over them all (`ToolService.stats`)."""
        upstreams = [u.status.to_dict() for name, u in self.upstreams.items() if principal.sees_namespace(name)]
        if not self.service.sees_everything(principal):
            return {"upstreams": upstreams, "pinned": self.definitions.pin}
        return {"upstreams": upstreams, "calls_in_flight": len(self._calls),
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
    """Feedback from forwarded calls, learned on a thread of its own so that no call waits for it, in
    batches: a call's lesson waits `gather_s` for the calls that follow it, and they are learned together
    (one pass scores them, one refit of the calibration follows), so an agent's next search shares the
    cores with one batch's learning, not with every call's (docs/gateway.md)."""

    BATCH = 256

    def __init__(self, service: ToolService, gather_s: float = LEARN_GATHER_S):
        self.service, self.gather_s = service, gather_s
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
            batch = self._gather()
            stop = None in batch
            events = [e for e in batch if e is not None]
            if events:
                self._learn(events)
            if stop:
                return

    def _gather(self) -> list[FeedbackEvent | None]:
        """The next batch: the first call waiting, and the calls that follow it for `gather_s` (at most
        BATCH; a stop ends it at once)."""
        batch = [self._queue.get()]
        deadline = time.monotonic() + self.gather_s
        while len(batch) < self.BATCH and batch[-1] is not None:
            try:
                batch.append(self._queue.get(timeout=max(0.0, deadline - time.monotonic())))
            except queue.Empty:
                break
        return batch

    def _learn(self, events: list[FeedbackEvent]) -> None:
        """One batch. When a source in it is over its feedback limits (the whole batch is refused, nothing
        counted), its sources are learned one by one, so only that source's calls are dropped."""
        refused = self._attempt(events)
        if refused is not None:
            self._learn_by_source(events, refused)
        self.done += len(events)

    def _learn_by_source(self, events: list[FeedbackEvent], refused: RateLimited | TooLarge) -> None:
        by_source: dict[str, list[FeedbackEvent]] = {}
        for event in events:
            by_source.setdefault(event.source, []).append(event)
        if len(by_source) == 1:
            self._drop(events, refused)
            return
        for group in by_source.values():
            if (again := self._attempt(group)) is not None:
                self._drop(group, again)

    def _attempt(self, events: list[FeedbackEvent]) -> RateLimited | TooLarge | None:
        """Learn `events`; the refusal of them all by the feedback limits (RateLimited, or TooLarge: a source's
        calls outnumber its burst), else None. A bug is logged and its events dropped: the gateway
        goes on forwarding calls; so are the events of a storage that does not answer."""
        try:
            result = self.service.feedback(events, ADMIN)  # trusted: each event names its own source
            self.learned += result.taught
        except (RateLimited, TooLarge) as exc:
            return exc
        except Unavailable as exc:
            self.dropped += len(events)
            logger.warning("feedback from %d forwarded calls dropped: %s", len(events), exc)
        except Exception:
            self.dropped += len(events)
            logger.exception("learning from %d forwarded calls failed", len(events))
        return None

    def _drop(self, events: list[FeedbackEvent], reason: RateLimited | TooLarge) -> None:
        self.dropped += len(events)
        logger.warning("feedback from %d forwarded calls dropped: %s", len(events), reason)


def _not_searchable(upstream: Upstream) -> dict[str, str]:
    """What a search's answer says of an upstream whose tools it could not search."""
    state = upstream.status.state
    if state == "starting":
        reason = "it has not listed its tools yet"
    else:
        reason = upstream.status.last_error or "it is not connected"
    return {"server": upstream.name, "status": state, "reason": reason}


def _as_forwarded(result: ToolResult) -> ToolResult:
    """The upstream's result as the agent gets it: unchanged, but for the wire's own bookkeeping (the
    upstream's identity stamp and result type: the agent's connection is to the gateway, which adds its own)."""
    forwarded = {key: value for key, value in result.items() if key not in ("resultType", "_meta")}
    meta = {key: value for key, value in (result.get("_meta") or {}).items() if key != SERVER_INFO_META}
    if meta:
        forwarded["_meta"] = meta
    return forwarded


def resource_uri(namespace: str, uri: str) -> str:
    """A resource (or template) of upstream `namespace` as agents see it."""
    return f"{RESOURCE_PREFIX}{namespace}/{uri}"


def _matches(template: str, uri: str, same: bool) -> bool:
    """Whether `uri` is one of an RFC 6570 template's URIs (`same`: or the template itself, for completions)."""
    if same and template == uri:
        return True
    pattern = "".join(".+?" if part.startswith("{") else re.escape(part) for part in re.split(r"(\{[^}]*\})", template))
    return re.fullmatch(pattern, uri) is not None
