"""Scores an agent can trust, measured on the dev sets' test splits (docs/scores.md).

    python benchmarks/scores.py --json scores.json                 # all eight sets, about 25 minutes on two cores
    python benchmarks/scores.py --sets apibank,metatool --max-queries 200 --elsewhere 20   # a quick look

The default pipeline, each set's test tasks against its own catalog (names matching off, so every hit is
ranked), and three sections:

- calibration: every hit of the top 10 labelled by the task's gold tools; the expected calibration error of
  the hits' `probability` (10 equal bins) pooled over all sets and per set, of the top hit alone, and the
  reliability table. The calibration was fitted on train splits only (`scripts/build_calibration.py`);
  bfcl and gorilla_huggingface, never fitted on, say whether it holds on catalogs of other kinds.
- abstention, at the shipped threshold (on the chance that one of a search's best five hits is relevant,
  `toolscout.hits.abstains`): the share of tasks still answered against their own catalog and the recall@5
  kept, against the share of tasks abstained on when searched against another set's catalog
  (`--elsewhere` tasks of each set against each other set's: 56 pairs). Sets overlap in places (translation,
  weather, image captions...), so some of those tasks do have a fitting tool.
- deprecation: nDCG@10 (macro over the sets) with the rule that ranks a deprecated tool below its
  replacement and without it, and how many tools of the sets say they are deprecated and name a
  replacement the catalog has; then the same with a deprecated twin added for `--twin-share` of each
  catalog's tools (the tool's description plus "Deprecated: use <its id> instead."; the gold labels stay
  the originals), where the rule has something to act on.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import DEFAULT_DATA, DEV_SETS, machine_line, write_json

K = 10
ABSTAIN_K = 5  # the gateway's default k
NONSENSE = "qwxzv plork"


def sample(items: list, n: int | None, seed: int) -> list:
    return items if n is None or len(items) <= n else random.Random(seed).sample(items, n)


def searched(scout: Any, tasks: list[str], k: int) -> list[list[Any]]:
    out: list[list[Any]] = []
    for start in range(0, len(tasks), 64):
        out += scout.search(tasks[start:start + 64], k=k, match_names=False)
    return out


def calibration_section(scouts: dict, queries: dict) -> tuple[dict, dict]:
    """ECE and the reliability table of every hit's probability, and each set's hits (for the others)."""
    from toolscout.eval.calibration import expected_calibration_error, reliability_table

    hits_of, per_set, pooled_p, pooled_y = {}, {}, [], []
    for name, scout in scouts.items():
        hits = searched(scout, [q.text for q in queries[name]], K)
        hits_of[name] = hits
        p = [h.probability for row in hits for h in row]
        y = [float(h.tool.id in q.labels) for q, row in zip(queries[name], hits) for h in row]
        top_p = [row[0].probability for row in hits if row]
        top_y = [float(row[0].tool.id in q.labels) for q, row in zip(queries[name], hits) if row]
        per_set[name] = {"queries": len(hits), "hits": len(p), "ece": 100 * expected_calibration_error(p, y),
                         "ece_top1": 100 * expected_calibration_error(top_p, top_y),
                         "mean_probability": 100 * float(np.mean(p)), "relevant": 100 * float(np.mean(y)),
                         "mean_probability_top1": 100 * float(np.mean(top_p)), "relevant_top1": 100 * float(np.mean(top_y))}
        pooled_p += p
        pooled_y += y
        print(f"{name}: ECE {per_set[name]['ece']:.2f} (top hit {per_set[name]['ece_top1']:.2f})", file=sys.stderr)
    table = reliability_table(pooled_p, pooled_y)
    timing = probability_ms(scouts, queries)
    report = {"ece": 100 * expected_calibration_error(pooled_p, pooled_y),
              "ece_macro": float(np.mean([s["ece"] for s in per_set.values()])),
              "ece_top1_macro": float(np.mean([s["ece_top1"] for s in per_set.values()])),
              "hits": len(pooled_p), "queries": sum(s["queries"] for s in per_set.values()), "sets": per_set,
              "probability_ms_p50": timing,
              "reliability": [{**row, "predicted": _pct(row["predicted"]), "observed": _pct(row["observed"])}
                              for row in table]}
    return report, hits_of


def probability_ms(scouts: dict, queries: dict, n: int = 100) -> float:
    """Median milliseconds a search spends on its probabilities (features and model, over a ranking of
    DEPTH made just before, as a search does), over `n` tasks of each set."""
    from toolscout.query import Query
    from toolscout.relevance import DEPTH, features_of

    times = []
    for name, scout in scouts.items():
        for q in queries[name][:n]:
            task = [Query.of(q.text)]
            results = scout.retrieve(task, DEPTH)
            start = time.perf_counter()
            scout.calibration.probabilities(features_of(scout._dense, task, results)[0])
            times.append((time.perf_counter() - start) * 1000)
    return float(np.median(times))


def _pct(value: float | None) -> float | None:
    return None if value is None else 100 * value


def abstained(row: list, threshold: float) -> bool:
    """Whether a search with these hits (names matching off) abstains at `threshold`: the one policy,
    `toolscout.hits.abstains`, applied to them."""
    from toolscout.hits import HitPolicy, abstains

    return abstains([h.score for h in row], [h.probability for h in row], HitPolicy(len(row) or 1, None, threshold))


def abstention_section(scouts: dict, queries: dict, hits_of: dict, elsewhere: int, seed: int) -> dict:
    """At the shipped threshold: own-catalog tasks answered and recall@5 kept; other catalogs' abstained."""
    threshold = next(iter(scouts.values())).calibration.threshold
    own = {}
    for name, hits in hits_of.items():
        answered = [not abstained(row, threshold) for row in hits]
        recall = [len(set(q.labels) & {h.tool.id for h in row[:ABSTAIN_K]}) / len(q.labels)
                  for q, row in zip(queries[name], hits)]
        own[name] = {"answered": 100 * float(np.mean(answered)),
                     "recall@5": 100 * float(np.mean(recall)),
                     "recall@5_kept": 100 * float(np.mean([r * a for r, a in zip(recall, answered)]))}
    pairs: dict[str, dict[str, float]] = {}
    for name in scouts:
        tasks = [q.text for q in sample(queries[name], elsewhere, seed)]
        pairs[name] = {}
        for catalog, scout in scouts.items():
            if catalog != name:
                rows = searched(scout, tasks, ABSTAIN_K)
                pairs[name][catalog] = 100 * float(np.mean([abstained(row, threshold) for row in rows]))
        print(f"{name} elsewhere: {np.mean(list(pairs[name].values())):.1f}% abstained", file=sys.stderr)
    nonsense = {catalog: bool(scout.search(NONSENSE, k=ABSTAIN_K, min_probability="calibrated") == [])
                for catalog, scout in scouts.items()}
    return {"threshold": threshold, "k": ABSTAIN_K, "own": own,
            "own_answered_macro": float(np.mean([s["answered"] for s in own.values()])),
            "own_recall_macro": float(np.mean([s["recall@5"] for s in own.values()])),
            "own_recall_kept_macro": float(np.mean([s["recall@5_kept"] for s in own.values()])),
            "elsewhere_abstained_macro": float(np.mean([v for row in pairs.values() for v in row.values()])),
            "elsewhere_by_task_set": {name: float(np.mean(list(row.values()))) for name, row in pairs.items()},
            "elsewhere_pairs": pairs, "elsewhere_tasks_per_pair": elsewhere,
            "nonsense_abstained": sum(nonsense.values()), "nonsense_catalogs": len(nonsense)}


