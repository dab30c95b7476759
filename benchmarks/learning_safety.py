"""Is learning from use safe to leave on? Taught tasks gain; untaught tasks and tools added after learning keep
the untaught ranking; no point of the learning curve falls below it.

    python benchmarks/learning_safety.py [--sets apibank,bfcl,...] [--split test] [--baseline-src OLD/src] \
        [--json out.json]

For each set, its tasks (the split's queries) are shuffled and halved: one half is traffic, the other is
scored. Some tools that only scored tasks need (`--new-tools`, a share of the catalog) are kept out of the
catalog while it learns and added afterwards. Traffic arrives skewed, as real traffic does: events draw
traffic tasks with Zipf weights (rank^-1, ranks in a random order), so a few tasks repeat hundreds of times,
each event from one of `--agents` sources; there are twice as many events as traffic tasks (at most 20,000).
The index learns them through `ToolScout.learn` in batches of 50, as a server takes them through /feedback.
`--coverage 0.3` keeps only the traffic tasks whose tools all lie in a random 30% of the catalog: a deployment
whose agents use part of it, where most scored tasks need tools no event taught.

Scored, nDCG@10: all tasks before and after; tasks whose gold tools were all taught ("taught"), none taught
("untaught"); then, the new tools added to both, the tasks needing one ("new tools") and the taught tasks
again ("taught, new tools joined"), each against an untaught index that grew the same way; the learning curve after 0 / 100 / 1,000 / all events (all scored tasks, the tools added after
learning left out). bfcl is the set where most tools serve one task.

`--baseline-src DIR` runs the same measurement, with the same events, on another toolscout's source tree
(e.g. a checkout of the commit before learning became a channel of its own) in a child process, and prints
both side by side. `--tune` runs on the train split's halves instead (tuning data, never the test split).
`--cost` measures learning's cost instead: search latency with 0 and 100,000 feedback events, memory per
100,000 events and feedback events per second.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from common import DEFAULT_DATA, DEV_SETS, machine_line, percentile, write_json

K = 10
POINTS = (0, 100, 1000)
BATCH = 50


def plan_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options `plan` reads (and the data and sets), shared with the scripts that replay its plan."""
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--sets", default=",".join(DEV_SETS))
    parser.add_argument("--tune", action="store_true", help="the train split's halves (tuning), not the test split")
    parser.add_argument("--max-scored", type=int, default=800, help="scored tasks per set at most")
    parser.add_argument("--new-tools", type=float, default=0.05, help="share of the catalog added after learning")
    parser.add_argument("--agents", type=int, default=20, help="feedback sources the events come from")
    parser.add_argument("--coverage", type=float, default=1.0,
                        help="share of the catalog's tools the traffic asks for (1: any; 0.3: traffic tasks only "
                             "of a random 30%% of the tools, as a deployment whose agents use part of it)")
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main(argv=None) -> int:
    parser = plan_arguments(argparse.ArgumentParser(description=__doc__.split("\n\n")[0]))
    parser.add_argument("--baseline-src", type=Path, default=None,
                        help="another toolscout source tree to measure beside this one (its src/ folder)")
    parser.add_argument("--cost", action="store_true", help="measure learning's cost instead (see the doc)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.cost:
        return cost_report(args)
    if args.worker:
        print(json.dumps({name: measure(args.data / name, args) for name in args.sets.split(",")}))
        return 0
    runs = {"now": run_worker(args, None)}
    if args.baseline_src:
        runs["baseline"] = run_worker(args, args.baseline_src)
    out = {"machine": machine_line(), "split": "train halves" if args.tune else "test halves", "runs": runs,
           "macro": {name: macro(sets) for name, sets in runs.items()}}
    print_table(out)
    write_json(args.json, out)
    return 0


def run_worker(args, src: Path | None) -> dict:
    """This script as a child process, on `src` (None: this checkout's toolscout)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = f"{Path(src).resolve()}{os.pathsep}{env.get('PYTHONPATH', '')}"
    command = [sys.executable, __file__, "--worker", "--data", str(args.data), "--sets", args.sets,
               "--max-scored", str(args.max_scored), "--new-tools", str(args.new_tools), "--agents", str(args.agents),
               "--coverage", str(args.coverage), "--seed", str(args.seed)] + (["--tune"] if args.tune else [])
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    sys.stderr.write(done.stderr)
    if done.returncode:
        raise SystemExit(f"the measurement on {src or 'this checkout'} failed (exit {done.returncode})")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------ one set

def plan(bench, args) -> dict:
    """Traffic and scored tasks, the tools added after learning, and the events (deterministic)."""
    rng = random.Random(args.seed)
    pool = bench.split("train" if args.tune else "test")
    pool = rng.sample(pool, len(pool))
    half = len(pool) // 2
    traffic, scored = pool[:half], pool[half:][: args.max_scored]
    if args.coverage < 1.0:  # traffic of tasks whose tools all lie in a random share of the catalog
        tool_ids = sorted(t.id for t in bench.tools)
        covered = set(rng.sample(tool_ids, int(args.coverage * len(tool_ids))))
        traffic = [q for q in traffic if set(q.labels) <= covered]
    in_traffic = {t for q in traffic for t in q.labels}
    only_scored = sorted({t for q in scored for t in q.labels} - in_traffic)
    new = set(rng.sample(only_scored, min(len(only_scored), int(args.new_tools * len(bench.tools)))))
    if not traffic:  # no traffic task's tools lie in the covered share (bfcl's train half at 0.3)
        return {"traffic": traffic, "scored": scored, "new": new, "events": []}
    order = list(range(len(traffic)))
    rng.shuffle(order)
    weights = np.asarray([1.0 / (rank + 1) for rank in range(len(traffic))])
    picks = np.random.default_rng(args.seed).choice(len(traffic), size=min(2 * len(traffic), 20_000),
                                                    p=weights / weights.sum())
    events = [{"query": traffic[order[p]].text, "tool_ids": list(traffic[order[p]].labels),
               "source": f"agent-{i % args.agents}"} for i, p in enumerate(picks)]
    return {"traffic": traffic, "scored": scored, "new": new, "events": events}


def load_benchmark(folder: Path):
    """A benchmark folder, read by whichever toolscout runs this (a baseline may predate the module's name)."""
    try:
        from toolscout.benchmark_sets import load_benchmark as load
    except ModuleNotFoundError:  # toolscout before benchmark.py became benchmark_sets.py (a019de5)
        from toolscout.benchmark import load_benchmark as load
    return load(folder)


def measure(folder: Path, args) -> dict:
    from toolscout import ToolScout

    bench = load_benchmark(folder)
    p = plan(bench, args)
    if not p["events"]:
        return {"skipped": "no traffic tasks in this split (at this coverage)"}
    start = time.perf_counter()
    scout = ToolScout.from_tools([t for t in bench.tools if t.id not in p["new"]])
    scored = [q for q in p["scored"] if not set(q.labels) & p["new"]]
    with_new = [q for q in p["scored"] if set(q.labels) & p["new"]]
    curve, done = {}, 0
    for point in [x for x in POINTS if x < len(p["events"])] + [len(p["events"])]:
        for at in range(done, point, BATCH):
            scout.learn(p["events"][at:min(at + BATCH, point)])
        done = point
        curve[str(point)] = ndcg(scout, scored)
    taught_tools = {t for e in p["events"] for t in e["tool_ids"]}
    groups = {"all": scored, "taught": [q for q in scored if set(q.labels) <= taught_tools],
              "untaught": [q for q in scored if not set(q.labels) & taught_tools]}
    untaught = ToolScout.from_tools([t for t in bench.tools if t.id not in p["new"]])
    out = {"events": len(p["events"]), "traffic_tasks": len(p["traffic"]), "new_tools": len(p["new"]),
           "curve": curve}
    for name, queries in groups.items():
        out[name] = {"tasks": len(queries), "before": curve["0"] if name == "all" else ndcg(untaught, queries),
                     "after": curve[str(len(p["events"]))] if name == "all" else ndcg(scout, queries)}
    added = [t for t in bench.tools if t.id in p["new"]]  # tools that join after learning
    scout.add(added)
    untaught.add(added)  # the same catalog, grown the same way (ties break by the order tools joined)
    out["new tools"] = {"tasks": len(with_new), "before": ndcg(untaught, with_new), "after": ndcg(scout, with_new)}
    out["taught, new tools joined"] = {"tasks": len(groups["taught"]), "before": ndcg(untaught, groups["taught"]),
                                       "after": ndcg(scout, groups["taught"])}
    out["seconds"] = round(time.perf_counter() - start, 1)
    print(f"{bench.name}: {json.dumps(out)}", file=sys.stderr, flush=True)
    return out


def ndcg(scout, queries) -> float | None:
    from toolscout.eval.metrics import ndcg_at_k

    if not queries:
        return None
    ranked = scout.retrieve([q.text for q in queries], K).ids
    return round(100 * sum(ndcg_at_k(list(ids), q.labels, K) for ids, q in zip(ranked, queries)) / len(queries), 2)


# ------------------------------------------------------------------------------------ report

GROUPS = ("all", "taught", "untaught", "new tools", "taught, new tools joined")


def macro(sets: dict) -> dict:
    """Per group, the mean over sets of before, after and change (sets where the group has tasks)."""
    out = {}
    for group in GROUPS:
        rows = [s[group] for s in sets.values() if "skipped" not in s and s[group]["tasks"]]
        if rows:
            out[group] = {"sets": len(rows), "before": round(float(np.mean([r["before"] for r in rows])), 2),
                          "after": round(float(np.mean([r["after"] for r in rows])), 2),
                          "change": round(float(np.mean([r["after"] - r["before"] for r in rows])), 2)}
    curves = [s["curve"] for s in sets.values() if "skipped" not in s]
    out["worst curve point below untaught"] = round(min(min(v - c["0"] for v in c.values()) for c in curves), 2)
    return out


def print_table(out: dict) -> None:
    names = list(out["runs"])
    print(f"\nnDCG@10 before -> after, {out['split']} ({out['machine']})\n")
    print("| set | events | " + " | ".join(f"{g} ({n})" for n in names for g in GROUPS) + " | curve 0/100/1,000/all |")
    print("|---" * (2 + len(GROUPS) * len(names) + 1) + "|")
    first = out["runs"][names[0]]
    for name in first:
        if "skipped" in first[name]:
            continue
        cells = [f"{first[name]['events']}"]
        for run in names:
            row = out["runs"][run][name]
            cells += [_cell(row[g]) for g in GROUPS]
        cells.append(" / ".join(f"{v:.1f}" for v in first[name]["curve"].values()))
        print(f"| {name} | " + " | ".join(cells) + " |")
    for run in names:
        print(f"\n{run}: " + "; ".join(f"{g} {m['before']:.2f} -> {m['after']:.2f} ({m['change']:+.2f}, {m['sets']} sets)"
                                      for g, m in out["macro"][run].items() if isinstance(m, dict))
              + f"; worst curve point {out['macro'][run]['worst curve point below untaught']:+.2f}")


def _cell(group: dict) -> str:
    if not group["tasks"]:
        return "-"
    return f"{group['before']:.1f} -> {group['after']:.1f} ({group['tasks']})"


# ------------------------------------------------------------------------------------ cost

def cost_report(args) -> int:
    """`cost` on this checkout, and (with --baseline-src) on the other tree in a child process, side by side."""
    if args.worker:
        print(json.dumps(cost(args)))
        return 0
    out = {"machine": machine_line(), "now": cost(args)}
    if args.baseline_src:
        env = dict(os.environ, PYTHONPATH=f"{Path(args.baseline_src).resolve()}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
        command = [sys.executable, __file__, "--cost", "--worker", "--data", str(args.data), "--agents",
                   str(args.agents), "--seed", str(args.seed)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        sys.stderr.write(done.stderr)
        if done.returncode:
            raise SystemExit(f"the cost measurement on {args.baseline_src} failed (exit {done.returncode})")
        out["baseline"] = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(out, indent=1))
    write_json(args.json, out)
    return 0


def cost(args) -> dict:
    """Search latency with 0 and 100,000 events, memory per 100,000 events, events per second."""
    import resource

    from toolscout import ToolScout

    sets = [load_benchmark(args.data / name) for name in ("metatool", "toollens", "rotbench", "sealtools")]
    tools = [t.with_changes(id=f"{s.name}/{t.id}", namespace=s.name) for s in sets for t in s.tools]
    train = [(f"{s.name}", q) for s in sets for q in s.split("train")]
    tests = [q.text for s in sets for q in s.split("test")]
    rng = random.Random(args.seed)
    tests = rng.sample(tests, 400)
    scout = ToolScout.from_tools(tools)
    out = {"tools": len(tools)}
    out["latency_untaught"] = _latency(scout, tests)
    events = [{"query": q.text, "tool_ids": [f"{name}/{t}" for t in q.labels], "source": f"agent-{i % args.agents}"}
              for i, (name, q) in enumerate(rng.choices(train, k=100_000))]
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    for at in range(0, len(events), 500):
        scout.learn(events[at:at + 500])
    seconds = time.perf_counter() - start
    out["feedback_events_per_s"] = round(len(events) / seconds, 1)
    out["peak_rss_growth_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - rss, 1)
    learning = getattr(scout, "learning", None)  # the baseline tree has no learned channel
    if learning is not None:
        out["distinct_requests"] = len(learning.memory)
        out["memory_vectors_mb"] = round(learning.memory.vectors.nbytes / 2**20, 1)
    out["latency_100k_events"] = _latency(scout, tests)
    return out


def _latency(scout, queries) -> dict:
    """One search at a time; the encoder's query cache emptied first, so every task is encoded."""
    from toolscout.retrievers.base import encoding_parts

    for part in encoding_parts(scout.retriever):
        part.encoder.query_cache.entries.clear()
    for q in queries[:20]:
        scout.search(q, k=10)
    times = []
    for q in queries[20:]:
        start = time.perf_counter()
        scout.search(q, k=10)
        times.append((time.perf_counter() - start) * 1000)
    return {"p50_ms": round(percentile(times, 50), 2), "p99_ms": round(percentile(times, 99), 2)}


if __name__ == "__main__":
    sys.exit(main())
