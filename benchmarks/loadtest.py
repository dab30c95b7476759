"""Load test of `toolscout serve` on loopback: concurrent searches against a 20,000-tool index built with
toolscout's default pipeline (or --retriever), then the same while another client adds and removes
tools. Bounded: every phase stops at its deadline.

    python benchmarks/loadtest.py                                  # 8 clients x 60 s, two phases, unique tasks
    python benchmarks/loadtest.py --traffic repeated --pool 500    # agents repeating tasks: the caches at work
    python benchmarks/loadtest.py --duration 20 --json /tmp/load.json
    python benchmarks/loadtest.py --fast-queries                   # the fast tier (serve --fast-queries)
    python benchmarks/loadtest.py --student-queries                # the query student's tier

Traffic: "unique" (the default) sends every distinct task of the benchmark sets at most once in the whole
run, so no cache can answer for the encoder; "repeated" draws from a pool of --pool tasks, and the
report gives the share the server's answer cache served (`answer_cache_hit_rate`).

The index is built once under --work (default /tmp/toolscout-load): every tool of the benchmark sets in
--data (or of --sets; namespace = set name), plus re-namespaced copies (`copy1.`, `copy2.`, ...) up to
--tools. Tool embeddings are cached in --cache, so a rebuild after the first costs seconds. The server runs
as a subprocess (`python -m toolscout.serve`, journal fsync on, like production); writes in the mixed
phase add a tool and then delete it, so the index is left as it was.

Reported: the server's peak resident memory (VmHWM) over the run; per phase: requests, throughput, latency p50/p95/p99/max, errors (any non-200 or transport
error), writes and their latency, the CPU time per request of the server and of this load generator,
and the machine's load averages before and after (other processes share the cores: a load average
above the core count means the numbers are depressed by them).

The search clients speak HTTP/1.1 with the standard library's `http.client`, one keep-alive connection
each: the load generator runs on the same cores as the server, and httpx costs ~4x the CPU per
request (1.5 vs 0.4 ms, measured), which would be taken from the server being measured.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

from toolscout.cli.options import FAST_QUERY_FLAGS, add_fast_queries

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def build_index(args) -> Path:
    from toolscout.benchmark_sets import load_benchmark
    from toolscout.defaults import DEFAULT_RETRIEVER
    from toolscout.pipeline import ToolScout
    from toolscout.retrievers.base import retriever_class
    from toolscout.retrievers.dense import encoder_for
    from common import CachingEncoder

    index = Path(args.work) / "index"
    if (index / "CURRENT").exists():
        config = json.loads((index / (index / "CURRENT").read_text().strip() / "config.json").read_text())
        if config.get("tools") == args.tools and config.get("retriever") == (args.retriever or DEFAULT_RETRIEVER):
            return index
        raise SystemExit(f"{index} holds another index ({config.get('tools')} tools, {config.get('retriever')}); "
                         "delete it or give another --work")
    wanted = set(args.sets.split(",")) if args.sets else None
    sets = [load_benchmark(folder) for folder in sorted(Path(args.data).iterdir())
            if (folder / "tools.jsonl").exists() and (wanted is None or folder.name in wanted)]
    base = [t.with_changes(namespace=s.name) for s in sets for t in s.tools]
    tools = list(base)
    copy = 1
    while len(tools) < args.tools:
        for tool in base[: args.tools - len(tools)]:
            tools.append(tool.with_changes(id=f"copy{copy}.{tool.id}", namespace=f"copy{copy}"))
        copy += 1
    start = time.perf_counter()
    options = {"retriever": args.retriever} if args.retriever else {}
    if retriever_class(args.retriever or DEFAULT_RETRIEVER).accepts.encoder:  # tool embeddings cached on disk
        encoder = CachingEncoder(encoder_for(None), args.cache)
        scout = ToolScout.from_tools(tools, encoder=encoder, **options)
        encoder.flush()
    else:
        scout = ToolScout.from_tools(tools, **options)
    scout.save(index)
    print(f"built a {len(tools)}-tool {args.retriever} index in {time.perf_counter() - start:.0f}s -> {index}",
          file=sys.stderr)
    return index


def load_queries(data: Path, seed: int) -> list[str]:
    """Every distinct task of the benchmark sets (all splits: unique traffic needs tens of thousands),
    shuffled."""
    from toolscout.benchmark_sets import load_benchmark

    queries: dict[str, None] = {}
    for folder in sorted(data.iterdir()):
        if (folder / "queries.jsonl").exists() and (folder / "tools.jsonl").exists():
            queries.update(dict.fromkeys(q.text for q in load_benchmark(folder).queries))
    out = list(queries)
    random.Random(seed).shuffle(out)
    return out


class Traffic:
    """The tasks clients send. "unique": each task once, across all clients (the phase ends early for a
    client when they run out); "repeated": drawn at random from a pool of `pool` tasks."""

    def __init__(self, queries: list[str], kind: str, pool: int):
        self.kind = kind
        self.queries = queries if kind == "unique" else queries[:pool]
        self._next = 0
        self._lock = threading.Lock()

    def take(self, rng: random.Random) -> str | None:
        if self.kind == "repeated":
            return self.queries[rng.randrange(len(self.queries))]
        with self._lock:
            if self._next >= len(self.queries):
                return None
            self._next += 1
            return self.queries[self._next - 1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(index: Path, port: int, token: str, nice: int, batch_workers: int = 2,
                 fast_queries: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOOLSCOUT_TOKEN": token, "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "toolscout.serve", str(index), "--port", str(port),
           "--batch-workers", str(batch_workers)] + ([FAST_QUERY_FLAGS[fast_queries]] if fast_queries else [])
    if nice:
        cmd = ["nice", "-n", str(nice)] + cmd
    proc = subprocess.Popen(cmd, env=env)
    deadline = time.time() + 600
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("server did not start within 600s")


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ms = np.asarray(values) * 1000
    return {"p50_ms": round(float(np.percentile(ms, 50)), 2), "p95_ms": round(float(np.percentile(ms, 95)), 2),
            "p99_ms": round(float(np.percentile(ms, 99)), 2), "max_ms": round(float(ms.max()), 2)}


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_phase(url: str, traffic: Traffic, clients: int, duration: float, k: int, token: str,
              writer_rate: float, server_pid: int) -> dict:
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []
    writes: list[float] = []
    write_errors: list[str] = []
    stop = time.perf_counter() + duration

    host, port = url.split("://", 1)[1].rsplit(":", 1)

    def client(slot: int) -> None:
        rng = random.Random(slot)
        conn = None
        headers = {"Content-Type": "application/json"}
        while time.perf_counter() < stop:
            query = traffic.take(rng)
            if query is None:
                break
            body = json.dumps({"query": query, "k": k}).encode()
            t0 = time.perf_counter()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(host, int(port), timeout=30)
                conn.request("POST", "/search", body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
                outcome = response.status
                ok = outcome == 200 and "results" in json.loads(data)
            except (OSError, http.client.HTTPException, ValueError) as exc:
                ok, outcome = False, repr(exc)
                if conn is not None:
                    conn.close()
                conn = None  # reconnect for the next request
            latencies[slot].append(time.perf_counter() - t0)
            if not ok:
                errors.append(str(outcome)[:200])
        if conn is not None:
            conn.close()

    def writer() -> None:
        period = 1.0 / writer_rate
        i = 0
        with httpx.Client(base_url=url, timeout=30, headers={"authorization": f"Bearer {token}"}) as http:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                tid = f"loadtest.w{i // 2}"
                try:
                    if i % 2 == 0:
                        r = http.put(f"/tools/{tid}", json={"name": f"w{i // 2}", "namespace": "loadtest",
                                                            "description": f"Load test tool {i // 2}: convert "
                                                                           f"{random.choice(['pdf', 'csv', 'xml'])} files"})
                    else:
                        r = http.delete(f"/tools/{tid}")
                    ok = r.status_code == 200
                except httpx.HTTPError as exc:
                    ok, r = False, exc
                writes.append(time.perf_counter() - t0)
                if not ok:
                    write_errors.append(str(getattr(r, "status_code", r))[:200])
                i += 1
                time.sleep(max(0.0, period - (time.perf_counter() - t0)))
        if i % 2:  # leave the index as it was
            with httpx.Client(base_url=url, timeout=30, headers={"authorization": f"Bearer {token}"}) as http:
                http.delete(f"/tools/loadtest.w{i // 2}")

    load_before = os.getloadavg()
    server_cpu, client_cpu = cpu_seconds(server_pid), time.process_time()
    started = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    if writer_rate > 0:
        threads.append(threading.Thread(target=writer))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=duration + 120)
    elapsed = time.perf_counter() - started
    server_cpu, client_cpu = cpu_seconds(server_pid) - server_cpu, time.process_time() - client_cpu
    all_latencies = [x for per in latencies for x in per]
    out = {"clients": clients, "duration_s": round(elapsed, 1), "requests": len(all_latencies),
           "throughput_rps": round(len(all_latencies) / elapsed, 1), **percentiles(all_latencies),
           "errors": len(errors), "error_samples": errors[:5],
           "server_cpu_ms_per_request": round(1000 * server_cpu / max(1, len(all_latencies)), 2),
           "client_cpu_ms_per_request": round(1000 * client_cpu / max(1, len(all_latencies)), 2),
           "server_cpu_share": round(server_cpu / elapsed, 2),  # cores' worth of CPU the server got
           "load_avg_before": [round(x, 2) for x in load_before],
           "load_avg_after": [round(x, 2) for x in os.getloadavg()]}
    if writer_rate > 0:
        out.update({"writes": len(writes), "write_errors": len(write_errors), "write_error_samples": write_errors[:5],
                    **{f"write_{key}": value for key, value in percentiles(writes).items()}})
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default=str(DATA))
    parser.add_argument("--work", default="/tmp/toolscout-load")
    parser.add_argument("--cache", default="/tmp/toolscout-embeddings", help="embedding cache folder")
    parser.add_argument("--sets", default=None, help="comma-separated set names to take tools from (default: all)")
    parser.add_argument("--tools", type=int, default=20_000)
    parser.add_argument("--retriever", default=None, help="first stage (default: toolscout's default pipeline)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds per phase (default %(default)s)")
    parser.add_argument("--writer-rate", type=float, default=4.0, help="writes/s in the mixed phase (default %(default)s)")
    parser.add_argument("-k", type=int, default=5)
    parser.add_argument("--phases", default="read,mixed", help="comma-separated: read, mixed")
    parser.add_argument("--batch-workers", type=int, default=2, help="the server's --batch-workers (default %(default)s)")
    add_fast_queries(parser)  # the server runs with the same flag
    parser.add_argument("--server-nice", type=int, default=0, help="niceness of the server process")
    parser.add_argument("--warmup", type=int, default=50, help="requests before measuring")
    parser.add_argument("--traffic", choices=["unique", "repeated"], default="unique",
                        help="unique: no two requests share a task; repeated: tasks drawn from --pool of them")
    parser.add_argument("--pool", type=int, default=500, help="tasks repeated traffic draws from")
    parser.add_argument("--json", default=None, metavar="FILE")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    index = build_index(args)
    queries = load_queries(Path(args.data), seed=0)
    warmup, queries = queries[: args.warmup], queries[args.warmup:]  # warm-up tasks never come back
    token = "loadtest-" + os.urandom(8).hex()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    server = start_server(index, port, token, args.server_nice, args.batch_workers, args.fast_queries)
    report: dict = {"tools": args.tools, "retriever": args.retriever or "default", "traffic": args.traffic,
                    "fast_queries": args.fast_queries,
                    "cpus": os.cpu_count(),
                    "server_start_s": round(time.perf_counter() - t0, 1), "phases": {}}
    try:
        with httpx.Client(base_url=url, timeout=60) as http:
            for q in warmup:
                http.post("/search", json={"query": q, "k": args.k})
            report["health"] = http.get("/health").json()
        for i, phase in enumerate(args.phases.split(",")):
            rate = args.writer_rate if phase == "mixed" else 0.0
            share = queries[i::len(args.phases.split(","))]  # unique traffic: no task in two phases either
            with httpx.Client(base_url=url, timeout=60) as http:
                before = http.get("/health").json()
            result = run_phase(url, Traffic(share, args.traffic, args.pool), args.clients, args.duration, args.k,
                               token, rate, server.pid)
            with httpx.Client(base_url=url, timeout=60) as http:
                result["answer_cache_hit_rate"] = hit_rate(before, http.get("/health").json())
            report["phases"][phase] = result
            print(f"{phase:6} {json.dumps(result)}", file=sys.stderr)
        with httpx.Client(base_url=url, timeout=60) as http:
            report["health_after"] = http.get("/health").json()
        report["server_peak_rss_mb"] = server_peak_rss_mb(server.pid)
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=300)
        except subprocess.TimeoutExpired:
            server.kill()
    _print(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0


def server_peak_rss_mb(pid: int) -> float | None:
    """The server process's peak resident memory so far (Linux VmHWM), in MB; None where /proc lacks it."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def hit_rate(before: dict, after: dict) -> float | None:
    """Share of the phase's searches the server's answer cache served."""
    hits = after.get("answer_cache_hits", 0) - before.get("answer_cache_hits", 0)
    misses = after.get("answer_cache_misses", 0) - before.get("answer_cache_misses", 0)
    return round(hits / (hits + misses), 4) if hits + misses else None


