"""Command line: `toolscout index | search | eval | train | expand | generate | serve | demo` (DESIGN §6;
scripts depend on these flags).

Environment variables are read here, once, and passed down as arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from .errors import ToolScoutError

EXAMPLE_TASKS = (
    "I need to see a doctor next week, can you book me an appointment?",
    "What's on my schedule for tomorrow?",
    "Remind me to buy milk at 6pm",
)


def _add_retriever_options(p: argparse.ArgumentParser, default: str = "dense") -> None:
    p.add_argument("--retriever", default=default,
                   help="first-stage retriever name (bm25, dense, ...); default %(default)s")
    p.add_argument("--model", default=None, help="encoder name or path for dense retrievers (default all-MiniLM-L6-v2)")
    p.add_argument("--store", default="numpy",
                   help="vector store for dense retrievers: numpy (exact) or faiss:FACTORY, e.g. faiss:HNSW32, "
                        "or a PostgreSQL DSN postgresql://... (pgvector; docs/postgres.md)")


def _add_rerank_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rerank", default=None, metavar="DIR",
                   help="second stage: a `toolscout train cross|refiner` directory, or llm:CONFIG.yaml for the LLM "
                        "reranker (an OpenAI-compatible endpoint, settings as for `expand --llm-config`)")
    p.add_argument("--rerank-depth", type=int, default=None, metavar="N",
                   help="first-stage candidates handed to the reranker (default: the reranker's own, 20 unless trained otherwise)")
    p.add_argument("--rerank-option", action="append", default=[], metavar="KEY=VALUE",
                   help="reranker setting, VALUE parsed as JSON when it can be (repeatable), e.g. "
                        "first_stage_weight=0 for a cross-encoder's own order")


def build_parser() -> argparse.ArgumentParser:
    from .expand.cli import add_expand_parser
    from .expand.views import add_view_options
    from .generate.cli import add_generate_parser

    parser = argparse.ArgumentParser(prog="toolscout", description="Pick the right tools for an LLM agent.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("index", help="index one or more tool catalogs into a pipeline directory")
    p.add_argument("catalogs", nargs="+", metavar="CATALOG",
                   help="catalog files: OpenAI/Anthropic tools, MCP tools/list, OpenAPI, Python module, benchmark JSONL")
    p.add_argument("--out", required=True, help="pipeline directory to write (replaced atomically)")
    p.add_argument("--format", default=None, help="catalog format, when detection is not wanted")
    p.add_argument("--namespace", default=None, help="namespace for the tools of a single catalog")
    p.add_argument("--lenient", action="store_true", help="skip and report malformed tools instead of failing")
    _add_rerank_options(p)
    _add_retriever_options(p)
    add_view_options(p)

    p = sub.add_parser("search", help="search a pipeline directory with a task")
    p.add_argument("dir", metavar="DIR")
    p.add_argument("query", metavar="TASK", nargs="+", help="the task in plain language (several: one search each)")
    p.add_argument("-k", type=int, default=5, help="number of tools to return (default %(default)s)")
    p.add_argument("--namespace", action="append", default=None, help="only tools in this namespace (repeatable)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")

    p = sub.add_parser("eval", help="evaluate retrievers on benchmark folders")
    p.add_argument("sets", nargs="+", metavar="SET_DIR", help="benchmark folders (tools.jsonl + queries.jsonl)")
    p.add_argument("--retriever", action="append", default=None,
                   help="retriever to evaluate; repeat to compare several (default dense)")
    p.add_argument("--model", default=None, help="encoder name or path for dense retrievers")
    p.add_argument("--store", default="numpy", help="vector store for dense retrievers")
    _add_rerank_options(p)
    p.add_argument("--also-k", default="", metavar="K,K",
                   help="also report the metrics at these smaller cut-offs, e.g. 5 (from the same rankings)")
    p.add_argument("--with-first-stage", action="store_true",
                   help="with --rerank: also evaluate each first stage alone, and compare the two (paired bootstrap)")
    p.add_argument("-k", type=int, default=10, help="cut-off for the metrics (default %(default)s)")
    p.add_argument("--pooled", action="store_true", help="search the union of all sets' tools")
    p.add_argument("--split", default="test", help="query split to evaluate (default %(default)s)")
    p.add_argument("--max-queries", type=int, default=None, help="evaluate at most N queries per set")
    p.add_argument("--per-category", action="store_true", help="also print metrics per tool category")
    p.add_argument("--json", default=None, metavar="FILE", help="write metrics and latency as JSON")
    p.add_argument("--plot", default=None, metavar="FILE.png", help="bar chart comparing the systems")
    p.add_argument("--bootstrap", type=int, default=10000, metavar="N",
                   help="paired-bootstrap resamples when comparing systems (default %(default)s)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    add_view_options(p)

    p = sub.add_parser("train", help="train a retriever or reranker on benchmark folders' train splits")
    p.add_argument("method", metavar="METHOD", help="what to train: tool2vec, mlc, toolclip, embed, ...")
    p.add_argument("--data", nargs="+", required=True, metavar="SET_DIR", help="benchmark folders to train on")
    p.add_argument("--out", required=True, help="model directory to write")
    p.add_argument("--model", default=None,
                   help="base encoder name or path (default all-MiniLM-L6-v2), or a model directory that an "
                        "earlier `train` of the same method (toolclip, embed, cross) wrote, to continue training it")
    p.add_argument("--epochs", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--max-steps", type=int, default=None, help="stop after N optimiser steps")
    p.add_argument("--eval-every", type=int, default=None, help="validate every N steps (default: each epoch)")
    p.add_argument("--patience", type=int, default=None, help="validations without improvement before stopping")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--validation-fraction", type=float, default=0.1,
                   help="share of train queries held out for validation (default %(default)s)")
    p.add_argument("--no-resume", action="store_true", help="ignore a checkpoint left by an interrupted run")
    p.add_argument("--option", "-o", action="append", default=[], metavar="KEY=VALUE",
                   help="method-specific option, VALUE parsed as JSON when it can be (repeatable)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")

    add_expand_parser(sub)
    add_generate_parser(sub)

    p = sub.add_parser("demo", help="index the bundled sample catalog and answer example tasks")
    p.add_argument("--out", default="toolscout-demo-index", help="where to write the demo index")
    p.add_argument("--retriever", default="dense")

    from .serve.cli import add_serve_parser  # argparse only; server dependencies load in cmd_serve

    add_serve_parser(sub)

    p = sub.add_parser("migrate", help="apply the PostgreSQL schema migrations; copy a local index directory in",
                       description="Bring the PostgreSQL store's schema up to date and, given DIR (a local index "
                                   "directory), make its catalog the tenant's catalog: tools, text views and vectors "
                                   "as they are, no re-embedding.")
    p.add_argument("dir", metavar="DIR", nargs="?", default=None, help="local index directory to copy in")
    p.add_argument("--store", required=True, metavar="DSN", help="postgresql://... (?tenant=T&table=NAME)")
    p.add_argument("--search", choices=["dense", "hybrid"], default=None,
                   help="how servers rank this catalog (default: hybrid for a hybrid index, else dense)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.version:
        from . import __version__

        print(__version__)
        return 0
    if not args.command:
        parser.print_help()
        return 2
    from .expand.cli import cmd_expand
    from .generate.cli import cmd_generate

    handler = {"index": cmd_index, "search": cmd_search, "eval": cmd_eval, "train": cmd_train,
               "demo": cmd_demo, "expand": cmd_expand, "generate": cmd_generate, "serve": cmd_serve,
               "migrate": cmd_migrate}[args.command]
    try:
        return handler(args) or 0
    except (ToolScoutError, ValueError, KeyError, FileNotFoundError, OSError) as exc:
        message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"toolscout {args.command}: error: {message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"toolscout {args.command}: interrupted", file=sys.stderr)
        return 130


def _view_option(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """{"view": TextView} when --profile-fields / --usage were given (for retrievers that index a text view)."""
    import inspect

    from .expand.views import view_from_args
    from .retrievers.base import retriever_class

    view = view_from_args(args)
    if view is None:
        return {}
    if "view" not in inspect.signature(retriever_class(name)).parameters:
        raise ValueError(f"--profile-fields / --usage: the {name} retriever does not index a text view")
    return {"view": view}


def _retriever_options(args: argparse.Namespace, name: str) -> dict[str, Any]:
    """Constructor options the CLI flags mean for retriever `name`."""
    extra = _view_option(args, name)
    if name == "bm25":
        return extra
    options: dict[str, Any] = {"model": args.model, **extra}
    if name in ("dense", "tool2vec", "hybrid", "toolclip"):
        options["store"] = args.store
    return options


def _reranker_from_args(args: argparse.Namespace):
    """The reranker --rerank names (None without it); --rerank-depth overrides its depth."""
    if args.rerank_depth is not None and args.rerank_depth < 1:
        raise ValueError(f"--rerank-depth must be at least 1, got {args.rerank_depth}")
    if not args.rerank:
        if args.rerank_depth is not None or args.rerank_option:
            raise ValueError("--rerank-depth and --rerank-option need --rerank")
        return None
    options = _parse_options(args.rerank_option, flag="--rerank-option")
    if args.rerank_depth is not None:
        options["depth"] = args.rerank_depth
    try:
        if args.rerank.startswith("llm:"):
            from .rerank.llm import LLMReranker

            return LLMReranker.from_settings_file(args.rerank[4:], **options)
        from .rerank.base import load_reranker

        return load_reranker(args.rerank, **options)
    except TypeError as exc:  # an option the reranker does not take: name it, not a Python signature
        if "unexpected keyword argument" not in str(exc):
            raise
        name = str(exc).rsplit("argument", 1)[-1].strip(" '")
        raise ValueError(f"--rerank-option {name}: not a setting of the reranker {args.rerank}") from None


# ----------------------------------------------------------------------------------- commands
def cmd_index(args: argparse.Namespace) -> int:
    from .ingest import LoadReport, load_tools
    from .pipeline import ToolScout

    if args.namespace and len(args.catalogs) > 1:
        raise ValueError("--namespace applies to a single catalog; index catalogs one namespace at a time")
    tools = []
    for catalog in args.catalogs:
        report = LoadReport()
        loaded = load_tools(catalog, format=args.format, lenient=args.lenient, namespace=args.namespace, report=report)
        for position, message in report.skipped:
            print(f"warning: {catalog}: skipped {position}: {message}", file=sys.stderr)
        print(f"{catalog}: {len(loaded)} tools ({report.format})", file=sys.stderr)
        tools.extend(loaded)
    tools = _qualify_across_catalogs(tools)
    if args.store.startswith(("postgresql://", "postgres://")):  # the shared PostgreSQL index
        from .store.pg_cli import index_into_postgres

        return index_into_postgres(args, tools)
    start = time.perf_counter()
    scout = ToolScout.from_tools(tools, retriever=args.retriever, reranker=_reranker_from_args(args),
                                 **_retriever_options(args, args.retriever))
    scout.save(args.out)
    took = time.perf_counter() - start
    print(f"indexed {len(scout)} tools with {args.retriever} in {took:.1f}s → {args.out}", file=sys.stderr)
    return 0


def _qualify_across_catalogs(tools: list) -> list:
    """Two catalogs may each hold a tool with the same id: fail clearly rather than drop one."""
    seen: dict[str, Any] = {}
    for tool in tools:
        if tool.id in seen:
            raise ValueError(f"tool id {tool.id!r} appears in two catalogs; give each catalog its own --namespace "
                             "(index them in separate runs) or rename one")
        seen[tool.id] = tool
    return tools


def cmd_search(args: argparse.Namespace) -> int:
    from .pipeline import ToolScout

    from .store.pg_catalog import recorded_spec

    if recorded_spec(args.dir):  # indexed into PostgreSQL: search the database, not the snapshot
        from .store.pg_cli import open_postgres_service

        with open_postgres_service(recorded_spec(args.dir)) as service:
            query_hits = service.search(list(args.query), k=args.k, namespaces=args.namespace, min_score=None)
    else:
        query_hits = ToolScout.load(args.dir).search(list(args.query), k=args.k, namespaces=args.namespace)
    if args.json:
        out = [{"query": q, "hits": [h.to_dict() for h in hits]} for q, hits in zip(args.query, query_hits)]
        print(json.dumps(out[0] if len(out) == 1 else out, indent=2, ensure_ascii=False))
        return 0
    for query, hits in zip(args.query, query_hits):
        _print_hits(query, hits)
    return 0


def _print_hits(query: str, hits: list) -> None:
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


def _model_for(model: str | None, retriever: str) -> str | None:
    """--model for one of several compared retrievers: a trained model directory goes only to the
    retriever its method trains (an `embed` dir to the encoder-based dense and hybrid); the others use
    their defaults. A plain encoder name or folder goes to every encoder-based retriever."""
    from .models import model_config

    trained = model_config(model)
    if trained is None:
        return model
    method = trained[1].get("method")
    wants = {"dense": "embed", "hybrid": "embed"}.get(retriever, retriever)
    return model if method == wants else None


def cmd_eval(args: argparse.Namespace) -> int:
    from .benchmark import load_benchmark
    from .eval import evaluate, format_table, paired_bootstrap, plot_reports
    from .pipeline import ToolScout

    reranker = _reranker_from_args(args)
    sets = [load_benchmark(s) for s in args.sets]
    names = args.retriever or ["dense"]
    encoder = None
    dense_model = _model_for(args.model, "dense")
    if args.model and not any(_model_for(args.model, name) for name in names):
        from .models import model_config

        method = model_config(args.model)[1].get("method")
        raise ValueError(f"--model {args.model} is a {method!r} model; evaluate it with --retriever {method}")
    if {"dense", "hybrid"} & set(names):  # load the encoder once, reuse it for every set
        from .retrievers.dense import encoder_for

        encoder = encoder_for(dense_model)  # a name, a folder, or a `toolscout train embed` directory
    reports = []
    for name in names:
        options = _retriever_options(argparse.Namespace(**{**vars(args), "model": _model_for(args.model, name)}), name)
        if name in ("dense", "hybrid"):
            from .retrievers.dense import trained_view

            view = _view_option(args, name) or ({"view": trained_view(dense_model)} if trained_view(dense_model) else {})
            options = {"encoder": encoder, "store": args.store, **view}

        stages = [None, reranker] if reranker is not None and args.with_first_stage else [reranker]
        for second in stages:
            def factory(tools, name=name, options=options, second=second):
                return ToolScout.from_tools(tools, retriever=name, reranker=second, **options)

            label = f"{name}+{second.name}@{second.depth}" if second is not None else name
            reports.append(evaluate(sets, factory, k=args.k, split=args.split, pooled=args.pooled, name=label,
                                    progress=not args.quiet, max_queries=args.max_queries,
                                    also_at=[int(c) for c in args.also_k.split(",") if c.strip()]))
    print(format_table(reports, per_category=args.per_category))
    comparisons = []
    for other in reports[1:]:
        result = paired_bootstrap(reports[0], other, metric=f"ndcg@{args.k}", n_resamples=args.bootstrap)
        comparisons.append({"a": reports[0].name, "b": other.name, **result.to_dict()})
        print(f"{other.name} vs {reports[0].name}: {result}")
    if args.json:
        data = reports[0].to_json() if len(reports) == 1 else {
            "systems": {r.name: r.to_json() for r in reports}, "comparisons": comparisons}
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    if args.plot:
        plot_reports(reports, args.plot, metric=f"ndcg@{args.k}")
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


def _parse_options(pairs: Sequence[str], flag: str = "--option") -> dict[str, Any]:
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"{flag} {pair!r}: expected KEY=VALUE")
        try:
            options[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            options[key.replace("-", "_")] = value
    return options


def cmd_train(args: argparse.Namespace) -> int:
    from .train import TrainConfig, load_training_data, trainer_for

    fit = trainer_for(args.method)
    data = load_training_data(args.data, validation_fraction=args.validation_fraction)
    print(f"training {args.method} on {', '.join(data.sets)}: {len(data.train)} train and "
          f"{len(data.validation)} validation queries, {len(data.tools)} tools", file=sys.stderr)
    overrides = {key: getattr(args, key) for key in ("epochs", "batch_size", "lr", "max_steps", "eval_every",
                                                     "patience", "seed", "device")
                 if getattr(args, key) is not None}
    config = TrainConfig(progress=not args.quiet, **overrides)
    options = _parse_options(args.option)
    if args.no_resume:
        options["resume"] = False
    summary = fit(data, args.out, model=args.model, config=config, **options)
    best = "n/a" if summary.best_validation is None else f"{summary.best_validation:.2f}"
    print(f"trained {args.method} in {summary.time_s:.1f}s ({summary.examples} examples, "
          f"{summary.examples_per_s:.1f}/s); best validation nDCG@10 {best} → {args.out}", file=sys.stderr)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from .serve.cli import cmd_serve as serve

    return serve(args)


def cmd_migrate(args: argparse.Namespace) -> int:
    from .store.pg_cli import migrate_command

    return migrate_command(args)


def cmd_demo(args: argparse.Namespace) -> int:
    from .ingest import load_tools
    from .pipeline import ToolScout

    catalog = Path(__file__).parent / "data" / "catalogs" / "apibank_sample"
    tools = load_tools(catalog)
    print(f"Indexing {len(tools)} tools from the bundled sample catalog ({catalog.name}) with {args.retriever}...")
    scout = ToolScout.from_tools(tools, retriever=args.retriever)
    scout.save(args.out)
    for task in EXAMPLE_TASKS:
        _print_hits(task, scout.search(task, k=3))
    print(f"\nSaved the index to {args.out}. Search it again, or serve it over HTTP and MCP:\n"
          f"  toolscout search {args.out} \"cancel my doctor's appointment\" -k 5\n"
          f"  toolscout serve {args.out} --port 8080        # HTTP: POST /search, tool CRUD, /metrics\n"
          f"  toolscout serve {args.out} --mcp              # MCP server (stdio) with a search_tools tool")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
