"""Putting a gateway together from its config, and running it over stdio or HTTP.

The index is a pipeline directory like any `toolscout serve DIR` serves (a snapshot plus a journal of
writes), made with the default pipeline the first time; the gateway's definition records and its
upstreams' stderr logs (`upstream-logs/NAME.log`) live beside it. A restart loads it as it was, so only
tools whose definitions changed meanwhile are embedded again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio

from ..artifacts import POINTER
from ..errors import ToolScoutError
from ..pipeline import ToolScout
from ..serve.service import ToolService
from .attribution import DEFAULT_RULE, DEFAULT_WINDOW, CallAttribution
from .config import GatewayConfig, UpstreamSpec
from .core import Gateway, GatewayOptions
from .definitions import DefinitionLedger
from .mcp_server import GatewayMcp
from .mcp_upstream import McpUpstream
from .openapi_upstream import OpenApiUpstream
from .upstream import Upstream

logger = logging.getLogger(__name__)
LOG_FOLDER = "upstream-logs"


@dataclass(frozen=True)
class GatewaySettings:
    """How to run a gateway, beyond its config (the CLI's flags). `service`: options for `ToolService.open`
    (fsync, min_score, batch_workers, limits, feedback_cap)."""

    index: Path
    pin: bool = False
    hide_unavailable: bool = False
    expose: str = "none"
    attribution: str = DEFAULT_RULE
    window: int = DEFAULT_WINDOW
    relist_every: float = 300.0
    service: dict[str, Any] = field(default_factory=dict)


def open_gateway(config: GatewayConfig, settings: GatewaySettings) -> Gateway:
    """The gateway over `settings.index` (made if new), its upstreams not yet started (`Gateway.run`)."""
    for warning in config.warnings:
        logger.warning("%s", warning)
    ensure_index(settings.index)
    service = ToolService.open(settings.index, **settings.service)
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
    return McpUpstream(spec, log_dir=settings.index / LOG_FOLDER, relist_every=settings.relist_every)


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
    """MCP over stdio until the host closes it, with the upstreams supervised meanwhile."""

    async def main() -> None:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(gateway.run)
            await mcp.run_stdio()
            tasks.cancel_scope.cancel()

    try:
        anyio.run(main, backend_options={"use_uvloop": _has_uvloop()})
    finally:
        gateway.close()
        gateway.service.close()


def _has_uvloop() -> bool:
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True
