"""What the CLI does with a PostgreSQL store: `toolscout index ... --store postgresql://...`,
`toolscout search DIR` on a directory indexed that way, and `toolscout migrate [DIR] --store DSN`."""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from ..serve.held import Replacement
    from ..tool import Tool

# The PostgreSQL modules (and the pipeline they build) are imported by the commands that use them: every
# `toolscout` command builds this module's parser, and a gateway or server that never touches PostgreSQL
# should not pay for importing it at start-up.


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("migrate", help="apply the PostgreSQL schema migrations; copy a local index directory in",
                       description="Bring the PostgreSQL store's schema up to date and, given DIR (a local index "
                                   "directory), make its catalog the tenant's catalog and its pipeline the table's: "
                                   "tools, text views and vectors as they are, no re-embedding; and teach the tenant "
                                   "what the directory learned, with its sources and times.")
    p.add_argument("dir", metavar="DIR", nargs="?", default=None, help="local index directory to copy in")
    p.add_argument("--store", required=True, metavar="DSN", help="postgresql://... (?tenant=T&table=NAME)")
    p.add_argument("--search", choices=["dense", "hybrid"], default=None,
                   help="switch the first stage servers rank with, for every tenant of the table: the dense "
                        "retriever alone, or a hybrid (the default hybrid of BM25 and dense, when it is not one "
                        "already: a hybrid switched to dense is not kept); default: DIR's, or the table's")
    p.set_defaults(handler=migrate_command)


def index_into_postgres(args: argparse.Namespace, tools: Sequence[Tool], replacement: "Replacement") -> int:
    """Make `tools` the tenant's catalog in the database (re-embedding only changed texts) and the pipeline
    the flags describe the table's (the one a local index of the same flags builds; refused, naming the
    setting, when the store cannot serve it), then write `--out` as a pipeline directory that points at
    the database: `ToolScout.load(DIR)`, `toolscout search/serve DIR` build that pipeline from it
    (`replacement`: `--out` held, as `serve.held.replacing` holds it)."""
    from ..pg_pipeline import check_servable
    from ..postgres import index_catalog, write_pointer
    from ..retrievers.base import encoding_parts
    from ..spec import PipelineSpec
    from ..store.pg_catalog import PgCatalog
    from ..store.pgvector import PgSpec
    from .options import pipeline_from_args

    if args.retriever not in ("dense", "hybrid"):  # refused before any model is loaded
        check_servable(PipelineSpec({"name": args.retriever, "settings": {}}), f"--retriever {args.retriever}")
    spec = PgSpec.parse(args.store)
    start = time.perf_counter()
    pipeline = pipeline_from_args(args, store="numpy")  # not indexed: its description, and its encoder
    check_servable(pipeline.spec)
    encoder = encoding_parts(pipeline.retriever)[0].encoder
    catalog = PgCatalog.from_spec(spec, encoder.dim)
    try:
        # a bar as for a directory: `cmd_index`'s progress_shown (none with --quiet, nor for a small catalog)
        report = index_catalog(catalog, tools, encoder, pipeline.spec)
    finally:
        catalog.close()
    # the pipeline the table serves: the flags', reading descriptions as the table does (`with_table_reading`)
    # the DSN without its password; `replacing` holds the directory's serve lock while it is rewritten
    write_pointer(args.out, spec, report.pipeline, report.tools, held_lock=replacement.lock_fd)
    replacement.saved()
    tell_what_went(spec, report)
    took = time.perf_counter() - start
    print(f"indexed {report.tools} tools ({report.counts()}) into {spec} "
          f"version {report.version} with {pipeline.retriever.name} in {took:.1f}s → {args.out}", file=sys.stderr)
    return 0


def tell_what_went(spec, report) -> None:
    """What replacing the tenant's catalog took away: the tools the new one leaves out, and with them what
    feedback had taught them (worded as a directory's replace words it)."""
    from ..feedback import learning_kept

    if report.removed:
        print(f"removed {report.removed} tool{'s' if report.removed != 1 else ''} of tenant {spec.tenant!r} that "
              "the new catalog leaves out, with their feedback", file=sys.stderr)
    if report.taught_kept or report.taught_dropped:
        print(learning_kept(spec, report.taught_kept, report.taught_dropped), file=sys.stderr)


# how a table's hybrid settings change: the CLI has no command that changes them in place
OTHER_HYBRID = ("no command changes a table's hybrid settings in place (an index with other ones is refused); to "
                "serve others, index its tenants' catalogs into a new table (?table=NAME) with --retriever hybrid "
                "-o weights=[A,B] -o fusion=rrf|max")


