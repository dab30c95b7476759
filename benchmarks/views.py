"""Compare text views for BM25 and dense retrieval on validation queries carved from train splits.

A text view decides which parts of a tool (name, description, parameters, tags, ...) the retrievers
index. Choosing it on test queries would tune on the test set, so this script scores each candidate
view on up to `--queries` train-split queries per set (untrained retrievers never see them), each set
against its own catalog, and prints nDCG@10 per set and the macro mean.

    python benchmarks/views.py                      # every set under ../shared/data that has a train split
    python benchmarks/views.py --data DIR --queries 300 --retriever dense --json out.json
    python benchmarks/views.py --retriever dense --view default --summary-weight 0 --summary-weight 0.5

`--summary-weight W` (repeatable) scores the dense retriever's blend of each view with the short
name + description summary (`DenseRetriever(summary_weight=W)`); without it, dense uses its default.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from common import DEFAULT_DATA, load_sets

from toolscout.eval.metrics import ndcg_at_k
from toolscout.tool import TextView

VIEWS = {
    "default": TextView(),
    "raw-name": TextView(raw_name=True),
    "category": TextView(category=True),
    "raw-name+category": TextView(raw_name=True, category=True),
    "no-parameters": TextView(parameters=False),
    "no-tags": TextView(tags=False),
    "name+description": TextView(parameters=False, tags=False, profile_fields=()),
    "descriptions-as-written": TextView(descriptions="as-written"),
}


def validation_queries(benchmark, n: int, seed: int):
    train = benchmark.split("train")
    return random.Random(seed).sample(train, min(n, len(train)))


def score_view(retriever_name: str, view: TextView, benchmark, queries, encoder, summary_weight=None) -> float:
    from toolscout.retrievers.bm25 import BM25Retriever
    from toolscout.retrievers.dense import DenseRetriever

    retriever = (BM25Retriever(view=view) if retriever_name == "bm25"
                 else DenseRetriever(view=view, encoder=encoder, summary_weight=summary_weight))
    retriever.index(benchmark.tools)
    ranked = retriever.search([q.text for q in queries], k=10).as_lists()
    return 100.0 * sum(ndcg_at_k(r, q.labels, 10) for r, q in zip(ranked, queries)) / len(queries)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--queries", type=int, default=400, help="train-split queries per set (default 400)")
    ap.add_argument("--retriever", action="append", choices=("bm25", "dense"),
                    help="retrievers to score (repeatable; default both)")
    ap.add_argument("--view", action="append", choices=sorted(VIEWS), help="views to score (default all)")
    ap.add_argument("--summary-weight", type=float, action="append",
                    help="dense: score this summary weight (repeatable; default: the retriever's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write the table as JSON")
    args = ap.parse_args(argv)
    retrievers = args.retriever or ["bm25", "dense"]
    views = args.view or list(VIEWS)

    sets = [s for s in load_sets(args.data) if s.split("train")]
    if not sets:
        raise SystemExit(f"no set under {args.data} has a train split to validate on")
    encoder = None
    if "dense" in retrievers:
        from toolscout.encoders import Encoder

        encoder = Encoder.load(None)
    table: dict = {}
    for retriever_name in retrievers:
        weights = (args.summary_weight or [None]) if retriever_name == "dense" else [None]
        for view_name in views:
            for weight in weights:
                row = {}
                for benchmark in sets:
                    queries = validation_queries(benchmark, args.queries, args.seed)
                    row[benchmark.name] = score_view(retriever_name, VIEWS[view_name], benchmark, queries, encoder,
                                                     weight)
                row["macro"] = sum(row.values()) / len(row)
                label = view_name if weight is None else f"{view_name} +{weight:g} summary"
                table[f"{retriever_name} / {label}"] = row
                print(f"{retriever_name:>5} / {label:<17}" + "".join(f" {k} {v:6.2f}" for k, v in row.items()),
                      flush=True)
    if args.json:
        args.json.write_text(json.dumps(table, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
