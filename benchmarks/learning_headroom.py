"""How much could learning gain without crowding out? A bound, computed with the answers in hand.

    python benchmarks/learning_headroom.py [--sets apibank,bfcl,...] [--tune] [--json out.json]

The same halves, events and learning as `learning_safety.py` (its `plan`). For every scored task the
nearest taught request (the evidence every lift starts from) is put in a cell: its similarity to the task
(bins of 0.1) and where the untaught ranking put the best ranked of its tools (1, 2-3, 4-10, 11-30,
further or absent). Then two oracles choose, per set and cell, between the untaught ranking and that
request's tools moved to the top, knowing every scored task's gold tools:

- "best cells" lifts in every cell where lifting gains nDCG@10 summed over the cell's tasks: what the
  nearest request's evidence is worth when crowding out is allowed;
- "safe cells" lifts only where it also costs no task whose gold tools nobody taught anything: the most
  that evidence can give while untaught tasks keep their ranking.

No deployment knows the answers, so no method that decides from these two features does better than
the oracles on the same events (one that places tools more finely than "the top" can, on some sets);
`learning now` is measured beside them, on the same index.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from common import machine_line, write_json
from learning_safety import BATCH, K, load_benchmark, plan, plan_arguments

RANK_GROUPS = (1, 3, 10, 30)  # upper rank of each group; past the last (or absent): a group of its own
SIM_BIN = 0.1
GROUPS = ("all", "taught", "untaught")
RUNS = ("now", "best cells", "safe cells")


def main(argv=None) -> int:
    parser = plan_arguments(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    sets = {}
    for name in args.sets.split(","):
        sets[name] = measure(args.data / name, args)
        print(f"{name}: " + "; ".join(f"{run} " + ", ".join(f"{g} {row['before']:.1f} -> {row[run]:.1f}"
                                                        for g, row in sets[name].items() if row)
                                      for run in RUNS), file=sys.stderr, flush=True)
    out = {"machine": machine_line(), "split": "train halves" if args.tune else "test halves", "sets": sets,
           "macro": macro(sets)}
    for run in RUNS:
        print(f"{run}: " + "; ".join(f"{g} {m['change'][run]:+.2f} ({m['sets']} sets)" for g, m in out["macro"].items()))
    write_json(args.json, out)
    return 0


def measure(folder: Path, args) -> dict:
    """Per group: nDCG@10 untaught ("before"), as learned now, and under each oracle."""
    from toolscout import ToolScout
    from toolscout.eval.metrics import ndcg_at_k

    bench = load_benchmark(folder)
    p = plan(bench, args)
    catalog = [t for t in bench.tools if t.id not in p["new"]]
    scout, untaught = ToolScout.from_tools(catalog), ToolScout.from_tools(catalog)
    scored = [q for q in p["scored"] if not set(q.labels) & p["new"]]
    texts = [q.text for q in scored]
    base = untaught.retrieve(texts, RANK_GROUPS[-1]).ids  # before learning, as learning_safety's first point
    for at in range(0, len(p["events"]), BATCH):
        scout.learn(p["events"][at:at + BATCH])
    now = scout.retrieve(texts, K).ids
    channel = scout.learning
    nearest = channel.nearest(texts)
    taught = {t for e in p["events"] for t in e["tool_ids"]}
    rows = []
    for q, ids, learned, tools in zip(scored, base, now, nearest):
        ids = list(ids)
        kind = "taught" if set(q.labels) <= taught else "untaught" if not set(q.labels) & taught else None
        cell, lifted = _cell(ids, tools)
        rows.append({"kind": kind, "cell": cell, "before": ndcg_at_k(ids, q.labels, K),
                     "now": ndcg_at_k(list(learned), q.labels, K), "lifted": ndcg_at_k(lifted, q.labels, K)})
    return _oracles(rows)


def _cell(ids: list[str], tools: list[tuple[str, float, float]]) -> tuple[tuple[int, int] | None, list[str]]:
    """The task's cell and its ranking with the nearest taught request's tools on top (None, untaught: no
    request taught anything)."""
    if not tools:
        return None, ids
    top = tools[0][1]
    first = [tool for tool, similarity, _when in tools if similarity >= top]  # one request's tools tie
    ranks = [ids.index(t) + 1 for t in first if t in ids]
    group = next((i for i, edge in enumerate(RANK_GROUPS) if ranks and min(ranks) <= edge), len(RANK_GROUPS))
    return (min(int(top / SIM_BIN), int(1 / SIM_BIN) - 1), group), first + [t for t in ids if t not in first]


def _oracles(rows: list[dict]) -> dict:
    """Choose the cells each oracle lifts in, then score every group."""
    gain, untaught_loss = defaultdict(float), defaultdict(float)
    for row in rows:
        if row["cell"] is not None:
            gain[row["cell"]] += row["lifted"] - row["before"]
            if row["kind"] == "untaught":
                untaught_loss[row["cell"]] += min(0.0, row["lifted"] - row["before"])
    lifts = {"best cells": {c for c, g in gain.items() if g > 0},
             "safe cells": {c for c, g in gain.items() if g > 0 and untaught_loss[c] == 0}}
    out = {}
    for group in GROUPS:
        chosen = [r for r in rows if group == "all" or r["kind"] == group]
        if not chosen:
            out[group] = None
            continue
        out[group] = {"tasks": len(chosen), "before": _mean([r["before"] for r in chosen]),
                      "now": _mean([r["now"] for r in chosen])}
        for run, cells in lifts.items():
            out[group][run] = _mean([r["lifted"] if r["cell"] in cells else r["before"] for r in chosen])
    return out


def _mean(values: list[float]) -> float:
    return round(100 * float(np.mean(values)), 2)


def macro(sets: dict) -> dict:
    """Per group, over the sets where it has tasks: the mean untaught nDCG@10 and each run's mean change."""
    out = {}
    for group in GROUPS:
        rows = [s[group] for s in sets.values() if s[group]]
        out[group] = {"sets": len(rows), "before": round(float(np.mean([r["before"] for r in rows])), 2),
                      "change": {run: round(float(np.mean([r[run] - r["before"] for r in rows])), 2) for run in RUNS}}
    return out


if __name__ == "__main__":
    sys.exit(main())