def tell_search_switch(table: str, switch) -> None:
    """What `migrate --search` changed (`switch`: `postgres.SearchSwitch`): the first stage before -> after, for
    which tenants, from when; and what a hybrid it made or let go was set to."""
    from ..spec import changes

    if not switch.changed:
        print(f"index table {table!r} serves {_stage(switch.after)} already: nothing changed", file=sys.stderr)
        return
    count = len(switch.tenants)
    names = ", ".join(switch.tenants[:10]) + (f", and {count - 10} more" if count > 10 else "")
    tenants = f"{count} tenant{'s' if count != 1 else ''}: {names}" if count else "no tenant has a catalog yet"
    print(f"first stage of index table {table!r}: {_stage(switch.before)} -> {_stage(switch.after)}, for every "
          f"tenant of the table ({tenants}), served by each server that "
          "starts from now on (a server already running ranks as it did until it is restarted: its /health says "
          "`restart_needed`)", file=sys.stderr)
    if switch.after["name"] == "hybrid":
        print(f"note: this hybrid has the default settings; {OTHER_HYBRID}", file=sys.stderr)
        return
    lost = changes(switch.before, switch.default_hybrid())
    if lost:
        told = ", ".join(f"{path.removeprefix('settings.')} {was!r} -> {then!r}" for path, was, then in lost)
        print(f"warning: the hybrid's settings are not kept: --search hybrid would switch to the default hybrid, "
              f"which differs ({told}); {OTHER_HYBRID}", file=sys.stderr)


def _stage(node: dict) -> str:
    """A first stage in brief: its name, and for a hybrid its components and fusion settings."""
    if not node.get("components"):
        return node["name"]
    parts = " + ".join(part["name"] for part in node["components"])
    return f"{node['name']} of {parts} ({_settings(node)})"


def _settings(node: dict) -> str:
    return ", ".join(f"{key}={value}" for key, value in sorted(node["settings"].items()))


def open_postgres_service(spec: str, fast_queries: str | None = None):
    """The service on `spec` without background search threads (for one-off CLI searches)."""
    from ..serve.service import ToolService

    return ToolService.open(spec, batch_workers=0, fast_queries=fast_queries)


def migrate_command(args: argparse.Namespace) -> int:
    from ..postgres import migrate_directory, migration_source, set_search_mode
    from ..serve.held import held_for_copy
    from ..store.pgvector import PgSpec

    spec = PgSpec.parse(args.store)
    if args.dir is None:
        from ..store.pgvector import PgDatabase

        database = PgDatabase(spec.dsn, spec.table)
        try:
            database.dim  # connects and migrates (the table must exist: its dimension is not known here)
            switch = set_search_mode(database, args.search) if args.search else None
        finally:
            database.close()
        applied = ", ".join(map(str, database.migrated)) or "none (up to date)"
        print(f"{spec}: schema migrations applied: {applied}", file=sys.stderr)
        if switch is not None:
            tell_search_switch(spec.table, switch)
        return 0
    start = time.perf_counter()
    migration_source(args.dir, args.search)  # refused before the directory is touched
    with held_for_copy(args.dir) as saved:
        if saved:
            print(f"{args.dir}: saved the {saved} write(s) its journal held (a server stopped without saving them) "
                  "into a new snapshot first", file=sys.stderr)
        report = migrate_directory(args.dir, spec, search=args.search)
    tell_what_went(spec, report)
    print(f"migrated {report.tools} tools and their pipeline from {args.dir} into {spec} (version {report.version}) "
          f"in {time.perf_counter() - start:.1f}s", file=sys.stderr)
    if report.feedback:
        _carry_feedback(args.dir, args.store, report)
    return 0


def _carry_feedback(folder, store: str, report) -> None:
    """Teach the tenant what the directory learned (a gateway keeps no log to import later): each (tool, source,
    request) it teaches, with its source and time, through the service as `toolscout learn --store` does, so
    `learn --forget SOURCE` and `learning rollback --before` work on it in the database as they did in the
    directory. Ranks taught so are scored afresh against the migrated catalog, oldest first."""
    from ..serve.limits import FeedbackLimits
    from ..serve.service import ToolService
    from ..store.pgvector import redact
    from .learn import import_events

    print(f"teaching {redact(store)} what {folder} learned: {len(report.feedback)} (tool, request) pairs from "
          f"{report.feedback_recorded} feedback events, with their sources and times", file=sys.stderr)
    settings = report.learning_settings
    service = ToolService.open(store, batch_workers=0, limits=FeedbackLimits(rate=None, volume=None))
    try:
        if settings.weights:  # an operator's weights hold in the tenant as they did in the directory
            service.set_learning(weights=settings.weights)
        import_events(service, report.feedback)
    finally:
        service.close()
    if settings.frozen_at is not None:  # a freeze cannot be dated back in the database: say what differs
        held = sum(1 for event in report.feedback if event.time is not None and event.time >= settings.frozen_at)
        since = datetime.fromtimestamp(settings.frozen_at, timezone.utc).isoformat(timespec="seconds")
        # the rollback time to the fraction: rounded, it would miss held pairs or take learned ones
        print(f"warning: learning in {folder} is frozen (since {since}), and the tenant's is "
              f"not: the {held} pair(s) the freeze held back are learned there; freeze it from now on with "
              f"toolscout learning freeze DSN, or take them back with toolscout learning rollback DSN --before "
              f"{settings.frozen_at!r}", file=sys.stderr)
