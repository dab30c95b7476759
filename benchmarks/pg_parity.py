"""Does a PostgreSQL replica rank exactly as the library does in process? (docs/postgres.md has the figures)

    python benchmarks/pg_parity.py [--set ../shared/data/bfcl] [--tasks 500] [--json FILE]

The set's catalog is indexed in process (`ToolScout.from_tools`, the default pipeline) and into a real
PostgreSQL (pgserver, as the tests start it; `toolscout.postgres.index_catalog`, the same encoder), and two
replicas (`ToolService.open(DSN)` twice: each builds its own pipeline from the database) answer the same
tasks. Reported: the share of tasks whose top-10 ids come back the same and in the same order, nDCG@10 of
each, and the per-search latency of the local index and of a replica (its catalog version read included).

Then half the tasks' gold tools are taught as feedback, through replica A to the database and with
`ToolScout.learn` in process, and the other half is compared again: replica B learns of it only through
the database's change log.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from common import DEFAULT_DATA  # noqa: E402

K = 10


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", default=str(DEFAULT_DATA / "bfcl"))
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from toolscout import ToolScout
    from toolscout.benchmark import load_benchmark
    from toolscout.encoders import Encoder

    bench = load_benchmark(Path(args.set))
    tasks = random.Random(args.seed).sample(bench.split("test"), min(args.tasks, len(bench.split("test"))))
    encoder = Encoder.load(None)
    local = ToolScout.from_tools(bench.tools, encoder=Encoder.load(None))  # its own encoder: its own query cache
    replicas, close = pg_replicas(bench.tools, encoder)
    try:
        figures = {"set": bench.name, "tools": len(bench.tools), "tasks": len(tasks),
                   "before_feedback": compare(local, replicas, tasks)}
        taught, held = tasks[: len(tasks) // 2], tasks[len(tasks) // 2:]
        events = [{"query": q.text, "tool_ids": list(q.labels), "source": "parity"} for q in taught]
        local.learn(events)
        replicas[0].feedback(events)
        figures["after_feedback"] = compare(local, replicas, held)
    finally:
        close()
    print(json.dumps(figures, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


def pg_replicas(tools, encoder):
    """Two services on one fresh PostgreSQL index of `tools`, and a function that closes them."""
    from pgtest import new_table, postgres_uri, spec

    from toolscout.postgres import index_catalog
    from toolscout.serve import ToolService
    from toolscout.store.pg_catalog import PgCatalog

    store_spec = spec(postgres_uri(), new_table())
    catalog = PgCatalog.from_spec(store_spec, encoder.dim)
    index_catalog(catalog, tools, encoder, search="hybrid")
    catalog.close()
    replicas = [ToolService.open(store_spec, encoder=encoder if i == 0 else type(encoder).load(None), batch_workers=0)
                for i in range(2)]
    return replicas, lambda: [r.close() for r in replicas]


def compare(local, replicas, tasks) -> dict:
    from toolscout.eval.metrics import ndcg_at_k

    ranked = {"local": [], "replica A": [], "replica B": []}
    timings = {"local": [], "replica A": [], "replica B": []}
    for task in tasks:
        for name, search in (("local", lambda q: local.search(q, k=K)),
                             ("replica A", lambda q: replicas[0].search(q, K, min_score=None)),
                             ("replica B", lambda q: replicas[1].search(q, K, min_score=None))):
            started = time.perf_counter()
            hits = search(task.text)
            timings[name].append((time.perf_counter() - started) * 1000)
            ranked[name].append([h.tool.id for h in hits])
    out = {}
    for name in ranked:
        same = sum(a == b for a, b in zip(ranked["local"], ranked[name]))
        out[name] = {"same_top10_share": round(100 * same / len(tasks), 2),
                     "ndcg": round(100 * sum(ndcg_at_k(r, t.labels, K) for r, t in zip(ranked[name], tasks))
                                   / len(tasks), 2),
                     "p50_ms": round(statistics.median(timings[name]), 2),
                     "p99_ms": round(statistics.quantiles(timings[name], n=100)[98], 2)}
    return out


if __name__ == "__main__":
    sys.exit(main())
