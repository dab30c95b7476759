"""Fit the relevance calibration the default pipeline ships with: a release step, which writes package data.

    python scripts/build_calibration.py --data ../shared/data        # about 3 minutes on two cores

Writes `src/toolscout/data/calibration/toolscout-tools.json` (`toolscout.relevance.Calibration`): the
logistic model that turns a ranking's features into each hit's probability of being a tool the task
needs, and the abstention threshold. Train splits only, of the six dev sets that are not kept for
zero-shot checks (bfcl and gorilla_huggingface are never fitted on, not even as catalogs):

- each set's train-split tasks (at most `--per-set`, sampled) ranked against its own catalog, every hit of
  the top `toolscout.relevance.DEPTH` labelled by the task's gold tools;
- tasks no tool fits: for every ordered pair of sets, `--elsewhere` of one set's tasks ranked against the
  other set's catalog, every hit labelled irrelevant. They weigh `--no-match-share` of the fit (the
  probabilities assume about that share of tasks has no tool in the catalog);
- the threshold, on what a search abstains on (the chance that one of its best five hits is relevant,
  `toolscout.hits.abstains`): the highest that keeps `--keep` of recall@k (k = `-k`, the gateway's
  default) of the train tasks against their own catalogs (macro over sets).

Rebuild it after changing the default pipeline (encoder, fusion) or `toolscout.relevance.FEATURES`; the
test splits are read only by `benchmarks/scores.py`, which reports how well it holds there.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import numpy as np

TRAIN_SETS = ("apibank", "gorilla_torchhub", "metatool", "rotbench", "sealtools", "toollens")
ZERO_SHOT = ("bfcl", "gorilla_huggingface")  # never fitted on
DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def sample(items: list, n: int, seed: int) -> list:
    return items if len(items) <= n else random.Random(seed).sample(items, n)


def ranked_rows(scout, queries, labels_of) -> list[tuple[np.ndarray, np.ndarray, float]]:
    """(features, labels, recall@k later) per query: each query's top DEPTH ranking through `scout`."""
    from toolscout.query import Query
    from toolscout.relevance import DEPTH, dense_part, features_of

    out, part = [], dense_part(scout.retriever)
    for start in range(0, len(queries), 64):
        batch = queries[start:start + 64]
        tasks = [Query.of(q.text) for q in batch]
        results = scout.retrieve(tasks, DEPTH)
        for q, rows, (ids, _scores) in zip(batch, features_of(part, tasks, results), results):
            gold = set(labels_of(q))
            out.append((rows, np.array([tid in gold for tid in ids], dtype=np.float64), len(gold)))
    return out


def collect(folder: Path, sets: list[str], per_set: int, elsewhere: int, seed: int):
    """Ranked rows of each set's own tasks (by set) and of tasks against other sets' catalogs."""
    from toolscout.benchmark_sets import load_benchmark
    from toolscout.pipeline import ToolScout
    from toolscout.retrievers.dense import encoder_for

    encoder = encoder_for(None)
    benches = {name: load_benchmark(folder / name) for name in sets}
    scouts, tasks = {}, {}
    start = time.perf_counter()
    for name, bench in benches.items():
        scouts[name] = ToolScout.from_tools(bench.tools, encoder=encoder)
        tasks[name] = sample(bench.split("train"), per_set, seed)
        print(f"{name}: {len(bench.tools)} tools, {len(tasks[name])} train tasks ({time.perf_counter() - start:.0f}s)",
              file=sys.stderr)
    own = {name: ranked_rows(scouts[name], tasks[name], lambda q: q.labels) for name in sets}
    other = []
    for name in sets:
        for catalog in sets:
            if catalog != name:
                other += ranked_rows(scouts[catalog], sample(tasks[name], elsewhere, seed + 1), lambda q: ())
        print(f"{name}: ranked ({time.perf_counter() - start:.0f}s)", file=sys.stderr)
    return scouts[sets[0]], own, other


def fit(own: dict, other: list, no_match_share: float):
    """The logistic model over every hit, tasks no tool fits weighing `no_match_share` of the whole."""
    from toolscout.eval.calibration import LogisticModel
    from toolscout.relevance import FEATURES

    own_rows = [row for rows in own.values() for row in rows]
    x = np.vstack([f for f, _y, _n in own_rows + other])
    y = np.concatenate([labels for _f, labels, _n in own_rows + other])
    n_own, n_other = len(own_rows), len(other)
    weight_other = no_match_share / (1 - no_match_share) * n_own / max(1, n_other)
    weights = np.concatenate([np.full(len(labels), 1.0 if i < n_own else weight_other)
                              for i, (_f, labels, _n) in enumerate(own_rows + other)])
    return LogisticModel.fit(FEATURES, x, y, weights), weight_other


def threshold_for(model, own: dict, k: int, keep: float) -> float:
    """The highest threshold on what a search abstains on (the chance that one of its best
    `hits.ABSTAIN_DEPTH` is relevant) keeping `keep` of macro recall@k on the sets' own tasks."""
    from toolscout.eval.calibration import AbstentionCase, any_relevant, choose_threshold
    from toolscout.hits import ABSTAIN_DEPTH
    from toolscout.relevance import Calibration

    probe = Calibration(model, 0.0, {}, {})
    cases = [AbstentionCase(name, any_relevant(probe.probabilities(f)[:ABSTAIN_DEPTH]), float(labels[:k].sum() / n))
             for name, rows in own.items() for f, labels, n in rows if len(labels) and n]
    return choose_threshold(cases, keep)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the dev sets' folder (default %(default)s)")
    parser.add_argument("--sets", default=",".join(TRAIN_SETS), help="comma-separated sets (default: the six)")
    parser.add_argument("--per-set", type=int, default=800, help="train tasks per set (default %(default)s)")
    parser.add_argument("--elsewhere", type=int, default=60,
                        help="tasks of each set ranked against each other set's catalog (default %(default)s)")
    parser.add_argument("--no-match-share", type=float, default=0.1, help="(default %(default)s)")
    parser.add_argument("--keep", type=float, default=0.98,
                        help="share of recall@k to keep (default %(default)s: an agent left with nothing for a task a "
                             "tool serves loses more than one shown weak tools with low probabilities)")
    parser.add_argument("-k", type=int, default=5, help="(default %(default)s: the gateway's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="default: the packaged calibration")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    if set(sets) & set(ZERO_SHOT):
        parser.error(f"{', '.join(sorted(set(sets) & set(ZERO_SHOT)))}: kept for zero-shot checks, never fitted on")

    from toolscout.artifacts import write_json
    from toolscout.relevance import CALIBRATION_DIR, Calibration, signature

    scout, own, other = collect(args.data, sets, args.per_set, args.elsewhere, args.seed)
    model, weight_other = fit(own, other, args.no_match_share)
    threshold = threshold_for(model, own, args.k, args.keep)
    about = {"fitted_on": {name: len(rows) for name, rows in own.items()}, "elsewhere_tasks": len(other),
             "elsewhere_weight": round(weight_other, 6), "no_match_share": args.no_match_share,
             "threshold_rule": f"on the chance that one of the best five hits is relevant: the highest keeping "
                               f"{args.keep:.0%} of macro recall@{args.k} of train tasks against their own catalogs",
             "command": "python scripts/build_calibration.py --data ../shared/data", "seed": args.seed}
    calibration = Calibration(model, round(threshold, 6), signature(scout.spec), about)
    out = args.out or CALIBRATION_DIR / "toolscout-tools.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out, calibration.to_dict())
    print(json.dumps({"threshold": threshold, "weights": dict(zip(model.features, model.weights))}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
