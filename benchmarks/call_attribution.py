"""How the gateway should attribute a forwarded call to a search: simulated agents on train splits only.

    python benchmarks/call_attribution.py [--data DIR] [--traffic 600] [--validation 300] [--json FILE]

For each dev set with a train split, its train queries are shuffled and carved in two: "traffic" tasks that
simulated agents work through, and "validation" tasks that score what the index learned (no test query is
read). The default pipeline indexes the set's tools. Agents work in sessions of two tasks, A then B, and
call exactly the gold tools of each task after searching (k=5); a share of the sessions plans ahead
(search A, search B, then the calls of A, then those of B), the rest work one task at a time. Each call
becomes feedback by the rule under test (`toolscout.gateway.attribution`):

- attribution: the share of calls attributed to the task the tool served, and to another task (a call
  attributed to none teaches nothing);
- nDCG@10 of the validation tasks after learning from the attributed calls, against no learning.

The figures, and the rule chosen from them, are in docs/gateway.md.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

from common import DEFAULT_DATA, load_sets

RULES = ("holding", "latest")
PLAN_AHEAD = (0.0, 0.25, 0.5)
K_SEARCH, K_EVAL = 5, 10


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DEFAULT_DATA))
    parser.add_argument("--traffic", type=int, default=600, help="traffic tasks per set (default %(default)s)")
    parser.add_argument("--validation", type=int, default=300, help="validation tasks per set (default %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    figures = {}
    for bench in load_sets(Path(args.data)):
        train = bench.split("train")
        if len(train) < 50:
            continue
        figures[bench.name] = simulate_set(bench, train, args)
        print(bench.name, json.dumps(figures[bench.name]), file=sys.stderr)
    figures["mean"] = mean_over_sets(figures)
    print(json.dumps(figures, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


def simulate_set(bench, train, args) -> dict:
    from toolscout import ToolScout

    rng = random.Random(args.seed)
    queries = rng.sample(train, len(train))
    validation = queries[: args.validation]
    traffic = queries[args.validation: args.validation + args.traffic]
    scout = ToolScout.from_tools(bench.tools)
    found = {q.text: [h.tool.id for h in scout.search(q.text, k=K_SEARCH)] for q in traffic}
    out = {"no_learning": ndcg(scout, validation)}
    for share in PLAN_AHEAD:
        sessions = make_sessions(traffic, share, random.Random(args.seed + 1))
        for rule in RULES:
            events, right, wrong = attribute(sessions, found, rule)
            source = f"{rule}-{share}"
            scout.learn([{"query": task, "tool_ids": [tool], "source": source} for task, tool in events])
            out[f"{rule}@plan{share}"] = {"precision": round(100 * right, 2), "wrong": round(100 * wrong, 2),
                                          "ndcg": ndcg(scout, validation)}
            scout.forget(source)  # back to the index before learning, exactly
    return out


def make_sessions(traffic, plan_share: float, rng: random.Random) -> list[list[tuple]]:
    """Sessions of two tasks: [("search", task) | ("call", task, tool)] steps, in the order an agent acts."""
    sessions = []
    for a, b in zip(traffic[0::2], traffic[1::2]):
        calls_a = [("call", a.text, t) for t in a.labels]
        calls_b = [("call", b.text, t) for t in b.labels]
        if rng.random() < plan_share:
            sessions.append([("search", a.text), ("search", b.text), *calls_a, *calls_b])
        else:
            sessions.append([("search", a.text), *calls_a, ("search", b.text), *calls_b])
    return sessions


def attribute(sessions, found: dict, rule: str) -> tuple[list[tuple[str, str]], float, float]:
    """(task, tool) feedback events by `rule`, the share of calls attributed to the task the tool served,
    and the share attributed to another task (the rest teach nothing)."""
    from toolscout.gateway.attribution import CallAttribution

    attribution = CallAttribution(rule)
    events, right, calls = [], 0, 0
    for i, steps in enumerate(sessions):
        session = f"session-{i}"
        for step in steps:
            if step[0] == "search":
                attribution.searched(session, step[1], found[step[1]])
                continue
            _kind, served, tool = step
            task = attribution.called(session, tool)
            calls += 1
            if task is not None:
                events.append((task, tool))
                right += task == served
    return events, right / max(1, calls), (len(events) - right) / max(1, calls)


def ndcg(scout, validation) -> float:
    from toolscout.eval.metrics import ndcg_at_k

    ranked = scout.search([q.text for q in validation], k=K_EVAL)
    return round(100 * sum(ndcg_at_k([h.tool.id for h in hits], q.labels, K_EVAL)
                           for hits, q in zip(ranked, validation)) / len(validation), 2)


def mean_over_sets(figures: dict) -> dict:
    sets = list(figures.values())
    out = {"no_learning": round(sum(s["no_learning"] for s in sets) / len(sets), 2)}
    for key in sets[0]:
        if key != "no_learning":
            out[key] = {m: round(sum(s[key][m] for s in sets) / len(sets), 2) for m in ("precision", "wrong", "ndcg")}
    return out


if __name__ == "__main__":
    sys.exit(main())
