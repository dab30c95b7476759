"""Learning from use, replayed: feed a set's labelled queries as tool-use feedback, then search its held-out
queries, and compare with offline Tool2Vec trained on the same queries.

    python benchmarks/learn_replay.py --sets metatool,rotbench,toollens,bfcl          # through toolscout serve
    python benchmarks/learn_replay.py --split validation --in-process --curve

Through HTTP (the default): for each set, index its catalog with the default pipeline, start
`python -m toolscout.serve` on it, POST the feedback to /feedback in batches and the test queries to
/search one at a time, and report nDCG@10 before any feedback and after 100, 1,000 and all events (the
learning curve, as a table and `--plot FILE.png`), the feedback throughput (events/s acknowledged) and
the search latency without and with learning (`cold_latency`: fresh servers, no query cached, the
untaught and taught indexes alternated; the taught server restarted, which also checks that what it
learned came back from disk).

`--split test` (default) feeds the train split and searches the test split; `--split validation` feeds
the train split minus the validation carve (`toolscout.train.data.in_validation`) and searches the carve
(`--in-process`: no server). `--tool2vec` also trains offline Tool2Vec on the same feedback queries for the
comparison. Whether learning is safe to leave on (tasks it was not taught, tools added later):
benchmarks/learning_safety.py.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import DEFAULT_DATA, machine_line, percentile, write_json

CURVE = (0, 100, 1000, None)  # None: every event
VALIDATION_CURVE = (100, 1000, 3000, None)  # --in-process --curve: partial feedback, as a deployment starts


def feedback_and_queries(data: Path, name: str, split: str, fraction: float = 0.1):
    """(bench, feedback events, evaluation queries) for one set under the chosen split."""
    from toolscout.benchmark_sets import load_benchmark
    from toolscout.train.data import in_validation

    bench = load_benchmark(data / name)
    train = bench.split("train")
    if split == "validation":
        held = [q for q in train if in_validation(bench.name, q.id, fraction)]
        train = [q for q in train if not in_validation(bench.name, q.id, fraction)]
    else:
        held = bench.split("test")
    events = [{"query": q.text, "tool_ids": list(q.labels), "source": "replay"} for q in train if q.labels]
    return bench, events, [q for q in held if q.labels]


def ndcg(rankings, queries, k=10) -> float:
    from toolscout.eval.metrics import ndcg_at_k

    return 100.0 * sum(ndcg_at_k(list(r), set(q.labels), k) for r, q in zip(rankings, queries)) / max(1, len(queries))


# ------------------------------------------------------------------------------------ in process

def in_process(args, bench, events, queries, encoder) -> dict:
    """nDCG@10 before feedback and after all of it (with --curve: after each point of VALIDATION_CURVE)."""
    from toolscout.pipeline import ToolScout

    options = {"retriever": args.retriever} if args.retriever else {}
    scout = ToolScout.from_tools(bench.tools, encoder=encoder, **options)
    texts = [q.text for q in queries]
    out = {"none": ndcg(scout.retrieve(texts, 10).as_lists(), queries)}
    scores, done = [], 0
    for point in (VALIDATION_CURVE if args.curve else (None,)):
        end = len(events) if point is None else min(point, len(events))
        for start in range(done, end, args.batch):
            scout.learn(events[start:min(start + args.batch, end)])
        done = end
        scores.append(ndcg(scout.retrieve(texts, 10).as_lists(), queries))
    out["learned"] = scores if args.curve else scores[0]
    print(bench.name, out, file=sys.stderr, flush=True)
    return out


def offline_tool2vec(bench, events, queries, encoder) -> float:
    """Tool2Vec (the Tool2Vec paper) trained offline on the feedback queries: its nDCG@10 on `queries`."""
    from toolscout.pipeline import ToolScout

    usage: dict[str, list[str]] = {}
    for event in events:
        for tool_id in event["tool_ids"]:
            usage.setdefault(tool_id, []).append(event["query"])
    scout = ToolScout.from_tools(bench.tools, retriever="tool2vec", encoder=encoder, usage=usage, intents=None)
    return ndcg(scout.retrieve([q.text for q in queries], 10).as_lists(), queries)


# ------------------------------------------------------------------------------------------ http

class Server:
    """`python -m toolscout.serve DIR` on a free loopback port, stopped on exit."""

    def __init__(self, folder: Path):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "toolscout.serve", str(folder), "--port", str(self.port),
                                      "--feedback-rate", "0", "--feedback-volume", "0"],
                                     env=env, stderr=subprocess.PIPE)
        self.url = f"http://127.0.0.1:{self.port}"
        import httpx

        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"server exited: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        raise SystemExit("server did not start")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=120)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def over_http(args, bench, events, queries, work: Path) -> dict:
    import shutil

    import httpx

    from toolscout.pipeline import ToolScout

    folder, unlearned = work / bench.name, work / f"{bench.name}-no-feedback"
    ToolScout.from_tools(bench.tools).save(folder)
    shutil.copytree(folder, unlearned)  # the same index, never taught: the latency baseline
    curve, posted, feed_s = {}, 0, 0.0
    with Server(folder) as server, httpx.Client(base_url=server.url, timeout=300) as http:
        for target in CURVE:
            target = len(events) if target is None else min(target, len(events))
            while posted < target:
                batch = events[posted:min(target, posted + args.batch)]
                start = time.perf_counter()
                r = http.post("/feedback", json={"events": batch})
                feed_s += time.perf_counter() - start
                r.raise_for_status()
                posted += len(batch)
            rankings, _latency = search_all(http, queries)
            curve[posted] = ndcg(rankings, queries)
            print(f"{bench.name}: {posted} events -> nDCG@10 {curve[posted]:.2f}", file=sys.stderr, flush=True)
    restarted, before, after = cold_latency(unlearned, folder, queries)
    return {"curve": curve, "events": len(events), "feedback_events_per_s": posted / feed_s if feed_s else None,
            "after_restart": restarted,
            "search_p50_ms_before": percentile(before, 50), "search_p50_ms_after": percentile(after, 50),
            "search_p99_ms_before": percentile(before, 99), "search_p99_ms_after": percentile(after, 99)}


def cold_latency(unlearned: Path, learned: Path, queries, rounds: int = 2) -> tuple[float, list[float], list[float]]:
    """Search latency without and with what was learned, each pass on a fresh server (no query cached)
    over the held-out queries, alternating the two indexes `rounds` times so that both meet the same
    machine conditions; and nDCG@10 of the restarted learned server (everything learned came back from
    disk). The curve's passes are no latency measure: later ones are answered partly from the cache."""
    import httpx

    latency: dict[Path, list[float]] = {unlearned: [], learned: []}
    restarted = None
    for round_ in range(rounds):  # A B, B A, ...: neither index always goes first
        for folder in (unlearned, learned) if round_ % 2 == 0 else (learned, unlearned):
            with Server(folder) as server, httpx.Client(base_url=server.url, timeout=300) as http:
                rankings, times = search_all(http, queries)
            latency[folder] += times
            if folder == learned:
                restarted = ndcg(rankings, queries)
    return restarted, latency[unlearned], latency[learned]


