"""Shared helpers for the benchmark scripts: the real data in ../shared/data, timing, and printing."""

from __future__ import annotations

import json
import os
import random
import resource
import statistics
import time
from pathlib import Path
from typing import Callable, Sequence

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def benchmark_folders(data_dir: Path) -> list[Path]:
    folders = sorted(p.parent for p in Path(data_dir).glob("*/tools.jsonl"))
    if not folders:
        raise SystemExit(f"no benchmark folders (*/tools.jsonl) under {data_dir}; pass --data DIR")
    return folders


def load_sets(data_dir: Path):
    from toolscout.benchmark import load_benchmark

    return [load_benchmark(folder) for folder in benchmark_folders(data_dir)]


def sample_queries(sets, n: int, seed: int = 0) -> list[str]:
    """`n` test-split query texts drawn evenly across the sets that have queries (deterministic)."""
    rng = random.Random(seed)
    pools = [[q.text for q in s.split("test")] for s in sets]
    pools = [rng.sample(p, len(p)) for p in pools if p]
    out: list[str] = []
    while len(out) < n and any(pools):
        for pool in pools:
            if pool and len(out) < n:
                out.append(pool.pop())
    return out


def sample_tool_texts(sets, n: int, seed: int = 0, longest: int = 20) -> list[str]:
    """`n` tool texts (default view): random ones plus the `longest` longest (to exercise truncation)."""
    from toolscout.tool import tool_text

    texts = sorted({tool_text(t) for s in sets for t in s.tools})
    rng = random.Random(seed)
    by_length = sorted(texts, key=len)
    tail = by_length[-longest:] if longest else []
    rest = [t for t in rng.sample(texts, len(texts)) if t not in set(tail)]
    return rest[: max(0, n - len(tail))] + tail


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def latency_ms(fn: Callable[[str], object], queries: Sequence[str], warmup: int = 5) -> dict[str, float]:
    """Call `fn(query)` once per query, one at a time; wall-clock p50/p99/mean in milliseconds, plus
    the process CPU time per call (`cpu_p50_ms`: all threads; far less sensitive to other processes
    competing for the cores than wall time, so a busy machine can be told apart from a slow path)."""
    for q in queries[:warmup]:
        fn(q)
    times, cpu = [], []
    for q in queries:
        start, start_cpu = time.perf_counter(), time.process_time()
        fn(q)
        cpu.append((time.process_time() - start_cpu) * 1000)
        times.append((time.perf_counter() - start) * 1000)
    return {"p50_ms": percentile(times, 50), "p99_ms": percentile(times, 99), "mean_ms": statistics.fmean(times),
            "cpu_p50_ms": percentile(cpu, 50)}


def peak_rss_mb() -> float:
    """High-water resident set size of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def machine_line() -> str:
    load = os.getloadavg()
    return f"cpus={os.cpu_count()} loadavg(1/5/15 min)={load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}"


def write_json(path: str | None, data: dict) -> None:
    if path:
        Path(path).write_text(json.dumps(data, indent=2, default=_plain) + "\n")
        print(f"wrote {path}")


def _plain(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)
