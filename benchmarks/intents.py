"""Multi-request tasks: retrieval with and without intent splitting (`toolscout.intents`), per set.

    python benchmarks/intents.py --split validation                   # choose the merge (train-split carve)
    python benchmarks/intents.py --split test --variant none --variant max   # report the chosen one

`--split validation` scores the queries carved from each set's train split for validation (the same
10% hash carve the trainers hold out: `toolscout.train.data.in_validation`), so a merge is chosen
without looking at test queries. Sets: the multi-tool ones by default (toollens, sealtools, rotbench,
apibank); add single-tool sets (bfcl, gorilla_huggingface, gorilla_torchhub, metatool) to check that
they lose nothing. Prints nDCG@10, Recall@10 and Completeness@10 per set and macro, the share of queries
split into several requests, and writes JSON with --json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from common import DEFAULT_DATA, machine_line, write_json

MULTI_TOOL = ("toollens", "sealtools", "rotbench", "apibank")
VARIANTS = {
    "none": None,
    "max": {"merge": "max", "late_chunk": True},
    "max-w0.9": {"merge": "max", "intent_weight": 0.9, "late_chunk": True},
    "max-w0.8": {"merge": "max", "intent_weight": 0.8, "late_chunk": True},
    "max-w0.7": {"merge": "max", "intent_weight": 0.7, "late_chunk": True},
    "max-w0.5": {"merge": "max", "intent_weight": 0.5, "late_chunk": True},
    "max-w0.7-alone": {"merge": "max", "intent_weight": 0.7, "late_chunk": False},  # each request encoded alone
    "rrf": {"merge": "rrf", "rrf_k": 60, "intent_weight": 1.0},
    "rrf-w0.5": {"merge": "rrf", "rrf_k": 60, "intent_weight": 0.5},
    "rrf-k10": {"merge": "rrf", "rrf_k": 10, "intent_weight": 1.0},
}


def query_sets(data: Path, names: list[str], split: str, fraction: float = 0.1):
    """The sets with the queries of `split`; "validation" is carved from the train split."""
    from toolscout.benchmark_sets import BenchmarkSet, Query, load_benchmark
    from toolscout.train.data import in_validation

    out = []
    for name in names:
        bench = load_benchmark(data / name)
        if split == "validation":
            queries = [Query(q.id, q.text, q.labels, "validation") for q in bench.split("train")
                       if in_validation(bench.name, q.id, fraction)]
        else:
            queries = bench.split(split)
        out.append(BenchmarkSet(bench.name, bench.tools, queries, bench.path))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--sets", default=",".join(MULTI_TOOL))
    parser.add_argument("--split", default="validation", choices=["validation", "test"])
    parser.add_argument("--retriever", default=None, help="default: toolscout's default first stage")
    parser.add_argument("--model", default=None)
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS), default=None)
    parser.add_argument("--max-queries", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from toolscout.defaults import DEFAULT_RETRIEVER
    from toolscout.eval import evaluate, format_table
    from toolscout.intents import IntentMerge
    from toolscout.pipeline import ToolScout
    from toolscout.retrievers.base import retriever_class
    from toolscout.retrievers.dense import encoder_for

    print(machine_line(), file=sys.stderr)
    retriever = args.retriever or DEFAULT_RETRIEVER
    options = {"encoder": encoder_for(args.model)} if retriever_class(retriever).accepts.encoder else {}
    sets = query_sets(args.data, [s for s in args.sets.split(",") if s], args.split)
    for bench in sets:
        queries = bench.split(args.split)
        split = sum(len(IntentMerge().splitter(q.text)) > 1 for q in queries)
        print(f"{bench.name}: {len(queries)} {args.split} queries, {split} ({100 * split / max(1, len(queries)):.1f}%) "
              "split into several requests", file=sys.stderr)
    built: dict[int, ToolScout] = {}  # one index per set, shared by every variant (only the merge differs)

    def scout_for(tools, merge):
        key = id(tools)
        if key not in built:
            built[key] = ToolScout.from_tools(tools, retriever=retriever, intents=None, **options)
        return ToolScout(built[key].retriever, tools, indexed=True, intents=merge)

    reports = []
    for name in args.variant or ["none", "max", "rrf"]:
        merge = IntentMerge.from_dict(VARIANTS[name])
        reports.append(evaluate(sets, lambda tools, m=merge: scout_for(tools, m), k=10, split=args.split,
                                name=name, progress=False, max_queries=args.max_queries))
    print(format_table(reports, metrics=["ndcg@10", "recall@10", "completeness@10"]))
    write_json(args.json, {"split": args.split, "retriever": retriever, "model": args.model,
                           "systems": {r.name: r.to_json() for r in reports}})
    return 0


if __name__ == "__main__":
    sys.exit(main())