def _print(report: dict) -> None:
    print(f"{report['tools']} tools ({report['retriever']}), {report['traffic']} traffic, {report['cpus']} CPUs, "
          f"server start {report['server_start_s']}s, server peak RSS {report.get('server_peak_rss_mb')} MB")
    print(f"{'phase':7} {'clients':>7} {'requests':>8} {'req/s':>7} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} "
          f"{'errors':>6} {'writes':>6} {'w.err':>5} {'w.p50':>7} {'w.p99':>7} {'srv cpu/req':>11} {'srv cores':>9}"
          "  load avg before -> after")
    for name, r in report["phases"].items():
        print(f"{name:7} {r['clients']:7d} {r['requests']:8d} {r['throughput_rps']:7.1f} {r.get('p50_ms', 0):8.1f} "
              f"{r.get('p95_ms', 0):8.1f} {r.get('p99_ms', 0):8.1f} {r['errors']:6d} {r.get('writes', 0):6d} "
              f"{r.get('write_errors', 0):5d} {r.get('write_p50_ms', 0):7.1f} {r.get('write_p99_ms', 0):7.1f} "
              f"{r['server_cpu_ms_per_request']:9.1f}ms {r['server_cpu_share']:9.2f}  "
              f"{r['load_avg_before']} -> {r['load_avg_after']}  cache hits {r.get('answer_cache_hit_rate')}")


if __name__ == "__main__":
    sys.exit(main())