def ranked_ndcg(scout: Any, queries: list) -> float:
    """nDCG@10 (0-100) of `queries` (benchmark queries) through `scout`'s ranking."""
    from toolscout.eval.metrics import ndcg_at_k

    tasks = [q.text for q in queries]
    ranked = [list(ids) for start in range(0, len(tasks), 64) for ids in scout.retrieve(tasks[start:start + 64], K).ids]
    return 100 * float(np.mean([ndcg_at_k(r, q.labels, K) for r, q in zip(ranked, queries)]))


def with_and_without(scout: Any, queries: list) -> tuple[float, float]:
    """nDCG@10 with the deprecation rule and without it."""
    scout.demote_deprecated = False
    without = ranked_ndcg(scout, queries)
    scout.demote_deprecated = True
    return ranked_ndcg(scout, queries), without


def deprecated_twins(tools: list, share: float, seed: int) -> list:
    """For `share` of `tools` (sampled), an older twin: the same tool, named `NAME v1`, whose description
    adds that it is deprecated and names the tool (by id) as its replacement."""
    chosen = random.Random(seed).sample(tools, max(1, int(share * len(tools))))
    return [t.with_changes(id=f"{t.id}__v1", name=f"{t.name} v1", raw=None,
                           description=f"{(t.description or t.name).rstrip('.')}. Deprecated: use {t.id} instead.")
            for t in chosen]


