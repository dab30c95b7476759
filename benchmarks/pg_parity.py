"""Does a pipeline indexed into PostgreSQL rank exactly as the same pipeline indexed into a directory, through
every entry point? (docs/postgres.md has the figures)

    python benchmarks/pg_parity.py [--set ../shared/data/bfcl] [--tasks 500] [--rerank-tasks 100]
                                   [--pipelines default,hybrid-rrf,reranked] [--json FILE]

For each pipeline (the default; a hybrid with other weights, reciprocal-rank fusion and no request splitting;
the default with a cross-encoder reranker, trained for the run in a few steps on the bundled API-Bank sample),
the set's catalog is indexed twice with the command line: `toolscout index SET --out LOCAL FLAGS` and
`toolscout index SET --out POINTER --store DSN FLAGS` (a real PostgreSQL: pgserver, as the tests start it).
The same tasks are then searched through every entry point of each deployment:

- python: `ToolScout.load` of each directory (the pointer's builds the pipeline from the database);
- replica A and B: `ToolService.open(DSN)` twice, each building its own pipeline from the database;
- cli: `toolscout search DIR TASKS... --json`, one process for all tasks;
- http: `toolscout serve LOCAL` and `toolscout serve --store DSN`, one POST /search per task;
- mcp: `toolscout serve DIR --mcp` (stdio), the official SDK client calling `search_tools` per task.

Reported per pipeline and entry point: `same_as_directory`, the share of tasks whose top-10 ids come back the
same and in the same order from the PostgreSQL deployment as from the directory through the same entry point
(the replicas: as from the directory through Python); `same_as_python`, the same share against the directory
through Python (one search per call; a reranker that batches several tasks' pairs, as `toolscout search` with
several tasks does, may order near-ties apart); nDCG@10; and, in process, the per-search latency.

Then half the tasks' gold tools are taught as feedback: through replica A into the database, and with
`toolscout learn LOCAL LOG` into the directory; the other half is compared again (replica B, and every process
started afterwards, learn of it through the database only).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from common import DEFAULT_DATA  # noqa: E402

K = 10
SAMPLE = ROOT / "src" / "toolscout" / "data" / "catalogs" / "apibank_sample"
PIPELINES = {"default": [], "hybrid-rrf": ["-o", "weights=[2, 1]", "-o", "fusion=rrf", "--no-split"],
             "reranked": ["--rerank", "{reranker}", "--rerank-depth", "10"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", default=str(DEFAULT_DATA / "bfcl"))
    parser.add_argument("--tasks", type=int, default=500)
    parser.add_argument("--rerank-tasks", type=int, default=100, help="tasks for the reranked pipeline")
    parser.add_argument("--pipelines", default=",".join(PIPELINES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from pgtest import postgres_uri

    from toolscout.benchmark_sets import load_benchmark

    bench = load_benchmark(Path(args.set))
    tasks = random.Random(args.seed).sample(bench.split("test"), min(args.tasks, len(bench.split("test"))))
    work = Path(tempfile.mkdtemp(prefix="toolscout-pg-parity-"))
    uri = postgres_uri()
    figures = {"set": bench.name, "tools": len(bench.tools), "pipelines": {}}
    for name in args.pipelines.split(","):
        flags = [f.format(reranker=train_reranker(work)) if "{" in f else f for f in PIPELINES[name]]
        chosen = tasks[: args.rerank_tasks] if name == "reranked" else tasks
        figures["pipelines"][name] = run_pipeline(Path(args.set), flags, chosen, uri, work / name)
        print(json.dumps({name: figures["pipelines"][name]}, indent=1), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=1))
    return 0


def cli(*args: str) -> str:
    """`toolscout ARGS` in its own process (stdout returned; a failure stops the run with its stderr)."""
    done = subprocess.run([sys.executable, "-m", "toolscout", *args], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode:
        raise SystemExit(f"toolscout {' '.join(args[:3])} ... failed:\n{done.stderr[-3000:]}")
    return done.stdout


def train_reranker(work: Path) -> str:
    out = work / "cross"
    if not out.exists():
        cli("train", "cross", "--data", str(SAMPLE), "--out", str(out), "--max-steps", "8", "--batch-size", "8",
            "--seed", "0", "--quiet", "-o", "first_stage=bm25", "-o", "max_validation=8", "-o", "rerank_depth=10",
            "-o", "max_length=64")
    return str(out)


def run_pipeline(set_dir: Path, flags: list[str], tasks, uri: str, work: Path) -> dict:
    from pgtest import new_table, spec

    from toolscout.serve import ToolService

    local, pointer, store = work / "local", work / "pointer", spec(uri, new_table())
    cli("index", str(set_dir), "--out", str(local), *flags)
    cli("index", str(set_dir), "--out", str(pointer), "--store", store, *flags)
    replicas = [ToolService.open(store, batch_workers=0) for _ in range(2)]
    try:
        out = {"before_feedback": compare(searches(local, pointer, store, replicas), tasks)}
        taught, held = tasks[: len(tasks) // 2], tasks[len(tasks) // 2:]
        events = [{"query": q.text, "tool_ids": list(q.labels), "source": "parity"} for q in taught]
        replicas[0].feedback(events)
        log = work / "feedback.jsonl"
        log.write_text("".join(json.dumps(e) + "\n" for e in events))
        cli("learn", str(local), str(log))
        out["after_feedback"] = compare(searches(local, pointer, store, replicas), held)
    finally:
        for replica in replicas:
            replica.close()
    return out


def searches(local: Path, pointer: Path, store: str, replicas) -> dict:
    """entry point -> a function of the tasks giving (top-k ids per task, ms per search or None)."""
    return {"python: directory": lambda tasks: by_python(local, tasks),
            "python: PostgreSQL": lambda tasks: by_python(pointer, tasks),
            "replica A": lambda tasks: by_service(replicas[0], tasks),
            "replica B": lambda tasks: by_service(replicas[1], tasks),
            "cli: directory": lambda tasks: by_cli(local, tasks),
            "cli: PostgreSQL": lambda tasks: by_cli(pointer, tasks),
            "http: directory": lambda tasks: by_http([str(local), "--no-fsync"], tasks),
            "http: PostgreSQL": lambda tasks: by_http(["--store", store], tasks),
            "mcp: directory": lambda tasks: by_mcp([str(local), "--no-fsync"], tasks),
            "mcp: PostgreSQL": lambda tasks: by_mcp([str(pointer)], tasks)}


def timed(search, tasks) -> tuple[list[list[str]], list[float]]:
    ranked, ms = [], []
    for task in tasks:
        started = time.perf_counter()
        ranked.append(search(task.text))
        ms.append((time.perf_counter() - started) * 1000)
    return ranked, ms


def by_python(folder: Path, tasks):
    from toolscout import ToolScout

    scout = ToolScout.load(folder)
    return timed(lambda text: [h.tool.id for h in scout.search(text, k=K)], tasks)


def by_service(service, tasks):
    return timed(lambda text: [h.tool.id for h in service.search(text, K, min_score=None)], tasks)


def by_cli(folder: Path, tasks):
    found = json.loads(cli("search", "--json", "-k", str(K), str(folder), "--", *[t.text for t in tasks]))
    found = found if isinstance(found, list) else [found]
    return [[h["id"] for h in answer["hits"]] for answer in found], None


def by_http(args: list[str], tasks):
    import httpx
    from servers import start_server, stop

    proc, url = start_server(args)
    try:
        with httpx.Client(timeout=120) as http:
            return [[h["id"] for h in http.post(f"{url}/search", json={"query": t.text, "k": K}).json()
                     ["results"][0]["hits"]] for t in tasks], None
    finally:
        stop(proc)


def by_mcp(args: list[str], tasks):
    import anyio
    from mcp import Client, StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=["-m", "toolscout.serve", *args, "--mcp"],
                                   env={**os.environ, "HF_HUB_OFFLINE": "1"})

    async def session():
        async with Client(params) as client:
            ranked = []
            for task in tasks:
                result = await client.call_tool("search_tools", {"task": task.text, "k": K})
                ranked.append([t["id"] for t in result.structured_content["tools"]])
            return ranked

    return anyio.run(session), None


def compare(systems: dict, tasks) -> dict:
    from toolscout.eval.metrics import ndcg_at_k

    results = {name: search(tasks) for name, search in systems.items()}

    def share(name: str, reference: str) -> float:
        same = sum(a == b for a, b in zip(results[reference][0], results[name][0]))
        return round(100 * same / len(tasks), 2)

    out = {}
    for name, (ranked, ms) in results.items():
        out[name] = {"same_as_python": share(name, "python: directory"),
                     "ndcg": round(100 * sum(ndcg_at_k(r, t.labels, K) for r, t in zip(ranked, tasks)) / len(tasks), 2)}
        if "PostgreSQL" in name or "replica" in name:
            out[name]["same_as_directory"] = share(name, name.replace("PostgreSQL", "directory")
                                                   if "PostgreSQL" in name else "python: directory")
        if ms:
            out[name].update(p50_ms=round(statistics.median(ms), 2),
                             p99_ms=round(statistics.quantiles(ms, n=100)[98], 2))
    return out


if __name__ == "__main__":
    sys.exit(main())
