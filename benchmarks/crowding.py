"""Does learning from use crowd out tools nobody has used yet? Train splits only.

    python benchmarks/crowding.py [--sets sealtools,metatool,toollens,rotbench] [--usage-evidence 0 --usage-evidence 4]

For each set, its train queries are shuffled and carved: 600 "traffic" tasks whose gold tools are taught
(as a gateway learns from the calls it forwards) and 400 validation tasks. nDCG@10 of the validation tasks
before and after learning, over all of them, over those whose gold tools were never taught ("untouched":
learning must not hurt them), and over those whose gold tools all were ("touched"). Each setting is
learned under its own source and taken back before the next (`forget`), so all run on one index.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
from pathlib import Path

from common import DEFAULT_DATA

K = 10


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--sets", default="sealtools,metatool,toollens,rotbench")
    parser.add_argument("--traffic", type=int, default=600)
    parser.add_argument("--validation", type=int, default=400)
    parser.add_argument("--usage-evidence", type=float, action="append", help="BM25 usage evidence(s) to try")
    parser.add_argument("--prior", type=float, action="append", help="dense blend prior(s) to try")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    figures = {name: crowding(args.data / name, args) for name in args.sets.split(",")}
    print(json.dumps(figures, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


def crowding(folder: Path, args) -> dict:
    from toolscout import ToolScout
    from toolscout.benchmark import load_benchmark

    bench = load_benchmark(folder)
    pool = random.Random(args.seed).sample(bench.split("train"), len(bench.split("train")))
    validation, traffic = pool[: args.validation], pool[args.validation: args.validation + args.traffic]
    taught = {t for q in traffic for t in q.labels}
    parts = {"all": validation, "untouched": [q for q in validation if not set(q.labels) & taught],
             "touched": [q for q in validation if set(q.labels) <= taught]}
    scout = ToolScout.from_tools(bench.tools)
    out = {"tasks": {part: len(qs) for part, qs in parts.items()}, "no learning": scores(scout, parts)}
    for evidence, prior in itertools.product(args.usage_evidence or [None], args.prior or [None]):
        source = f"evidence={evidence} prior={prior}"
        for component in scout.retriever.components:
            if evidence is not None and hasattr(component, "usage"):
                component.usage.evidence = evidence
            if prior is not None and hasattr(component, "learned"):
                component.learned.prior = prior
        scout.learn([{"query": q.text, "tool_ids": list(q.labels), "source": source} for q in traffic])
        out[source] = scores(scout, parts)
        scout.forget(source)
        print(bench.name, source, out[source], file=sys.stderr, flush=True)
    return out


def scores(scout, parts: dict) -> dict:
    from toolscout.eval.metrics import ndcg_at_k

    out = {}
    for part, queries in parts.items():
        ranked = scout.search([q.text for q in queries], k=K) if queries else []
        out[part] = round(100 * sum(ndcg_at_k([h.tool.id for h in hits], q.labels, K)
                                    for hits, q in zip(ranked, queries)) / max(1, len(queries)), 2)
    return out


if __name__ == "__main__":
    sys.exit(main())
