"""Putting a gateway together from its config, and running it over stdio or HTTP.

The index is a pipeline directory like any `toolscout serve DIR` serves (a snapshot plus a journal of
writes), made with the default pipeline the first time; the gateway's definition records and its
upstreams' stderr logs (`upstream-logs/NAME.log`) live beside it. A restart loads it as it was, so only
tools whose definitions changed meanwhile are embedded again.

SIGTERM (or SIGINT) stops a gateway in order: calls in flight get `core.SHUTDOWN_GRACE_S` to finish, the rest
are cancelled (upstream too) and answered with an error that says so, then the upstreams are stopped.
"""

from __future__ import annotations

import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from ..artifacts import POINTER
from ..errors import ToolScoutError
from ..hits import CALIBRATED
from ..pipeline import ToolScout
from ..serve.service import ToolService
from .attribution import DEFAULT_RULE, DEFAULT_WINDOW, CallAttribution
from .config import PING_EVERY_S, GatewayConfig, UpstreamSpec
from .core import Gateway, GatewayOptions
from .definitions import DefinitionLedger
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
    pin: bool = False
    hide_unavailable: bool = False
    expose: str = "none"
    attribution: str = DEFAULT_RULE
    window: int = DEFAULT_WINDOW
    relist_every: float = 300.0
    ping_every: float = PING_EVERY_S
    service: dict[str, Any] = field(default_factory=dict)


def open_gateway(config: GatewayConfig, settings: GatewaySettings) -> Gateway:
    """The gateway over `settings.index` (made if new), its upstreams not yet started (`Gateway.run`)."""
    for warning in config.warnings:
        logger.warning("%s", warning)
    ensure_index(settings.index)
    # a gateway abstains by default when no tool is likely relevant (the calibration's threshold)
    service = ToolService.open(settings.index, **{"min_probability": CALIBRATED, **settings.service})
    try:
        upstreams = [make_upstream(spec, settings) for spec in config.upstreams]
        definitions = DefinitionLedger(settings.index, pin=settings.pin)
        attribution = CallAttribution(settings.attribution, settings.window)
        options = GatewayOptions(settings.hide_unavailable, frozenset(u.name for u in config.upstreams if not u.enabled))
        gateway = Gateway(service, upstreams, definitions, attribution, options)
        gateway.prune(config.names())
        return gateway
    except BaseException:
        service.close()
        raise


def make_upstream(spec: UpstreamSpec, settings: GatewaySettings) -> Upstream:
    if spec.kind == "openapi":
        return OpenApiUpstream(spec, relist_every=settings.relist_every)
    return McpUpstream(spec, log_dir=settings.index / LOG_FOLDER, relist_every=settings.relist_every,
                       ping_every=settings.ping_every)


def ensure_index(folder: Path) -> None:
    """Make `folder` an empty index of the default pipeline, unless it is one already."""
    if (folder / POINTER).is_file():
        return
    if folder.exists() and any(folder.iterdir()):
        raise ToolScoutError(f"{folder}: exists but is not a toolscout index (no {POINTER} file); give --index an "
                             "empty or new folder, or one a gateway made")
    logger.info("making a new index in %s", folder)
    ToolScout.from_tools([]).save(folder)


def serve_stdio(gateway: Gateway, mcp: GatewayMcp) -> None:
    """MCP over stdio until the host closes it (or SIGTERM), with the upstreams supervised meanwhile."""

    async def main() -> None:
        # the signals stay ours until the upstreams are stopped: a host that closes the gateway's stdin and then
        # sends SIGTERM (as the SDK's client does, 2 s later) does not cut short the stopping of servers that
        # ignore their own stdin closing, which would leave them running
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async with anyio.create_task_group() as watch:
                async with anyio.create_task_group() as tasks:
                    watch.start_soon(_stop_on_signal, gateway, signals, tasks.cancel_scope)
                    tasks.start_soon(gateway.run)
                    await mcp.run_stdio()
                    tasks.cancel_scope.cancel()
                watch.cancel_scope.cancel()

    try:
        anyio.run(main, backend_options={"use_uvloop": _has_uvloop()})
    finally:
        gateway.close()
        gateway.service.close()


async def _stop_on_signal(gateway: Gateway, signals: Any, scope: anyio.CancelScope) -> None:
    async for _signal in signals:
        await gateway.shutdown()
        await anyio.sleep(FLUSH_S)  # the answers just given reach the host's pipe
        scope.cancel()


def serve_http(app: Any, gateway: Gateway, host: str, port: int, log_level: str) -> None:
    """The HTTP API under uvicorn until SIGTERM or SIGINT, which first shuts the gateway's calls down (so every
    caller gets an answer within about two seconds), then lets uvicorn stop."""
    import asyncio

    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:
            if not self.should_exit:
                loop = asyncio.get_event_loop()
                loop.call_soon_threadsafe(lambda: loop.create_task(gateway.shutdown()))
            super().handle_exit(sig, frame)

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=3)
    Server(config).run()


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True