def deprecation_section(scouts: dict, queries: dict, twin_share: float, seed: int) -> dict:
    """nDCG@10 per set with and without the deprecation rule, on the sets' catalogs as they are and with
    deprecated twins added for `twin_share` of their tools (the gold labels stay the originals)."""
    out = {}
    for name, scout in scouts.items():
        replacements = scout.replacements()
        row = {"deprecated_tools": len(replacements),
               "with_replacement_in_catalog": sum(r is not None for r in replacements.values())}
        row["ndcg@10_with_rule"], row["ndcg@10_without_rule"] = with_and_without(scout, queries[name])
        twins = deprecated_twins(scout.tools, twin_share, seed)
        scout.add(twins)
        try:
            row["twins"] = len(twins)
            row["twins_resolved"] = sum(r is not None for r in scout.replacements().values()) - \
                row["with_replacement_in_catalog"]
            row["twins_ndcg@10_with_rule"], row["twins_ndcg@10_without_rule"] = with_and_without(scout, queries[name])
        finally:
            scout.remove([t.id for t in twins])
        out[name] = row
        print(f"{name}: deprecation nDCG@10 {row['ndcg@10_with_rule']:.2f} / {row['ndcg@10_without_rule']:.2f}; "
              f"with twins {row['twins_ndcg@10_with_rule']:.2f} / {row['twins_ndcg@10_without_rule']:.2f}",
              file=sys.stderr)
    macro = {key: float(np.mean([row[key] for row in out.values()])) for key in
             ("ndcg@10_with_rule", "ndcg@10_without_rule", "twins_ndcg@10_with_rule", "twins_ndcg@10_without_rule")}
    return {"sets": out, **{f"{key}_macro": value for key, value in macro.items()}, "twin_share": twin_share,
            "deprecated_tools": sum(s["deprecated_tools"] for s in out.values()),
            "with_replacement_in_catalog": sum(s["with_replacement_in_catalog"] for s in out.values()),
            "twins": sum(s["twins"] for s in out.values()), "twins_resolved": sum(s["twins_resolved"] for s in out.values())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--sets", default=",".join(DEV_SETS))
    parser.add_argument("--max-queries", type=int, default=None, help="test tasks per set (sampled; default all)")
    parser.add_argument("--elsewhere", type=int, default=100,
                        help="test tasks of each set searched in each other set's catalog (default %(default)s)")
    parser.add_argument("--twin-share", type=float, default=0.1,
                        help="share of each catalog's tools given a deprecated twin (default %(default)s)")
    parser.add_argument("--sections", default="calibration,abstention,deprecation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(machine_line(), file=sys.stderr)

    from toolscout.benchmark_sets import load_benchmark
    from toolscout.pipeline import ToolScout
    from toolscout.retrievers.dense import encoder_for

    encoder = encoder_for(None)
    scouts, queries = {}, {}
    start = time.perf_counter()
    for name in [s for s in args.sets.split(",") if s]:
        bench = load_benchmark(args.data / name)
        scouts[name] = ToolScout.from_tools(bench.tools, encoder=encoder)
        queries[name] = sample(bench.split("test"), args.max_queries, args.seed)
        print(f"{name}: {len(bench.tools)} tools, {len(queries[name])} test tasks "
              f"({time.perf_counter() - start:.0f}s)", file=sys.stderr)
    if any(scout.calibration is None for scout in scouts.values()):
        raise SystemExit("the default pipeline has no calibration: run scripts/build_calibration.py first")
    sections = set(args.sections.split(","))
    report: dict[str, Any] = {"calibration_about": next(iter(scouts.values())).calibration.about}
    if sections & {"calibration", "abstention"}:
        report["calibration"], hits_of = calibration_section(scouts, queries)
        print(f"ECE {report['calibration']['ece']:.2f} pooled, {report['calibration']['ece_macro']:.2f} macro, top "
              f"hit {report['calibration']['ece_top1_macro']:.2f} macro", file=sys.stderr)
    if "abstention" in sections:
        report["abstention"] = abstention_section(scouts, queries, hits_of, args.elsewhere, args.seed)
    if "deprecation" in sections:
        report["deprecation"] = deprecation_section(scouts, queries, args.twin_share, args.seed)
    report["seconds"] = time.perf_counter() - start
    write_json(args.json, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
