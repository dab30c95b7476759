"""Putting a gateway together from its config, and running it over stdio or HTTP.

The index is a pipeline directory like any `toolscout serve DIR` serves (a snapshot plus a journal of
writes), made with the default pipeline the first time; the gateway's definition records and its
upstreams' stderr logs (`upstream-logs/NAME.log`) live beside it. A restart loads it as it was, so only
tools whose definitions changed meanwhile are embedded again.

Or the index is a tenant of a PostgreSQL index table (`store`, `toolscout serve --store`'s), shared by any
number of gateway replicas: a new table gets the default pipeline (once, however many replicas start
together); definition records and each replica's listings are rows beside it (`store/pg_gateway.py`,
`listings.py`); `index` is then this replica's own folder, for its upstreams' logs.

SIGTERM (or SIGINT) stops a gateway in order: calls in flight get `core.SHUTDOWN_GRACE_S` to finish, the rest
are cancelled (upstream too) and answered with an error that says so, then the upstreams are stopped.

Several gateways on one index (hosts.py): the one that holds the index's lock (`hosts.IndexLock`) opens it
and serves, over stdio or HTTP, and also serves the hosts of the others over the index's socket; a stdio
gateway that finds the lock held relays its host to that one (`bridge.attach_stdio`), and takes the index
over when it stops.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import shutil
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from ..artifacts import POINTER
from ..errors import ToolScoutError
from ..hits import CALIBRATED
from ..pipeline import ToolScout
from ..serve.storage import Storage
from ..serve.service import STORAGE_OPTIONS, ToolService, open_storage
from .attribution import DEFAULT_RULE, DEFAULT_WINDOW, CallAttribution
from .config import PING_EVERY_S, SEARCH_WAIT_S, GatewayConfig, UpstreamSpec
from .core import Gateway, GatewayOptions, upstream_reach
from .definitions import DefinitionLedger, SharedRecords
from .hosts import RUNTIME_FILES, IndexLock, serve_hosts
from .listings import OwnListings, SharedListings
from .stdio import has_uvloop
from .mcp_server import GatewayMcp
from .mcp_upstream import McpUpstream
from .openapi_upstream import OpenApiUpstream
from .upstream import Upstream

logger = logging.getLogger(__name__)
LOG_FOLDER = "upstream-logs"
FLUSH_S = 0.1  # after shutting calls down over stdio: time for their answers to be written


@dataclass(frozen=True)
class GatewaySettings:
    """How to run a gateway, beyond its config (the CLI's flags). `service`: options for `ToolService.open`
    (fsync, min_score, min_probability (default: the calibration's threshold), batch_workers, limits,
    feedback_cap)."""

    index: Path
    store: str | None = None
    new_table: bool = False  # --store naming a table the database lacks: make it (`ensure_store`)
    pin: bool = False
    hide_unavailable: bool = False
    expose: str = "none"
    attribution: str = DEFAULT_RULE
    window: int = DEFAULT_WINDOW
    relist_every: float = 300.0
    ping_every: float = PING_EVERY_S
    search_wait: float = SEARCH_WAIT_S
    service: dict[str, Any] = field(default_factory=dict)


def open_gateway(config: GatewayConfig, settings: GatewaySettings) -> Gateway:
    """The gateway over `settings.index` (made if new), its upstreams not yet started (`Gateway.run`). Made in
    the order each part needs the others: the catalog, the definition records kept beside it, the upstreams,
    then the service, which is given what search may return (`upstream_reach`), then the gateway."""
    for warning in config.warnings:
        logger.warning("%s", warning)
    storage, service_options = open_storage_of(settings)
    service = None
    try:
        definitions, listings = _records(storage, settings)
        upstreams = [make_upstream(spec, settings) for spec in config.upstreams]
        attribution = CallAttribution(settings.attribution, settings.window)
        options = GatewayOptions(settings.hide_unavailable, frozenset(u.name for u in config.upstreams if not u.enabled),
                                 search_wait=settings.search_wait)
        service = ToolService(storage, reach=upstream_reach(upstreams, options, definitions), **service_options)
        gateway = Gateway(service, upstreams, definitions, attribution, options, listings=listings)
        gateway.announce()  # what its config names, told the other replicas before anything is listed
        return gateway
    except BaseException:
        if service is not None:
            service.close()
        else:
            storage.close()
        raise


def open_storage_of(settings: GatewaySettings) -> tuple[Storage, dict[str, Any]]:
    """The storage of the gateway's index: its directory (made if new), or its PostgreSQL tenant (a new table
    configured with the default pipeline); and the options of `settings.service` that are the service's."""
    # a gateway abstains by default when no tool is likely relevant (the calibration's threshold)
    options = {"min_probability": CALIBRATED, **settings.service}
    kept = {key: options.pop(key) for key in STORAGE_OPTIONS if key in options}
    if settings.store is None:
        ensure_index(settings.index)
        return open_storage(settings.index, **kept), options
    return open_storage(settings.store, encoder=ensure_store(settings.store, settings.new_table), **kept), options


def _records(storage: Storage, settings: GatewaySettings) -> tuple[DefinitionLedger, Any]:
    """The gateway's definition records and what its listings let go: in its directory, or shared with the other
    replicas on its PostgreSQL tenant."""
    if settings.store is None:
        return DefinitionLedger(settings.index, pin=settings.pin,
                                approve_with=f"--index {shlex.quote(str(settings.index))}"), OwnListings()
    from ..store.pg_gateway import PgGatewayState

    state = PgGatewayState(storage.pg_catalog)
    return DefinitionLedger(SharedRecords(state), pin=settings.pin,  # the DSN's password masked
                            approve_with=f"--store {shlex.quote(redacted(settings.store))}"), SharedListings(state)


def ensure_store(spec: str, new_table: bool = False) -> Any:
    """Give the index table of `spec` the default pipeline, unless it has a pipeline already (as `ensure_index`
    does a folder); the encoder loaded for it (None when the table had one, or got another meanwhile).

    What a gateway makes when the spec names no catalog (a mistyped ?tenant= or ?table= starts an empty one, which
    its upstreams then fill, and the typo is a tenant like any other from then on): a new tenant of a table is
    warned of, naming the table's tenants (a team's first gateway makes its tenant so); a new table, beside the
    index tables the database has, is refused unless `new_table` (it would get the default pipeline, not the
    team's). The first table of a database is made without asking."""
    from ..postgres import configure_new_table, configured_tables, missing_catalogs
    from ..retrievers.base import encoding_parts
    from ..store.pgvector import PgSpec

    parsed = PgSpec.parse(spec)
    tables = configured_tables(parsed)
    if parsed.table in tables:
        for note in missing_catalogs(parsed):
            logger.warning("%s: this gateway makes it, with the table's pipeline, from its upstreams' tools (if "
                           "?tenant= is mistyped, stop it and correct the store spec)", note)
        return None
    if tables and not new_table:
        raise ToolScoutError(f"index table {parsed.table!r} of {parsed} records no pipeline (the database's index "
                             f"tables: {', '.join(map(repr, tables))}): check ?table= in the store spec, or give "
                             "--new-table to make it with the default pipeline (for a pipeline of your own, "
                             "`toolscout index CATALOG --out DIR --store DSN` first)")
    logger.info("%s records no pipeline yet: recording the default one (unless another replica does first)", parsed)
    pipeline = ToolScout.from_tools([])
    encoder = encoding_parts(pipeline.retriever)[0].encoder
    return encoder if configure_new_table(spec, encoder, pipeline.spec) else None


def redacted(spec: str) -> str:
    from ..store.pgvector import PgSpec

    return str(PgSpec.parse(spec))


def make_upstream(spec: UpstreamSpec, settings: GatewaySettings) -> Upstream:
    if spec.kind == "openapi":
        return OpenApiUpstream(spec, relist_every=settings.relist_every)
    return McpUpstream(spec, log_dir=settings.index / LOG_FOLDER, relist_every=settings.relist_every,
                       ping_every=settings.ping_every)


def ensure_index(folder: Path) -> None:
    """Make `folder` an empty index of the default pipeline, unless it is one already. Made beside it and
    renamed into place, so gateways that start together on a new index make it once (the others' are dropped)."""
    if (folder / POINTER).is_file():
        return
    _check_folder(folder)
    logger.info("making a new index in %s", folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.parent / f".{folder.name}.new-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    ToolScout.from_tools([]).save(staging)
    try:
        os.rename(staging, folder)  # onto nothing or an empty folder; a folder with anything in it refuses
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (folder / POINTER).is_file():
            raise


def _check_folder(folder: Path) -> None:
    if folder.exists() and not (folder / POINTER).is_file() and any(p.name not in RUNTIME_FILES
                                                                      for p in folder.iterdir()):
        raise ToolScoutError(f"{folder}: exists but is not a toolscout index (no {POINTER} file); give --index an "
                             "empty or new folder, or one a gateway made")


def serve_stdio(gateway: Gateway, mcp: GatewayMcp, index: Path | None = None, lock: IndexLock | None = None) -> None:
    """MCP over stdio until the host closes it (or SIGTERM), with the upstreams supervised meanwhile, and the
    hosts of other gateways on `index` served over its socket; `lock` (the index's) is released at the end,
    once the index is closed."""

    async def main() -> None:
        # the signals stay ours until the upstreams are stopped: a host that closes the gateway's stdin and then
        # sends SIGTERM (as the SDK's client does, 2 s later) does not cut short the stopping of servers that
        # ignore their own stdin closing, which would leave them running
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with anyio.create_task_group() as watch:
                async with anyio.create_task_group() as tasks:
                    watch.start_soon(_stop_on_signal, gateway, signals, tasks.cancel_scope)
                    tasks.start_soon(gateway.run)
                    if index is not None and await tasks.start(serve_hosts, mcp, index) is not None:
                        logger.info("other hosts that run a gateway on %s attach to this one", index)
                    await mcp.run_stdio()
                    await gateway.shutdown()  # the calls of attached hosts in flight get their grace
                    tasks.cancel_scope.cancel()
                watch.cancel_scope.cancel()

    try:
        anyio.run(main, backend_options={"use_uvloop": has_uvloop()})
    finally:
        try:
            with _saving_through_signals():
                gateway.close()
                gateway.service.close()
        finally:
            if lock is not None:
                lock.release()


@contextlib.contextmanager
def _saving_through_signals():
    """SIGTERM and SIGINT wait while the gateway saves its index: a host that closes the gateway's stdin sends
    SIGTERM 2 s later (the SDK's client does), and a save cut short leaves the journal to be replayed, with
    the feedback in it learned again, at the next start. A host's SIGKILL still ends it (nothing is lost:
    the snapshot is written atomically)."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield
        return
    said = []

    def wait(signum: int, _frame: Any) -> None:
        if not said:
            said.append(signum)
            logger.info("%s: saving the index first", signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, wait) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


async def _stop_on_signal(gateway: Gateway, signals: Any, scope: anyio.CancelScope) -> None:
    async for _signal in signals:
        await gateway.shutdown()
        await anyio.sleep(FLUSH_S)  # the answers just given reach the host's pipe
        scope.cancel()


def serve_http(app: Any, gateway: Gateway, host: str, port: int, log_level: str, announce: str) -> None:
    """The HTTP API under uvicorn until SIGTERM or SIGINT, which first shuts the gateway's calls down (so every
    caller gets an answer within about two seconds), and only then lets uvicorn stop: uvicorn's stop ends the
    event streams that MCP sessions get their answers on (sse_starlette's drain), so it must not start while
    those answers are still to come. A second signal stops uvicorn at once. `announce` is said once the port
    is bound (`serve.listen`)."""
    import asyncio

    import uvicorn

    from ..serve.listen import run_server

    class Server(uvicorn.Server):
        signalled = False
        stopping: Any = None  # the task of `stop` (kept: the loop holds its tasks weakly)

        def handle_exit(self, sig: int, frame: Any) -> None:
            if self.signalled:  # a second signal: uvicorn's own stop, at once
                super().handle_exit(sig, frame)
                return
            self.signalled = True
            loop = asyncio.get_event_loop()
            loop.call_soon_threadsafe(self.start_stopping, loop, sig, frame)

        def start_stopping(self, loop: Any, sig: int, frame: Any) -> None:
            self.stopping = loop.create_task(self.stop(sig, frame))

        async def stop(self, sig: int, frame: Any) -> None:
            try:
                await gateway.shutdown()
                await asyncio.sleep(FLUSH_S)  # the answers just given reach their event streams
            finally:
                if not self.should_exit:
                    super().handle_exit(sig, frame)

    run_server(app, host, port, log_level, announce, graceful_s=3, server_class=Server)
