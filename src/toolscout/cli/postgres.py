"""What the CLI does with a PostgreSQL store: `toolscout index ... --store postgresql://...`,
`toolscout search DIR` on a directory indexed that way, and `toolscout migrate [DIR] --store DSN`."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

from typing import TYPE_CHECKING

from .options import view_from_args

if TYPE_CHECKING:
    from ..tool import Tool

# The PostgreSQL modules (and the pipeline they build) are imported by the commands that use them: every
# `toolscout` command builds this module's parser, and a gateway or server that never touches PostgreSQL
# should not pay for importing it at start-up.


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("migrate", help="apply the PostgreSQL schema migrations; copy a local index directory in",
                       description="Bring the PostgreSQL store's schema up to date and, given DIR (a local index "
                                   "directory), make its catalog the tenant's catalog: tools, text views and vectors "
                                   "as they are, no re-embedding.")
    p.add_argument("dir", metavar="DIR", nargs="?", default=None, help="local index directory to copy in")
    p.add_argument("--store", required=True, metavar="DSN", help="postgresql://... (?tenant=T&table=NAME)")
    p.add_argument("--search", choices=["dense", "hybrid"], default=None,
                   help="how servers rank this catalog (default: hybrid for a hybrid index, else dense)")
    p.set_defaults(handler=migrate_command)


def index_into_postgres(args: argparse.Namespace, tools: Sequence[Tool]) -> int:
    """Make `tools` the tenant's catalog in the database (re-embedding only changed texts), then write
    `--out` as a pipeline directory that records the store (no password) and holds a snapshot of the
    catalog: `toolscout search/serve DIR` then work on the database."""
    from ..pipeline import ToolScout
    from ..postgres import index_catalog
    from ..retrievers.dense import DenseRetriever, encoder_for, trained_view, vector_hash
    from ..store.pg_catalog import PgCatalog
    from ..store.pgvector import PgSpec
    from ..tool import TextView, tool_text

    if args.retriever not in ("dense", "hybrid"):
        raise ValueError(f"--store postgresql://... indexes with --retriever dense or hybrid (BM25 + dense, in "
                         f"every replica), not {args.retriever!r}")
    if args.rerank:
        raise ValueError("--rerank is not supported with the PostgreSQL store yet")
    spec = PgSpec.parse(args.store)
    start = time.perf_counter()
    encoder = encoder_for(args.model)
    view = view_from_args(args) or trained_view(args.model) or TextView()
    catalog = PgCatalog.from_spec(spec, encoder.dim)
    try:
        report = index_catalog(catalog, tools, encoder, view, search=args.retriever, progress=True,
                               intents="default" if args.split_requests else None)  # default: the table's
        hashes = {t.id: vector_hash(t, view, tool_text(t, view), report.summary_weight) for t in tools}
        retriever = DenseRetriever(encoder=encoder, store=spec.to_string(), view=view,  # the DSN without password
                                   summary_weight=report.summary_weight, vectors=catalog.vectors, hashes=hashes)
        scout = ToolScout(retriever, list(tools), indexed=True)
        scout.save(args.out, extra_config={"postgres": spec.to_string()})
    finally:
        catalog.close()
    took = time.perf_counter() - start
    print(f"indexed {report.tools} tools ({report.embedded} embedded, the rest unchanged) into {spec} "
          f"version {report.version} in {took:.1f}s → {args.out}", file=sys.stderr)
    return 0


def open_postgres_service(spec: str, fast_queries: str | None = None):
    """The service on `spec` without background search threads (for one-off CLI searches)."""
    from ..serve.service import ToolService

    return ToolService.open(spec, batch_workers=0, fast_queries=fast_queries)


def migrate_command(args: argparse.Namespace) -> int:
    from ..postgres import migrate_directory
    from ..store.pg_config import set_search_mode
    from ..store.pgvector import PgSpec

    spec = PgSpec.parse(args.store)
    if args.dir is None:
        from ..store.pgvector import PgDatabase

        database = PgDatabase(spec.dsn, spec.table)
        try:
            database.dim  # connects and migrates (the table must exist: its dimension is not known here)
            if args.search:
                set_search_mode(database, args.search)
        finally:
            database.close()
        applied = ", ".join(map(str, database.migrated)) or "none (up to date)"
        print(f"{spec}: schema migrations applied: {applied}"
              + (f"; served with {args.search} search from the next server start" if args.search else ""),
              file=sys.stderr)
        return 0
    start = time.perf_counter()
    report = migrate_directory(args.dir, spec, search=args.search)
    print(f"migrated {report.tools} tools from {args.dir} into {spec} (version {report.version}) in "
          f"{time.perf_counter() - start:.1f}s", file=sys.stderr)
    return 0
