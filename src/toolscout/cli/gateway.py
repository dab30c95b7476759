"""`toolscout gateway CONFIG`: one MCP endpoint in front of many MCP servers and HTTP APIs (docs/gateway.md).

    toolscout gateway servers.json                     # MCP over stdio: what an MCP host launches
    toolscout gateway servers.json --port 8080         # HTTP: the API of `toolscout serve`, MCP at /mcp,
                                                       # and POST /tools/{id}/call
    toolscout gateway approve --config servers.json    # accept every changed tool definition (see --pin)
    toolscout gateway approve ID... --index DIR        # accept these

CONFIG is the `mcpServers` JSON of Claude Desktop or Cursor (`gateway/config.py`). The index lives in
--index DIR, by default in $XDG_STATE_HOME/toolscout/gateway/ (~/.local/state/...), one folder per config
file. Environment variables are read here, once: TOOLSCOUT_TOKEN (--token's default), XDG_STATE_HOME and
the config's own ${VAR}s.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import sys
from pathlib import Path

from .serve import (
    LOOPBACK,
    add_access_arguments,
    add_service_arguments,
    auth_from_args,
    freeze_loaded_objects,
    service_options,
    single_threaded_math,
)

DESCRIPTION = ("Put toolscout in front of the MCP servers (and OpenAPI services) of CONFIG: the agent connects to the "
               "gateway only, finds tools with search_tools and calls them with call_tool, and the gateway learns "
               "from every call it forwards. Without --port: MCP over stdio. `toolscout gateway approve [ID...]` "
               "accepts changed tool definitions (--pin).")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from ..gateway.config import PING_EVERY_S, SEARCH_WAIT_S

    p = sub.add_parser("gateway", help="one MCP endpoint in front of many servers: search, call, learn",
                       description=DESCRIPTION, usage="toolscout gateway CONFIG [options]\n"
                                                      "       toolscout gateway approve [ID ...] "
                                                      "(--config CONFIG | --index DIR) [--list]")
    p.add_argument("config", metavar="CONFIG", help="the mcpServers JSON file (or 'approve', see above)")
    p.add_argument("ids", nargs="*", metavar="ID", help=argparse.SUPPRESS)
    p.add_argument("--config", dest="config_file", default=None, help=argparse.SUPPRESS)
    p.add_argument("--list", action="store_true", help="approve: list the tools waiting for approval, approve none")
    p.add_argument("--index", default=None, metavar="DIR",
                   help="the gateway's index directory (default: one per config under $XDG_STATE_HOME/toolscout/"
                        "gateway); a restart re-embeds only tools whose definitions changed")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on with --port (default %(default)s)")
    p.add_argument("--port", type=int, default=None, help="serve HTTP on this port (default: MCP over stdio)")
    add_access_arguments(p)
    p.add_argument("--pin", action="store_true",
                   help="hold a tool whose description or schema changed since first seen out of search and calls "
                        "until `toolscout gateway approve` accepts it")
    p.add_argument("--unavailable", choices=["mark", "hide"], default="mark",
                   help="tools of an upstream that is down: marked available=false in results (default), or left out")
    p.add_argument("--expose", choices=["none", "found"], default="none",
                   help="found: the tools a session's searches found are also listed as its own tools "
                        "(with notifications/tools/list_changed), for hosts that refresh their tool list")
    p.add_argument("--learn-from-calls", choices=["holding", "latest", "off"], default="holding",
                   help="which search a forwarded call teaches: the latest whose results held the tool, else none "
                        "(holding, the default: docs/gateway.md), always the latest (credits unrelated calls), or none")
    p.add_argument("--attribution-window", type=int, default=8, metavar="CALLS",
                   help="calls after which a search no longer takes their feedback (default %(default)s)")
    p.add_argument("--relist-every", type=float, default=300.0, metavar="SECONDS",
                   help="list every upstream's tools again this often, besides its change notifications "
                        "(default %(default)s)")
    p.add_argument("--ping-every", type=float, default=PING_EVERY_S, metavar="SECONDS",
                   help="ping every MCP upstream this often (and at once after a call times out); one that misses "
                        "2 pings in a row, or times out 3 calls in a row, is restarted (default %(default)s; "
                        "0: only after a timed-out call)")
    p.add_argument("--search-wait", type=float, default=SEARCH_WAIT_S, metavar="SECONDS",
                   help="how long searches wait, in all, for a server that is starting and has no tools in the index "
                        "yet (a new index); the answer names the servers not yet searchable (default %(default)s)")
    p.add_argument("--strict", action="store_true",
                   help="refuse to start when a server's config cannot be resolved (an unset ${VAR}, a command "
                        "not found); by default that server is down, with the reason, and the others serve")
    add_service_arguments(p)
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    p.set_defaults(handler=cmd_gateway)


def cmd_gateway(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="toolscout gateway: %(levelname)s %(name)s: %(message)s")
    if args.config == "approve":
        return cmd_approve(args)
    if args.ids:
        raise ValueError(f"unexpected arguments {args.ids}: give one CONFIG (or `approve` and ids)")
    single_threaded_math()
    _check_dependencies()
    from ..gateway.config import load_config

    config = load_config(args.config, strict=args.strict)
    index = gateway_index(args)
    lock = _claim(index)
    if lock is None:  # another gateway owns the index: this one only relays (and imports no more than that)
        return _attach_stdio(config, args)
    try:
        auth = auth_from_args(args)
        gateway = _open(config, args)
    except BaseException:
        lock.release()
        raise
    names = ", ".join(u.name + ("" if u.enabled else " (disabled)") + (" (down: see below)" if u.problem else "")
                      for u in config.upstreams)
    print(f"toolscout gateway: {len(config.upstreams)} upstreams ({names}); index {index}", file=sys.stderr)
    for name, problem in config.problems:
        print(f"toolscout gateway: {name} will not start: {problem}", file=sys.stderr)
    if args.port is None:
        return _serve_stdio(gateway, args, lock)
    try:
        return _serve_http(gateway, auth, args)
    finally:
        lock.release()


def _claim(index: Path):
    """The lock that makes this gateway the owner of `index` (made first if new: gateways started together
    make it once); None when another gateway holds it."""
    from ..artifacts import POINTER
    from ..gateway.hosts import IndexLock

    if not (index / POINTER).is_file():
        from ..gateway.runtime import ensure_index

        ensure_index(index)
    return IndexLock.claim(index)


def _open(config, args: argparse.Namespace):
    """The gateway over its index (this process holds the index's lock)."""
    from ..gateway.runtime import GatewaySettings, open_gateway

    settings = GatewaySettings(index=gateway_index(args), pin=args.pin, hide_unavailable=args.unavailable == "hide",
                               expose=args.expose, attribution=args.learn_from_calls, window=args.attribution_window,
                               relist_every=args.relist_every, ping_every=args.ping_every,
                               search_wait=max(0.0, args.search_wait), service=service_options(args))
    gateway = open_gateway(config, settings)
    freeze_loaded_objects()
    return gateway


def _serve_stdio(gateway, args: argparse.Namespace, lock) -> int:
    from ..gateway.mcp_server import GatewayMcp
    from ..gateway.runtime import serve_stdio

    print("toolscout gateway: MCP over stdio", file=sys.stderr)
    serve_stdio(gateway, GatewayMcp(gateway, expose=args.expose), index=gateway_index(args), lock=lock)
    return 0


def _attach_stdio(config, args: argparse.Namespace) -> int:
    """Another gateway holds the index: relay this host to it (and take the index over when it stops)."""
    from ..errors import ToolScoutError
    from ..gateway.bridge import attach_stdio
    from ..gateway.hosts import in_use

    index = gateway_index(args)
    if args.port is not None:
        raise ToolScoutError(in_use(index) + "; a gateway serving HTTP needs an index of its own (--index DIR), "
                             "while stdio gateways on one config share it")

    def make_owner():
        from ..gateway.mcp_server import GatewayMcp

        gateway = _open(config, args)
        return gateway, GatewayMcp(gateway, expose=args.expose)

    print(f"toolscout gateway: another gateway serves {index}: attaching to it (MCP over stdio)", file=sys.stderr)
    attach_stdio(index, make_owner)
    return 0


def gateway_index(args: argparse.Namespace) -> Path:
    return Path(args.index) if args.index else default_index(Path(args.config))


def _serve_http(gateway, auth, args: argparse.Namespace) -> int:
    from ..gateway.http import GatewayApi
    from ..gateway.mcp_server import GatewayMcp
    from ..gateway.runtime import serve_http
    from ..serve.http import create_app

    if args.host not in LOOPBACK and not auth.enabled:
        print(f"toolscout gateway: warning: listening on {args.host} with no token: anyone who can reach it may "
              "call every upstream's tools (give --token or --tokens)", file=sys.stderr)
    extension = GatewayApi(gateway, GatewayMcp(gateway, auth=auth, expose=args.expose), index=gateway_index(args))
    app = create_app(gateway.service, auth, max_body_bytes=args.max_body, host=args.host, extension=extension,
                     mcp_max_body_bytes=args.mcp_max_body)
    print(f"toolscout gateway: http://{args.host}:{args.port} (MCP at /mcp, API docs at /docs)", file=sys.stderr)
    serve_http(app, gateway, args.host, args.port, args.log_level)
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    """Accept changed tool definitions: the given ids, or every tool waiting (with none given)."""
    from ..gateway.definitions import DefinitionLedger

    if args.index:
        index = Path(args.index)
    elif args.config_file:
        index = default_index(Path(args.config_file))
    else:
        raise ValueError("approve needs the gateway's index: --index DIR, or --config CONFIG for its default")
    if not index.is_dir():
        raise ValueError(f"{index}: no gateway index there (has the gateway run with this config?)")
    ledger = DefinitionLedger(index, pin=True)
    if args.list:
        waiting = ledger.pending()
        print("\n".join(waiting) if waiting else "no tool is waiting for approval")
        return 0
    approved = ledger.approve(args.ids or None)
    print(f"approved {len(approved)} tool definition(s)" + (": " + ", ".join(approved[:20]) if approved else ""))
    return 0


def default_index(config: Path) -> Path:
    """One index per config file: under $XDG_STATE_HOME (else ~/.local/state)/toolscout/gateway/."""
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    digest = hashlib.sha256(str(config.resolve()).encode("utf-8")).hexdigest()[:10]
    return state / "toolscout" / "gateway" / f"{config.stem}-{digest}"


def _check_dependencies() -> None:
    """Found, not imported: a gateway that attaches to another imports none of them."""
    import importlib.util

    from ..errors import MissingDependency

    for module in ("fastapi", "uvicorn", "mcp", "httpx"):
        if importlib.util.find_spec(module) is None:
            raise MissingDependency(module, "toolscout gateway", extra="serve")
