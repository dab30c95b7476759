"""Calibrate a score threshold (`toolscout serve --min-score`) for one retriever on benchmark sets.

    python benchmarks/abstain.py ../shared/data/{apibank,metatool,rotbench,sealtools,toollens} \\
        --retriever dense -k 5 --json abstain.json

For the default pipeline, prefer its calibrated probabilities (`--min-probability`, docs/scores.md): a
probability means the same on every catalog, and the gateway abstains on it by default. A score threshold
belongs to one retriever + model + summary weight; this finds one for pipelines without a calibration.

Protocol (per set; one global threshold):
- *normal* queries: the set's queries against its whole catalog;
- *no-match* queries: the same queries against the catalog with their own gold tools removed (a filter
  that excludes them: for the dense retriever exactly the same as deleting them), so no tool fits.
The threshold gates on the best retrieved score: below it, the search returns nothing. It is chosen on
train-split queries as the highest threshold that keeps at least `--keep` (default 0.95) of the
recall@k on normal queries (`toolscout.eval.calibration.choose_threshold`), and reported on test-split
queries: the share of no-match queries answered with nothing, and recall@k on normal queries with and
without abstention. Tool and query embeddings are cached under `--cache` so reruns are quick.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from common import CachingEncoder


def score_set(bench: Any, scout: Any, queries: Sequence[Any], k: int) -> list:
    """One `AbstentionCase` per query: its best score and recall@k against the catalog, and its best score
    with its gold tools removed."""
    from toolscout.eval.calibration import AbstentionCase
    from toolscout.results import Filter

    full = scout.retrieve([q.text for q in queries], k)
    out = []
    for q, (ids, scores) in zip(queries, full):
        gold = set(q.labels)
        recall = len(gold & set(ids)) / len(gold) if gold else 0.0
        removed = scout.retrieve([q.text], 1, Filter.make(exclude_ids=gold))
        top_removed = float(removed.scores[0][0]) if len(removed.scores[0]) else float("-inf")
        out.append(AbstentionCase(bench.name, float(scores[0]) if len(scores) else float("-inf"), recall, top_removed))
    return out


def _sample(queries: list, n: int | None, seed: int) -> list:
    if n is None or len(queries) <= n:
        return queries
    return random.Random(seed).sample(queries, n)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sets", nargs="+", metavar="SET_DIR")
    parser.add_argument("--retriever", default="dense")
    parser.add_argument("--model", default=None)
    parser.add_argument("-k", type=int, default=5)
    parser.add_argument("--keep", type=float, default=0.95, help="share of train recall@k to keep (default %(default)s)")
    parser.add_argument("--max-train", type=int, default=400, help="train queries per set (sampled; default %(default)s)")
    parser.add_argument("--max-test", type=int, default=500, help="test queries per set (sampled; default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache", default="/tmp/toolscout-embeddings", help="embedding cache folder")
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    from toolscout.benchmark_sets import load_benchmark
    from toolscout.eval.calibration import abstention, choose_threshold
    from toolscout.pipeline import ToolScout

    options: dict[str, Any] = {}
    cache = None
    if args.retriever == "dense":
        from toolscout.encoders import Encoder

        cache = CachingEncoder(Encoder.load(args.model), args.cache)
        options = {"encoder": cache}
    train, test = [], []
    start = time.perf_counter()
    for folder in args.sets:
        bench = load_benchmark(folder)
        train_queries = _sample(bench.split("train"), args.max_train, args.seed)
        test_queries = _sample(bench.split("test"), args.max_test, args.seed)
        if not train_queries or not test_queries:
            print(f"{bench.name}: skipped (needs train and test queries)", file=sys.stderr)
            continue
        scout = ToolScout.from_tools(bench.tools, retriever=args.retriever, **options)
        train += score_set(bench, scout, train_queries, args.k)
        test += score_set(bench, scout, test_queries, args.k)
        if cache is not None:
            cache.flush()
        print(f"{bench.name}: {len(bench.tools)} tools, {len(train_queries)} train / {len(test_queries)} test "
              f"queries ({time.perf_counter() - start:.0f}s)", file=sys.stderr)
    threshold = choose_threshold(train, args.keep)
    report: dict[str, Any] = {"retriever": args.retriever, "k": args.k, "keep": args.keep, "threshold": threshold,
                              "train": abstention(train, threshold), "test": abstention(test, threshold),
                              "test_sets": {name: abstention([c for c in test if c.set == name], threshold)
                                            for name in sorted({c.set for c in test})}}
    sets = list(report["test_sets"].values())
    report["test_macro"] = {key: float(np.mean([s[key] for s in sets])) for key in sets[0] if key != "queries"}
    report["curve_test"] = {f"{t:.3f}": abstention(test, t) for t in np.linspace(threshold - 0.15, threshold + 0.15, 7)}
    _print(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def _print(report: dict[str, Any]) -> None:
    print(f"threshold (top-1 {report['retriever']} score, chosen on train to keep {report['keep']:.0%} of "
          f"recall@{report['k']}): {report['threshold']:.4f}")
    print(f"{'':22} {'queries':>7} {'no-match abstained':>19} {'recall@k kept':>14} {'recall@k no abst.':>18}")
    lines = [("train (all sets)", report["train"]), ("test (all sets)", report["test"])]
    lines += [(f"  test {name}", row) for name, row in report["test_sets"].items()]
    for label, row in lines:
        print(f"{label:22} {row['queries']:7d} {row['nomatch_abstained']:18.1f}% {row['recall']:13.1f}% "
              f"{row['recall_without_abstention']:17.1f}%")
    macro = report["test_macro"]
    print(f"{'test macro (sets)':22} {'':7} {macro['nomatch_abstained']:18.1f}% {macro['recall']:13.1f}% "
          f"{macro['recall_without_abstention']:17.1f}%")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