def search_all(http, queries) -> tuple[list[list[str]], list[float]]:
    rankings, latency = [], []
    for q in queries:
        start = time.perf_counter()
        r = http.post("/search", json={"query": q.text, "k": 10, "abstain": False, "match_names": False})
        latency.append((time.perf_counter() - start) * 1000)
        r.raise_for_status()
        rankings.append([h["id"] for h in r.json()["results"][0]["hits"]])
    return rankings, latency


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, result in results.items():
        points = sorted((int(n), v) for n, v in result["curve"].items())
        ax.plot([max(n, 1) for n, _ in points], [v for _, v in points], marker="o", label=name)
        if result.get("tool2vec") is not None:
            ax.axhline(result["tool2vec"], linestyle=":", linewidth=1, color=ax.lines[-1].get_color())
    ax.set_xscale("log")
    ax.set_xlabel("feedback events posted (log; 0 plotted at 1)")
    ax.set_ylabel("nDCG@10 on held-out queries")
    dotted = any(result.get("tool2vec") is not None for result in results.values())
    ax.set_title("toolscout learning from use" + (" (dotted: offline Tool2Vec)" if dotted else ""))
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}", file=sys.stderr)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--sets", default="metatool,rotbench,toollens,bfcl")
    parser.add_argument("--split", default="test", choices=["test", "validation"])
    parser.add_argument("--in-process", action="store_true", help="learn in this process (sweeps; no server)")
    parser.add_argument("--curve", action="store_true",
                        help="--in-process: score after the first 100, 1,000, 3,000 and all events, not only all")
    parser.add_argument("--tool2vec", action="store_true", help="also offline Tool2Vec on the same queries")
    parser.add_argument("--retriever", default=None, help="--in-process: the first stage (default: the default)")
    parser.add_argument("--batch", type=int, default=200, help="events per POST /feedback")
    parser.add_argument("--max-queries", type=int, default=None, help="evaluate at most N queries per set")
    parser.add_argument("--work", default=None)
    parser.add_argument("--plot", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from toolscout.retrievers.dense import encoder_for
    from common import CachingEncoder

    print(machine_line(), file=sys.stderr)
    work = Path(args.work or tempfile.mkdtemp(prefix="toolscout-replay-"))
    # in this process, query embeddings are cached on disk: a sweep embeds each request once
    encoder = CachingEncoder(encoder_for(None), work / "cache") if args.in_process or args.tool2vec else None
    results = {}
    for name in [s for s in args.sets.split(",") if s]:
        bench, events, queries = feedback_and_queries(args.data, name, args.split)
        queries = queries[: args.max_queries] if args.max_queries else queries
        print(f"{name}: {len(events)} feedback events, {len(queries)} {args.split} queries", file=sys.stderr)
        result = in_process(args, bench, events, queries, encoder) if args.in_process else \
            over_http(args, bench, events, queries, work)
        if args.tool2vec and events:
            result["tool2vec"] = offline_tool2vec(bench, events, queries, encoder)
        results[name] = result
        print(json.dumps({name: result}, default=str), flush=True)
        if encoder is not None:
            encoder.flush()
    if args.plot and not args.in_process:
        plot(results, args.plot)
    write_json(args.json, {"split": args.split, "sets": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
