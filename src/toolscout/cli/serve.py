"""`toolscout serve DIR`: the HTTP API (with MCP at /mcp), or an MCP server over stdio / HTTP.

`python -m toolscout.serve` runs the same command on its own (`main`). Environment variables are read
here, once: TOOLSCOUT_TOKEN is the default for --token.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

from ..feedback import PER_SOURCE_CAP
from ..serve.journal import COMPACT_EVERY
from .options import add_fast_queries, number_in

PORT = number_in(int, 1, 65535)

LOOPBACK = ("127.0.0.1", "localhost", "::1")
DESCRIPTION = ("Serve DIR (written by `toolscout index`). Default: the HTTP API on --host:--port with the MCP "
               "endpoint at /mcp. --mcp: an MCP server only, over stdio (what MCP hosts launch) or streamable "
               "HTTP (--mcp http).")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a pipeline directory: HTTP API + MCP, or MCP over stdio",
                       description=DESCRIPTION)
    add_serve_arguments(p)
    p.set_defaults(handler=cmd_serve)


def add_serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("dir", metavar="DIR", nargs="?", default=None,
                   help="pipeline directory; writes are journalled beside its snapshot (optional with --store)")
    p.add_argument("--store", default=None, metavar="DSN",
                   help="serve the shared PostgreSQL index at DSN (postgresql://...; ?tenant=T: the default tenant): "
                        "any number of servers on one DSN serve one catalog (docs/postgres.md). A DIR indexed with "
                        "--store postgresql://... is served from its database without this flag")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default %(default)s)")
    p.add_argument("--port", type=PORT, default=8080, help="port to listen on (default %(default)s)")
    p.add_argument("--mcp", nargs="?", const="stdio", choices=["stdio", "http"], default=None,
                   help="serve MCP only: over stdio (the default with --mcp) or streamable HTTP at /mcp")
    add_access_arguments(p)
    p.add_argument("--always-include", action="append", default=[], metavar="ID",
                   help="a tool id returned with every search (repeatable)")
    p.add_argument("--namespace", action="append", default=None,
                   help="MCP over stdio: only tools of this namespace (repeatable)")
    p.add_argument("--compact-every", type=number_in(int, 1), default=COMPACT_EVERY, metavar="N",
                   help="write a full snapshot once the journal holds N items: each write, and each feedback "
                        "event, tool or id it holds, counts one (a restart after a crash replays them; default "
                        "%(default)s)")
    add_service_arguments(p)
    add_fast_queries(p)
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])


def add_access_arguments(p: argparse.ArgumentParser) -> None:
    """Bearer tokens (`serve/auth.py`), shared by serve and gateway."""
    p.add_argument("--token", default=None,
                   help="bearer token that may read and write (default: $TOOLSCOUT_TOKEN); writes need it")
    p.add_argument("--tokens", default=None, metavar="FILE",
                   help='per-token permissions, JSON {"tokens": [{"token", "name", "namespaces", "write", "feedback", '
                        '"source", "tenant"}]} (docs/serving.md)')
    p.add_argument("--require-read-token", action="store_true", help="searches and reads need a token too")


def add_service_arguments(p: argparse.ArgumentParser) -> None:
    """What the service core does with searches and feedback, shared by serve and gateway."""
    p.add_argument("--min-score", type=number_in(float, float("-inf")), default=None,
                   help="abstention threshold on the score: return no tool when the best scores below it "
                        "(a score belongs to one pipeline: benchmarks/abstain.py calibrates one)")
    p.add_argument("--min-probability", type=probability_threshold, default=None, metavar="P|calibrated|off",
                   help="abstention threshold on the chance that one of the best five hits is relevant, from their "
                        "calibrated probabilities (docs/scores.md): a number from 0 to 1, 'calibrated' for the "
                        "threshold chosen with the calibration, or 'off' (default: off for serve, calibrated for "
                        "gateway)")
    p.add_argument("--max-body", type=number_in(int, 1), default=1 << 20, metavar="BYTES",
                   help="largest request body the API's routes accept (default %(default)s)")
    p.add_argument("--mcp-max-body", type=number_in(int, 1), default=64 << 20, metavar="BYTES",
                   help="largest request body /mcp accepts: tool calls carry files and images (default %(default)s)")
    p.add_argument("--no-fsync", action="store_true",
                   help="do not fsync the journal (tests and benchmarks only: a power cut may lose acknowledged writes)")
    p.add_argument("--feedback-rate", type=number_in(float, 0), default=200.0, metavar="EVENTS_PER_S",
                   help="tool-use feedback a source may post per second on average (default %(default)s; 0: no limit)")
    p.add_argument("--feedback-burst", type=number_in(float, 1), default=2000.0, metavar="EVENTS",
                   help="feedback events a source may post at once (default %(default)s)")
    p.add_argument("--feedback-volume", type=number_in(int, 0), default=200_000, metavar="REQUESTS",
                   help="requests one source may have teaching the index at once (default %(default)s; 0: no limit)")
    p.add_argument("--feedback-cap", type=number_in(int, 1), default=None, metavar="N",
                   help="requests one feedback source may teach one tool (kept with the index; default "
                        f"the index's own, {PER_SOURCE_CAP:,} for a new one)")
    p.add_argument("--batch-workers", type=number_in(int, 0), default=2, metavar="N",
                   help="threads that run batched searches (default %(default)s; 0: no batching)")


def auth_from_args(args: argparse.Namespace):
    """The token rules the flags give (TOOLSCOUT_TOKEN is --token's default: read here, once)."""
    from ..serve.auth import AuthConfig

    token = args.token if args.token is not None else os.environ.get("TOOLSCOUT_TOKEN") or None
    return AuthConfig.build(token, args.tokens, args.require_read_token)


def service_options(args: argparse.Namespace) -> dict:
    """`ToolService.open` options from `add_service_arguments`' flags."""
    from ..serve.limits import FeedbackLimits

    limits = FeedbackLimits(rate=args.feedback_rate or None, burst=args.feedback_burst,
                            volume=args.feedback_volume or None)
    options = {"fsync": not args.no_fsync, "min_score": args.min_score, "batch_workers": args.batch_workers,
               "limits": limits, "feedback_cap": args.feedback_cap}
    if args.min_probability is not None:  # given: "off" is None, else a number or "calibrated"
        options["min_probability"] = None if args.min_probability == "off" else args.min_probability
    return options


def probability_threshold(text: str) -> float | str:
    """--min-probability: a number from 0 to 1, "calibrated" or "off"."""
    if text in ("calibrated", "off"):
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, 'calibrated' or 'off', got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a probability is from 0 to 1, got {value}")
    return value


def single_threaded_math() -> None:
    """Concurrent requests already keep the cores busy: a multi-threaded BLAS per vector scan only adds
    spinning threads (measured: 2x the CPU per search on
    2 cores). Set before numpy and torch load; overridable. Also caps glibc's malloc arenas
    (`few_malloc_arenas`), before any thread starts."""
    for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    few_malloc_arenas()


def few_malloc_arenas(arenas: int = 2) -> None:
    """glibc gives each thread that allocates an arena of its own (up to 8 per core) and keeps what is freed
    in it: a gateway that embedded its 265 tools on its encoding threads stayed 279 MiB resident, 227 MiB
    with two arenas (docs/install.md). Caps them as MALLOC_ARENA_MAX=2 would (which, when set, wins); on a
    C library without mallopt (musl, macOS, Windows) nothing happens."""
    if not sys.platform.startswith("linux") or "MALLOC_ARENA_MAX" in os.environ:
        return
    import ctypes

    try:
        ctypes.CDLL(None).mallopt(-8, int(arenas))  # -8: M_ARENA_MAX
    except (OSError, AttributeError):
        pass


def cmd_serve(args: argparse.Namespace) -> int:
    single_threaded_math()
    _check_dependencies(args)
    from ..serve.service import Principal

    auth = auth_from_args(args)
    service = _open_service(args, auth)
    freeze_loaded_objects()
    where = service.describe()
    try:
        if args.mcp == "stdio":
            from ..serve.mcp import build_mcp_server

            principal = Principal("stdio", None if args.namespace is None else frozenset(args.namespace), False,
                                  feedback=True)
            _announce_stdio(service, principal, where)
            build_mcp_server(service, stdio_principal=principal).run("stdio")
            return 0
        if args.namespace:
            raise ValueError("--namespace applies to MCP over stdio; over HTTP, restrict namespaces per token (--tokens)")
        if args.host not in LOOPBACK and not auth.enabled:
            print(f"toolscout: warning: listening on {args.host} with no token: anyone who can reach it may change "
                  "the catalog (give --token or --tokens)", file=sys.stderr)
        app = _app(service, auth, args)
        from ..serve.listen import run_server

        source, where = where, f"http://{args.host}:{args.port}"
        what = "MCP at /mcp" if args.mcp == "http" else "API docs at /docs, MCP at /mcp"
        run_server(app, args.host, args.port, args.log_level, graceful_s=10,
                   announce=f"toolscout: serving {len(service)} tools from {source} at {where} ({what})")
        return 0
    finally:
        service.close()


def _announce_stdio(service, principal, where: str) -> None:
    """Say what the MCP server over stdio serves: the tools of its --namespace, and any namespace that holds no
    tool (a typo, most likely: the agent's every search would find nothing, and its host is the one told)."""
    unknown = service.unknown_namespaces(principal.namespaces)
    if unknown:
        print(f"toolscout: warning: no tool is in namespace {', '.join(map(repr, unknown))} (--namespace): searches "
              "find nothing there", file=sys.stderr)
    print(f"toolscout: MCP over stdio, {sum(service.namespaces(principal).values())} tools from {where}",
          file=sys.stderr)


def freeze_loaded_objects() -> None:
    """Move what loading made (indexes, tool texts, learned feedback: 200k+ objects) out of the garbage
    collector's reach: they live as long as the server, and a full collection walked them all, ~120 ms
    with every request waiting, whenever the caches' turnover triggered one (measured on a 16,776-event
    metatool index)."""
    import gc

    gc.collect()
    gc.freeze()


def _open_service(args: argparse.Namespace, auth):
    """The service for --store postgresql://..., for a directory indexed into PostgreSQL (it recorded its
    store), or for the local directory DIR."""
    from ..postgres import recorded_spec
    from ..serve.service import ToolService
    from ..store.pgvector import is_postgres_spec, redact

    if args.store is not None and not is_postgres_spec(args.store):
        raise ValueError(f"--store takes a PostgreSQL DSN (postgresql://...), not {redact(args.store)!r}; a local "
                         "index is served from its directory")
    target = args.store or recorded_spec(args.dir) or args.dir
    if target is None:
        raise ValueError("give the pipeline directory to serve (DIR) or --store postgresql://...")
    if is_postgres_spec(target):
        if auth.tenants and not auth.require_read_token:
            print("toolscout: warning: tokens are bound to tenants but reads are open: requests without a token "
                  "read the default tenant (add --require-read-token)", file=sys.stderr)
    elif auth.tenants:
        raise ValueError("tokens bound to tenants need the PostgreSQL store (--store postgresql://...); a local "
                         "index holds one catalog")
    service = ToolService.open(target, compact_every=args.compact_every, always_include=args.always_include,
                               fast_queries=args.fast_queries, **service_options(args))
    if is_postgres_spec(target):
        _warn_of_missing_catalogs(target, auth)
    held = {tool.id for tool in service.tools} if args.always_include else set()
    missing = [tool_id for tool_id in dict.fromkeys(args.always_include) if tool_id not in held]
    if missing:  # a typo, most likely; a tool added under that id later is included from then on
        print(f"toolscout: warning: --always-include {', '.join(missing)}: no tool has that id now; it is added to "
              "answers once one does", file=sys.stderr)
    return service


def _warn_of_missing_catalogs(spec: str, auth) -> None:
    """A tenant served here (the store spec's, and those tokens are bound to) that has no catalog answers every
    search with nothing, which reads as "no tool fits": a mistyped tenant, most likely. Said at start; it is not
    refused, since writes through this server may fill a new tenant."""
    from ..postgres import missing_catalogs

    for note in missing_catalogs(spec, sorted(auth.tenants)):
        print(f"toolscout: warning: {note}: its searches find nothing until a catalog is indexed into it "
              "(toolscout index --store) or written to it", file=sys.stderr)


def _check_dependencies(args: argparse.Namespace) -> None:
    from ..errors import MissingDependency

    needed = ["mcp"] if args.mcp == "stdio" else ["fastapi", "uvicorn", "mcp"]
    for module in needed:
        try:
            __import__(module)
        except ImportError:
            raise MissingDependency(module, "toolscout serve", extra="serve") from None
    try:
        from mcp.server import MCPServer  # noqa: F401  (the v2 SDK)
    except ImportError:
        raise MissingDependency("mcp>=2.0", "toolscout serve (the MCP server)", extra="serve") from None


def _app(service, auth, args):
    if args.mcp != "http":
        from ..serve.http import create_app

        return create_app(service, auth, max_body_bytes=args.max_body, host=args.host,
                          mcp_max_body_bytes=args.mcp_max_body)
    import contextlib

    from starlette.applications import Starlette
    from starlette.routing import Route

    from ..serve.mcp import build_mcp_server, mcp_http_app
    from ..serve.metrics import Metrics
    from ..serve.middleware import BearerGate, BodyLimit, InternalErrors, Observe

    metrics = Metrics()
    inner = mcp_http_app(build_mcp_server(service, auth=auth, metrics=metrics), host=args.host,
                         max_body_bytes=args.mcp_max_body)

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        async with inner.router.lifespan_context(inner):
            try:
                yield
            finally:  # as the API's app does: uvicorn ends a SIGTERM by the signal, past this function's finally
                import anyio.to_thread

                await anyio.to_thread.run_sync(service.close)

    app = Starlette(routes=[Route("/mcp", endpoint=BearerGate(inner.router.routes[0].endpoint, auth),
                                  methods=["GET", "POST", "DELETE"])], lifespan=lifespan)
    return Observe(InternalErrors(BodyLimit(app, args.max_body, args.mcp_max_body)), metrics)


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = argparse.ArgumentParser(prog="python -m toolscout.serve", description=DESCRIPTION)
    add_serve_arguments(parser)
    args = parser.parse_args(argv)
    from ..errors import ToolScoutError

    try:
        return cmd_serve(args) or 0
    except (ToolScoutError, ValueError, OSError) as exc:
        print(f"toolscout serve: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
