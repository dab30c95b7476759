"""Quality and query cost of the fast tier (`serve --fast-queries`: tasks encoded by the static table
distilled from the default encoder) next to the default, in one run.

    python benchmarks/fast_tier.py                      # every dev set's test split, default pipeline and dense
    python benchmarks/fast_tier.py --max-queries 300 --json runs/fast.json

Ranks each labelled dev set's test queries against its own catalog four ways: the default pipeline and
the dense retriever alone, each with the default encoder's queries and with the static table's. Prints
nDCG@10 per set, the macro mean over all sets and over the two never-trained ones (bfcl and
gorilla_huggingface: the table, like the default encoder, was fitted on the other six sets' train
splits), and the median time to encode one task each way (the query cache bypassed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from common import DEFAULT_DATA, DEV_SETS, ZERO_SHOT, encode_ms, machine_line, ndcg_per_set, write_json


def summary(per_set: dict[str, float]) -> dict:
    zero_shot = [per_set[s] for s in ZERO_SHOT if s in per_set]
    return {"per_set": per_set, "macro": statistics.fmean(per_set.values()),
            "zero_shot_macro": statistics.fmean(zero_shot) if zero_shot else None}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--sets", default=",".join(DEV_SETS))
    parser.add_argument("--max-queries", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from toolscout.benchmark_sets import load_benchmark
    from toolscout.encoders import Encoder
    from toolscout.encoders.query_cache import QueryCache
    from toolscout.encoders.static import static_queries_for

    print(machine_line(), file=sys.stderr)
    folders = [args.data / s for s in args.sets.split(",") if s]
    report = {"command": "python benchmarks/fast_tier.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "systems": {}}
    teacher = Encoder.load(None)
    for system in ("default", "dense"):
        for fast in (False, True):
            name = f"{system}{' + fast queries' if fast else ''}"
            report["systems"][name] = summary(ndcg_per_set(teacher, folders, args.max_queries, system, fast))
            print(f"{name}: macro {report['systems'][name]['macro']:.2f}", file=sys.stderr, flush=True)
    fast = static_queries_for(teacher)
    teacher.query_cache = fast.query_cache = QueryCache(0)  # every task encoded
    tasks = [q.text for f in folders[:4] for q in load_benchmark(f).split("test")[:100]]
    report["query_ms"] = {"encoder": encode_ms(teacher.encode_queries, tasks),
                          "static table": encode_ms(fast.encode_queries, tasks)}
    print_report(report)
    write_json(args.json, report)
    return 0


def print_report(report: dict) -> None:
    systems = report["systems"]
    names = list(systems)
    print("| set | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    for s in next(iter(systems.values()))["per_set"]:
        print(f"| {s} | " + " | ".join(f"{systems[n]['per_set'][s]:.2f}" for n in names) + " |")
    print("| **macro** | " + " | ".join(f"**{systems[n]['macro']:.2f}**" for n in names) + " |")
    print("| zero-shot macro | " + " | ".join(f"{systems[n]['zero_shot_macro']:.2f}" for n in names) + " |")
    ms = report["query_ms"]
    print(f"\nmedian ms to encode one task: encoder {ms['encoder']:.3f}, static table {ms['static table']:.3f}")


if __name__ == "__main__":
    sys.exit(main())
