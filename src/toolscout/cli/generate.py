"""`toolscout generate CATALOG --n N --out SET_DIR`: synthetic labelled queries in the benchmark format."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .options import add_llm_options, llm_settings, wants_llm


def add_parsers(sub: Any) -> None:
    p = sub.add_parser("generate", help="generate labelled training queries for a catalog with an LLM (ToolBank)",
                       description="Sample --sample-size tools, let the LLM pick 2–5 that fit one task and write the "
                                   "request, polish it, reject invalid picks and near duplicates. Output: a benchmark "
                                   "folder (tools.jsonl + queries.jsonl, split train) for toolscout train / eval.")
    p.add_argument("catalog", metavar="CATALOG", help="any catalog toolscout reads")
    p.add_argument("--n", type=int, required=True, help="number of queries to generate")
    p.add_argument("--out", required=True, metavar="SET_DIR", help="benchmark folder to write")
    p.add_argument("--format", default=None, help="catalog format, when detection is not wanted")
    p.add_argument("--lenient", action="store_true", help="skip malformed tools instead of failing")
    add_llm_options(p)
    g = p.add_argument_group("generation")
    g.add_argument("--sample-size", type=int, default=10, help="tools shown per attempt, T (default %(default)s)")
    g.add_argument("--min-tools", type=int, default=2, help="fewest tools per query (default %(default)s)")
    g.add_argument("--max-tools", type=int, default=5, help="most tools per query (default %(default)s)")
    g.add_argument("--examples", type=int, default=3, help="earlier accepted queries shown as examples (default %(default)s)")
    g.add_argument("--no-polish", action="store_true", help="skip the polish pass")
    g.add_argument("--polish-model", default=None, metavar="NAME", help="model for the polish pass (default --model)")
    g.add_argument("--dedupe-threshold", type=float, default=0.7,
                   help="character-trigram Jaccard at which two queries are near duplicates (default %(default)s)")
    g.add_argument("--max-attempts", type=int, default=None, help="stop after this many attempts (default 3n+10)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--test-fraction", type=float, default=0.0,
                   help="share of generated queries put in a test split (default 0: all train)")
    g.add_argument("--max-tokens", type=int, default=None, help="cap on reply tokens per call")
    p.add_argument("--report", default=None, metavar="FILE.json", help="also write the run report here")
    p.add_argument("--quiet", action="store_true", help="no progress (bar or lines)")
    p.set_defaults(handler=cmd_generate)


def cmd_generate(args: argparse.Namespace) -> int:
    from ..expand.catalog import (atomic_write_text, check_output, is_folder_output, jsonl_text, read_catalog,
                                  write_catalog, write_reports)
    from ..generate.pipeline import GenerateConfig, generate_queries
    from ..llm import LLMError

    if not is_folder_output(args.out):
        raise ValueError(f"--out {args.out}: give a folder; generation writes tools.jsonl and queries.jsonl into it")
    if not wants_llm(args):
        raise ValueError("generate needs an LLM: --base-url and --model, or --llm-config")
    check_output(args.out, (Path(args.out) / "generate_report.json", Path(args.out) / "generation.jsonl"),
                 "toolscout generate")
    settings = llm_settings(args)
    config = GenerateConfig(n=args.n, sample_size=args.sample_size, min_tools=args.min_tools, max_tools=args.max_tools,
                            examples=args.examples, polish=not args.no_polish, polish_model=args.polish_model,
                            dedupe_threshold=args.dedupe_threshold, max_attempts=args.max_attempts, seed=args.seed,
                            test_fraction=args.test_fraction, max_tokens=args.max_tokens,
                            **({"temperature": settings.temperature} if settings.temperature is not None else {}))
    catalog = read_catalog(args.catalog, format=args.format, lenient=args.lenient)
    print(f"{args.catalog}: {len(catalog.tools)} tools; generating {args.n} queries with {settings.model} "
          f"at {settings.base_url}", file=sys.stderr)
    with settings.client() as client:
        result = generate_queries(catalog.tools, client, config, progress=not args.quiet)
    failure = result.report.nothing_usable()
    out = Path(args.out)
    report = {"catalog": str(args.catalog), "model": settings.model, "config": _config_dict(config),
              **result.report.to_dict()}
    # an empty queries.jsonl is no benchmark: a run with no query writes nothing in OUT, only --report
    report_files = [p for p in (None if failure else out / "generate_report.json",
                                Path(args.report) if args.report else None) if p is not None]
    print(result.report.format(str(report_files[0]) if report_files else None), file=sys.stderr)
    if failure:
        write_reports(report_files, report)
        raise LLMError(f"{failure}; nothing written to {args.out}")
    write_catalog(out, catalog.tools, catalog, queries=result.queries)
    atomic_write_text(out / "generation.jsonl", jsonl_text(
        {"id": q.id, "query": q.text, "draft": d.draft, "labels": list(q.labels), "picked": list(d.names)}
        for q, d in zip(result.queries, result.details)))
    write_reports(report_files, report)
    print(f"wrote {len(result.queries)} queries and {len(catalog.tools)} tools → {out}", file=sys.stderr)
    failure = result.report.mostly_failed()
    if failure:  # written first: what succeeded is kept, and the exit status tells a script to rerun
        raise LLMError(failure)
    if len(result.queries) < args.n:
        print(f"warning: only {len(result.queries)} of {args.n} queries after {result.report.attempts} attempts "
              "(raise --max-attempts, or see the rejection counts above)", file=sys.stderr)
    return 0


def _config_dict(config: Any) -> dict[str, Any]:
    return {k: getattr(config, k) for k in config.__dataclass_fields__}
