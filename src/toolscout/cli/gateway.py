"""`toolscout gateway CONFIG`: one MCP endpoint in front of many MCP servers and HTTP APIs (docs/gateway.md).

    toolscout gateway servers.json                     # MCP over stdio: what an MCP host launches
    toolscout gateway servers.json --port 8080         # HTTP: the API of `toolscout serve`, MCP at /mcp,
                                                       # and POST /tools/{id}/call
    toolscout gateway approve --config servers.json    # accept every changed tool definition (see --pin)
    toolscout gateway approve ID... --index DIR        # accept these
    toolscout gateway servers.json --port 8080 --store postgresql://...   # a replica: any number share one index

CONFIG is the `mcpServers` JSON of Claude Desktop or Cursor (`gateway/config.py`). The index lives in
--index DIR, by default in $XDG_STATE_HOME/toolscout/gateway/ (~/.local/state/...), one folder per config
file; or, with --store, in PostgreSQL, shared by every gateway on that DSN (`?tenant=`: which catalog), each
keeping its upstreams' logs in a folder of its own under the same state directory. Environment variables
are read here, once: TOOLSCOUT_TOKEN (--token's default), XDG_STATE_HOME and the config's own ${VAR}s.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import logging
import os
import re
import sys
from pathlib import Path

from .options import number_in
from .serve import (
    LOOPBACK,
    PORT,
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


class _IdsAnywhere(argparse.ArgumentParser):
    """`gateway approve --index DIR ID...`: plain argparse takes positionals in one run, so ids after the options
    were left over (the top-level usage error); read them wherever they are, as parse_intermixed_args does."""

    _intermixing = False

    def parse_known_args(self, args=None, namespace=None):
        if self._intermixing:  # parse_known_intermixed_args calls back here for its own passes
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


def add_parsers(sub: argparse._SubParsersAction) -> None:
    from ..gateway.config import PING_EVERY_S, SEARCH_WAIT_S

    p = sub.add_parser("gateway", help="one MCP endpoint in front of many servers: search, call, learn",
                       description=DESCRIPTION, usage="toolscout gateway CONFIG [options]\n"
                                                      "       toolscout gateway approve [ID ...] "
                                                      "(--config CONFIG | --index DIR | --store DSN) [--list]")
    p.__class__ = _IdsAnywhere  # the subparsers action makes every command's parser of one class
    p.add_argument("config", metavar="CONFIG", help="the mcpServers JSON file (or 'approve', see above)")
    p.add_argument("ids", nargs="*", metavar="ID", help=argparse.SUPPRESS)
    p.add_argument("--config", dest="config_file", default=None, help=argparse.SUPPRESS)
    p.add_argument("--list", action="store_true", help="approve: list the tools waiting for approval, approve none")
    p.add_argument("--index", default=None, metavar="DIR",
                   help="the gateway's index directory (default: one per config under $XDG_STATE_HOME/toolscout/"
                        "gateway); a restart re-embeds only tools whose definitions changed")
    p.add_argument("--store", default=None, metavar="DSN",
                   help="keep the index in PostgreSQL at DSN (postgresql://...; ?tenant=T: whose catalog) instead: "
                        "any number of gateways on one DSN share the catalog, tool definitions, approvals and what "
                        "calls taught (docs/gateway.md, Replicas)")
    p.add_argument("--new-table", action="store_true",
                   help="with --store: make its ?table= with the default pipeline when the database has other index "
                        "tables but not that one (without it, refused as a likely typo; a database's first table "
                        "is made without asking)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on with --port (default %(default)s)")
    p.add_argument("--port", type=PORT, default=None, help="serve HTTP on this port (default: MCP over stdio)")
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
    p.add_argument("--attribution-window", type=number_in(int, 1), default=8, metavar="CALLS",
                   help="calls after which a search no longer takes their feedback (default %(default)s)")
    p.add_argument("--relist-every", type=number_in(float, 1), default=300.0, metavar="SECONDS",
                   help="list every upstream's tools again this often, besides its change notifications "
                        "(default %(default)s)")
    p.add_argument("--ping-every", type=number_in(float, 0), default=PING_EVERY_S, metavar="SECONDS",
                   help="ping every MCP upstream this often (and at once after a call times out); one that misses "
                        "2 pings in a row, or times out 3 calls in a row, is restarted (default %(default)s; "
                        "0: only after a timed-out call)")
    p.add_argument("--search-wait", type=number_in(float, 0), default=SEARCH_WAIT_S, metavar="SECONDS",
                   help="how long searches wait, in all, for a server that is starting and has no tools in the index "
                        "yet (a new index; with --pin, any server not listed since the start), and prompt and "
                        "resource lists for any server still starting; the answer names the servers not yet "
                        "searchable (default %(default)s)")
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
    store = _store(args)
    auth = auth_from_args(args)
    check_tenants(auth, store)
    lock = None
    if store is None:  # replicas on PostgreSQL share the database; gateways on one folder share its owner
        lock = _claim(gateway_index(args))
        if lock is None:  # another gateway owns the index: this one only relays (and imports no more than that)
            return _attach_stdio(config, args)
    logs = None if store is None else replica_logs(Path(args.config), args.port, store)
    try:
        return _run(config, args, store, auth, lock, logs)
    finally:
        for held in (lock, logs):
            if held is not None:
                held.release()


def _run(config, args: argparse.Namespace, store: str | None, auth, lock, logs) -> int:
    """Open the gateway (over the index `lock` holds, or as a replica logging into `logs`' folder) and serve."""
    gateway = _open(config, args, store, None if logs is None else logs.folder)
    names = ", ".join(u.name + ("" if u.enabled else " (disabled)") + (" (down: see below)" if u.problem else "")
                      for u in config.upstreams)
    where = f"{gateway.service.describe()} (its servers' logs in {logs.folder})" if store else gateway_index(args)
    print(f"toolscout gateway: {len(config.upstreams)} upstreams ({names}); index {where}", file=sys.stderr)
    for name, problem in config.problems:
        print(f"toolscout gateway: {name} will not start: {problem}", file=sys.stderr)
    if args.port is None:
        return _serve_stdio(gateway, args, lock)
    return _serve_http(gateway, auth, args, hosts=lock is not None)


def _claim(index: Path):
    """The lock that makes this gateway the owner of `index` (made first if new: gateways started together
    make it once); None when another gateway holds it."""
    from ..artifacts import POINTER
    from ..gateway.hosts import IndexLock

    if not (index / POINTER).is_file():
        from ..gateway.runtime import ensure_index

        ensure_index(index)
    return IndexLock.claim(index)


def _open(config, args: argparse.Namespace, store: str | None = None, logs: Path | None = None):
    """The gateway over its index (this process holds the index's lock), or a replica on the `store` tenant
    (with a folder of its own for its upstreams' logs, `logs`: `replica_logs`)."""
    from ..gateway.runtime import GatewaySettings, open_gateway

    index = gateway_index(args) if store is None else logs
    settings = GatewaySettings(index=index, store=store, new_table=args.new_table, pin=args.pin,
                               hide_unavailable=args.unavailable == "hide", expose=args.expose,
                               attribution=args.learn_from_calls, window=args.attribution_window,
                               relist_every=args.relist_every, ping_every=args.ping_every,
                               search_wait=max(0.0, args.search_wait), service=service_options(args))
    gateway = open_gateway(config, settings)
    freeze_loaded_objects()
    return gateway


def _serve_stdio(gateway, args: argparse.Namespace, lock) -> int:
    from ..gateway.mcp_server import GatewayMcp
    from ..gateway.runtime import serve_stdio

    print("toolscout gateway: MCP over stdio", file=sys.stderr)
    hosts = gateway_index(args) if lock is not None else None  # a replica's hosts share the database instead
    serve_stdio(gateway, GatewayMcp(gateway, expose=args.expose), index=hosts, lock=lock)
    return 0


def _attach_stdio(config, args: argparse.Namespace) -> int:
    """Another gateway holds the index: relay this host to it (and take the index over when it stops)."""
    from ..errors import ToolScoutError
    from ..gateway.bridge import attach_stdio
    from ..gateway.hosts import in_use

    index = gateway_index(args)
    if args.port is not None:
        raise ToolScoutError(in_use(index) + "; a gateway serving HTTP cannot join an index another gateway holds "
                             "(stdio gateways attach to the first one, not the other way round). Start the HTTP "
                             "gateway first and the stdio ones attach to it when they start; or give it an index "
                             "of its own (--index DIR: it learns apart from them); or run every gateway with "
                             "--store DSN, as replicas that share what they learn (docs/gateway.md)")

    def make_owner():
        from ..gateway.mcp_server import GatewayMcp

        gateway = _open(config, args)
        return gateway, GatewayMcp(gateway, expose=args.expose)

    print(f"toolscout gateway: another gateway serves {index}: attaching to it (MCP over stdio)", file=sys.stderr)
    attach_stdio(index, make_owner)
    return 0


def gateway_index(args: argparse.Namespace) -> Path:
    return Path(args.index) if args.index else default_index(Path(args.config))


def _serve_http(gateway, auth, args: argparse.Namespace, hosts: bool = True) -> int:
    from ..gateway.http import gateway_app
    from ..gateway.runtime import serve_http

    if args.host not in LOOPBACK and not auth.enabled:
        print(f"toolscout gateway: warning: listening on {args.host} with no token: anyone who can reach it may "
              "call every upstream's tools (give --token or --tokens)", file=sys.stderr)
    app = gateway_app(gateway, auth, expose=args.expose, index=gateway_index(args) if hosts else None,
                      max_body_bytes=args.max_body, host=args.host, mcp_max_body_bytes=args.mcp_max_body)
    serve_http(app, gateway, args.host, args.port, args.log_level,
               announce=f"toolscout gateway: http://{args.host}:{args.port} (MCP at /mcp, API docs at /docs)")
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    """Accept changed tool definitions: the given ids, or every tool waiting (with none given)."""
    store = _store(args)
    if store is not None:
        if args.config_file:
            raise ValueError("give --config CONFIG (its gateway's own index) or --store DSN (the definitions "
                             "replicas share), not both")
        return _approve_shared(args, store)
    from ..gateway.definitions import DefinitionLedger

    if args.index:
        index = Path(args.index)
    elif args.config_file:
        index = default_index(Path(args.config_file))
    else:
        raise ValueError("approve needs the gateway's index: --index DIR, --config CONFIG for its default, or "
                         "--store DSN for gateways on PostgreSQL")
    if not index.is_dir():
        raise ValueError(f"{index}: no gateway index there (has the gateway run with this config?)")
    return _approve(args, DefinitionLedger(index, pin=True))


def _approve_shared(args: argparse.Namespace, store: str) -> int:
    """`approve` for gateway replicas on PostgreSQL: the definitions their tenant shares."""
    from ..gateway.definitions import DefinitionLedger, SharedRecords
    from ..store.pg_catalog import PgCatalog
    from ..store.pg_gateway import PgGatewayState

    catalog = PgCatalog.from_spec(store)
    try:
        catalog.require_catalog("gateway approve")  # a mistyped tenant: not "nothing is waiting"
        return _approve(args, DefinitionLedger(SharedRecords(PgGatewayState(catalog)), pin=True))
    finally:
        catalog.close()


def _approve(args: argparse.Namespace, ledger) -> int:
    if args.list:
        waiting = ledger.pending()
        print("\n".join(waiting) if waiting else "no tool is waiting for approval")
        return 0
    approved = ledger.approve(args.ids or None)
    print(f"approved {len(approved)} tool definition(s)" + (": " + ", ".join(approved[:20]) if approved else ""))
    return 0


def _store(args: argparse.Namespace) -> str | None:
    """The --store DSN, checked: a PostgreSQL one, and not with --index."""
    if args.store is None:
        if args.new_table:
            raise ValueError("--new-table goes with --store DSN (it makes the DSN's ?table=)")
        return None
    from ..store.pgvector import is_postgres_spec, redact

    if not is_postgres_spec(args.store):
        raise ValueError(f"--store takes a PostgreSQL DSN (postgresql://...), not {redact(args.store)!r}; a "
                         "gateway's own index directory is --index DIR")
    if args.index:
        raise ValueError("give --index DIR (an index of this gateway's own) or --store DSN (one shared by replicas), "
                         "not both")
    return args.store


def check_tenants(auth, store: str | None) -> None:
    """Tokens bound to a tenant must name the gateway's: a gateway serves one catalog (the store's `?tenant=`)."""
    if not auth.tenants:
        return
    if store is None:
        raise ValueError("tokens bound to tenants need the PostgreSQL store (--store postgresql://...?tenant=T); a "
                         "gateway's own index holds one catalog")
    from ..store.pgvector import PgSpec

    tenant = PgSpec.parse(store).tenant
    others = sorted(auth.tenants - {tenant})
    if others:
        raise ValueError(f"tokens are bound to tenant(s) {', '.join(map(repr, others))}, but this gateway serves "
                         f"tenant {tenant!r} (?tenant= in --store): run one gateway (or set of replicas) per tenant, "
                         "each with its tenant's tokens")


def replica_logs(config: Path, port: int | None, store: str):
    """The folder where a replica on PostgreSQL keeps its upstreams' logs, held (an `IndexLock` on it) while the
    replica runs: beside the config's default index, one per database tenant (its DSN without the password)
    and port ('stdio' over stdio), and the next free one (-2, -3, ...) while another replica on this machine
    holds that one, so the "see .../NAME.log" of each replica's errors shows its own servers."""
    from ..gateway.hosts import IndexLock
    from ..store.pgvector import PgSpec

    index = default_index(config)
    spec = PgSpec.parse(store)
    tenant = re.sub(r"[^A-Za-z0-9_.-]+", "_", spec.tenant)[:40]
    where = hashlib.sha256(str(spec).encode("utf-8")).hexdigest()[:8]  # str(spec): the DSN without its password
    slot = f"port-{port}" if port is not None else "stdio"
    base = index.with_name(f"{index.name}-replicas") / f"{tenant}-{where}" / slot
    for n in itertools.count(1):
        lock = IndexLock.claim(base if n == 1 else base.with_name(f"{base.name}-{n}"))
        if lock is not None:
            return lock


def default_index(config: Path) -> Path:
    """One index per config file: under $XDG_STATE_HOME (else ~/.local/state)/toolscout/gateway/. Named after
    the file itself, not a link to it, so every host that reaches the file shares one index."""
    state = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    real = config.resolve()
    digest = hashlib.sha256(str(real).encode("utf-8")).hexdigest()[:10]
    return state / "toolscout" / "gateway" / f"{real.stem}-{digest}"


def _check_dependencies() -> None:
    """Found, not imported: a gateway that attaches to another imports none of them."""
    import importlib.util

    from ..errors import MissingDependency

    for module in ("fastapi", "uvicorn", "mcp", "httpx"):
        if importlib.util.find_spec(module) is None:
            raise MissingDependency(module, "toolscout gateway", extra="serve")
