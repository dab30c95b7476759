"""`toolscout index`, `toolscout search` and `toolscout demo`: build a pipeline directory from catalogs,
search one, and show both on the bundled sample catalog."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ..defaults import DEFAULT_RETRIEVER
from .options import (add_fast_queries, add_option_flag, add_rerank_options, add_retriever_options,
                      pipeline_from_args)

if TYPE_CHECKING:
    from ..hits import Hits

EXAMPLE_TASKS = (
    "I need to see a doctor next week, can you book me an appointment?",
    "What's on my schedule for tomorrow?",
    "Remind me to buy milk at 6pm",
)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("index", help="index one or more tool catalogs into a pipeline directory")
    p.add_argument("catalogs", nargs="+", metavar="CATALOG",
                   help="catalog files: OpenAI/Anthropic tools, MCP tools/list, OpenAPI, Python module, benchmark JSONL")
    p.add_argument("--out", required=True, help="pipeline directory to write (replaced atomically)")
    p.add_argument("--format", default=None, help="catalog format, when detection is not wanted")
    p.add_argument("--namespace", action="append", default=None,
                   help="namespace for a catalog's tools: once, for a single catalog, or once per catalog in order")
    p.add_argument("--lenient", action="store_true", help="skip and report malformed tools instead of failing")
    p.add_argument("--quiet", action="store_true", help="no progress bar while a large catalog is embedded")
    add_rerank_options(p)
    add_retriever_options(p)
    add_option_flag(p)
    add_fast_queries(p, saved=False)  # the tier is saved with the index: search and serve use it
    _add_drop_learning(p)
    p.set_defaults(handler=cmd_index)

    p = sub.add_parser("search", help="search a pipeline directory with a task")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("query", metavar="TASK", nargs="+", help="the task in plain language (several: one search each)")
    p.add_argument("-k", type=int, default=5, help="number of tools to return (default %(default)s)")
    p.add_argument("--namespace", action="append", default=None, help="only tools in this namespace (repeatable)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_fast_queries(p)
    p.set_defaults(handler=cmd_search)

    p = sub.add_parser("demo", help="index the bundled sample catalog and answer example tasks")
    p.add_argument("--out", default="toolscout-demo-index", help="where to write the demo index")
    p.add_argument("--retriever", default=DEFAULT_RETRIEVER)
    _add_drop_learning(p)
    p.set_defaults(handler=cmd_demo)


def _add_drop_learning(p: argparse.ArgumentParser) -> None:
    p.add_argument("--drop-learning", action="store_true",
                   help="when --out holds an index that learned from feedback, do not keep what it learned (by "
                        "default the new index takes it over, for the tools it still has)")


def cmd_index(args: argparse.Namespace) -> int:
    from ..encoders import progress_shown
    from ..serve.held import replacing
    from ..store.pgvector import is_postgres_spec

    tools = _load_catalogs(args)
    with replacing(args.out) as replacement, progress_shown(not args.quiet):  # refused while served, before the build
        if is_postgres_spec(args.store):  # the shared PostgreSQL index: the same pipeline, its data in the database
            from .pg_store import index_into_postgres

            _refuse_to_drop_learning(args, replacement)
            return index_into_postgres(args, tools, replacement)
        start = time.perf_counter()
        learned = _learned_to_keep(args, replacement)
        scout = pipeline_from_args(args, tools)  # its warnings print as `warning: ...` lines (cli.main)
        _keep_learning(scout, learned, args.out)
        scout.save(args.out, extra_config=replacement.config, held_lock=replacement.lock_fd)
        replacement.saved()
    took = time.perf_counter() - start
    tier = {"table": ", tasks through the static table", "student": ", tasks through the query student"}.get(
        args.fast_queries, "")
    print(f"indexed {len(scout)} tools with {args.retriever}{tier} in {took:.1f}s → {args.out}", file=sys.stderr)
    return 0


def _learned_to_keep(args: argparse.Namespace, replacement):
    """The index `--out` holds, when it learned from feedback and the new one is to keep that (no
    --drop-learning); refused, naming the flag, when what it learned cannot be read."""
    from ..errors import ToolScoutError

    if args.drop_learning:
        if replacement.holds_learning():
            print(f"--drop-learning: what {args.out} learned from feedback is not kept", file=sys.stderr)
        return None
    try:
        return replacement.learned()
    except (ToolScoutError, OSError) as exc:
        raise ToolScoutError(f"{args.out}: what its index learned from feedback cannot be read, so it cannot be "
                             f"kept ({exc}). Restore the folder, or give --drop-learning to replace it without "
                             "what it learned") from None


def _keep_learning(scout, learned, out: str) -> None:
    """The new index takes over what the one it replaces learned (`ToolScout.carry_learning`), and says so."""
    if learned is None:
        return
    from ..feedback import learning_kept, likely_renames, renames_note

    taught = {usage.tool_id for usage in learned.ledger.taught()}  # read before: carrying leaves `learned` as it is
    kept, dropped = scout.carry_learning(learned)
    print(learning_kept(out, kept, dropped), file=sys.stderr)
    present = {tool.id for tool in scout.tools}
    gone = [tool for tool in learned.tools if tool.id in taught and tool.id not in present]
    note = renames_note(likely_renames(gone, scout.tools), gone, scout.tools)
    if note:
        print(f"warning: {note}", file=sys.stderr)


def _refuse_to_drop_learning(args: argparse.Namespace, replacement) -> None:
    """A directory that learned from feedback is not replaced by a pointer at PostgreSQL without --drop-learning:
    the database cannot take over what the directory learned."""
    from ..errors import ToolScoutError

    if replacement.holds_learning() and not args.drop_learning:
        raise ToolScoutError(f"{args.out}: its index learned from feedback, which an index in PostgreSQL cannot take "
                             "over (teach the database with toolscout learn --store DSN LOG.jsonl); give another "
                             "--out, or --drop-learning to replace it without what it learned")


def _load_catalogs(args: argparse.Namespace) -> list:
    """Every catalog's tools, telling what each load skipped or warned of; an id in two catalogs, or no tool
    in any, fails clearly."""
    from ..errors import CatalogError
    from ..ingest import LoadReport, load_tools

    tools, came_from = [], {}  # id -> the position of its catalog on the command line
    for i, (catalog, namespace) in enumerate(zip(args.catalogs, _namespaces(args))):
        report = LoadReport()
        loaded = load_tools(catalog, format=args.format, lenient=args.lenient, namespace=namespace, report=report)
        for line in report.notices():
            print(f"warning: {line}", file=sys.stderr)
        print(f"{catalog}: {len(loaded)} tools ({report.format})", file=sys.stderr)
        for tool in loaded:
            if came_from.setdefault(tool.id, i) != i:
                first = args.catalogs[came_from[tool.id]]
                raise CatalogError(f"duplicate tool id {tool.id!r}: in {first} and in {catalog}; ids are "
                                   "unique in an index: rename one of the tools, or give each catalog its namespace "
                                   "(--namespace once per catalog, in their order)")
        tools.extend(loaded)
    if not tools:
        raise CatalogError(f"nothing to index: {', '.join(args.catalogs)} gave no tools (see the warnings above)")
    return tools


def _namespaces(args: argparse.Namespace) -> list:
    """The namespace of each catalog: none, the one given for a single catalog, or one given per catalog."""
    given = args.namespace or []
    if given and len(given) != len(args.catalogs):
        raise ValueError(f"{len(given)} --namespace for {len(args.catalogs)} catalogs: give one per catalog, in "
                         "their order, or none")
    return given or [None] * len(args.catalogs)


def cmd_search(args: argparse.Namespace) -> int:
    import warnings

    from ..hits import UnknownNamesWarning, abstained
    from ..postgres import recorded_spec
    from ..serve.held import current_pipeline

    spec = recorded_spec(args.dir)
    if spec:  # indexed into PostgreSQL: search the database, not the snapshot
        from .pg_store import open_postgres_service

        with open_postgres_service(spec, fast_queries=args.fast_queries) as service:
            query_hits = service.search(list(args.query), k=args.k, namespaces=args.namespace, min_score=None)
            unknown = service.unknown_namespaces(args.namespace)
    else:  # the directory as its server serves it: the snapshot and the writes journalled since
        scout = current_pipeline(args.dir, fast_queries=args.fast_queries)
        with warnings.catch_warnings():  # said below, in the command's words (and in --json)
            warnings.simplefilter("ignore", UnknownNamesWarning)
            query_hits = scout.search(list(args.query), k=args.k, namespaces=args.namespace)
        unknown = scout.unknown_namespaces(args.namespace)
    if unknown:  # a typo reads as a search that found nothing
        print(f"warning: no tool is in namespace {', '.join(map(repr, unknown))}", file=sys.stderr)
    if args.json:  # what POST /search says of each task (one list of unknown namespaces for them all)
        out = [{"query": q, "abstained": abstained(hits), "hits": [h.to_dict() for h in hits],
                "unknown_namespaces": unknown, **hits.degraded_dict(detail=True)}  # local: the error in full
               for q, hits in zip(args.query, query_hits)]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=2, ensure_ascii=False))
        return 0
    for query, hits in zip(args.query, query_hits):
        print_hits(query, hits)
    return 0


def print_hits(query: str, hits: Hits) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"[bold]{query}[/bold]", title_justify="left")
    for col in ("#", "score", "tool", "namespace", "description"):
        table.add_column(col, overflow="fold")
    for hit in hits:
        tool = hit.tool
        name = f"{tool.name}\n[dim]{tool.method} {tool.path}[/dim]" if tool.method else tool.name
        desc = tool.description if len(tool.description) <= 100 else tool.description[:97] + "..."
        table.add_row(str(hit.rank), f"{hit.score:.3f}", name, tool.namespace or "", desc)
    if not hits:
        table.add_row("", "", "(no matching tool)", "", "")
    Console().print(table)
    if hits.degraded is not None:  # the stderr warning covers the call; this line sits under the task it concerns
        print(degraded_line(hits.degraded))


def degraded_line(degraded) -> str:
    """The line under a task's table when a stage could not rank it (`results.Degraded`): the user runs the
    search locally, so the line has the stage's error in full."""
    return (f"note: the {degraded.stage} could not rank this task, so these are the first stage's hits: "
            f"{degraded.described}")


def cmd_demo(args: argparse.Namespace) -> int:
    from ..ingest import load_tools
    from ..pipeline import ToolScout
    from ..serve.held import replacing

    catalog = Path(__file__).resolve().parents[1] / "data" / "catalogs" / "apibank_sample"
    tools = load_tools(catalog)
    print(f"Indexing {len(tools)} tools from the bundled sample catalog ({catalog.name}) with {args.retriever}...")
    with replacing(args.out) as replacement:
        learned = _learned_to_keep(args, replacement)
        scout = ToolScout.from_tools(tools, retriever=args.retriever)
        _keep_learning(scout, learned, args.out)
        scout.save(args.out, extra_config=replacement.config, held_lock=replacement.lock_fd)
        replacement.saved()
    for task in EXAMPLE_TASKS:
        print_hits(task, scout.search(task, k=3))
    print(f"\nSaved the index to {args.out}. Search it again, or serve it over HTTP and MCP:\n"
          f"  toolscout search {args.out} \"cancel my doctor's appointment\" -k 5\n"
          f"  toolscout serve {args.out} --port 8080        # HTTP: POST /search, tool CRUD, /metrics\n"
          f"  toolscout serve {args.out} --mcp              # MCP server (stdio) with a search_tools tool")
    return 0
