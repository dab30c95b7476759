"""Shared helpers for the benchmark scripts: the real data in ../shared/data, timing, and printing."""

from __future__ import annotations

import hashlib
import json
import os
import random
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
# the labelled dev sets the quality checks rank (each against its own catalog), and the two nothing was
# trained on (the zero-shot check)
DEV_SETS = ("apibank", "bfcl", "gorilla_huggingface", "gorilla_torchhub", "metatool", "rotbench", "sealtools", "toollens")
ZERO_SHOT = ("bfcl", "gorilla_huggingface")
DEFAULT_EMBEDDINGS = Path(tempfile.gettempdir()) / "toolscout-scale" / "embeddings.npz"


def benchmark_folders(data_dir: Path) -> list[Path]:
    folders = sorted(p.parent for p in Path(data_dir).glob("*/tools.jsonl"))
    if not folders:
        raise SystemExit(f"no benchmark folders (*/tools.jsonl) under {data_dir}; pass --data DIR")
    return folders


def load_sets(data_dir: Path):
    from toolscout.benchmark_sets import load_benchmark

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


# ---------------------------------------------------------------------- encoding and quality checks

class CachingEncoder:
    """Wraps an `Encoder`: vectors of texts seen before come from an on-disk cache (keyed by the model
    name and a hash of the text), the rest are encoded and added. Call `flush()` to write the cache."""

    def __init__(self, encoder: Any, folder: str | os.PathLike):
        self.encoder = encoder
        self.name = encoder.name
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.backend_in_use = getattr(encoder, "backend_in_use", None)  # what an index built with it records
        tag = hashlib.sha1(f"{encoder.name}|{getattr(encoder, 'path', '')}|{self.backend_in_use}".encode()).hexdigest()[:12]
        self._file = self.folder / f"{tag}.npz"
        self._index: dict[str, int] = {}
        self._vectors = np.zeros((0, encoder.dim), dtype=np.float32)
        if self._file.exists():
            with np.load(self._file) as data:
                keys, vectors = list(data["keys"]), data["vectors"]
            if len(keys) == len(vectors):
                self._index = {str(k): i for i, k in enumerate(keys)}
                self._vectors = vectors
        self._dirty = False

    @property
    def dim(self) -> int:
        return self.encoder.dim

    @staticmethod
    def _key(text: str) -> str:
        return hashlib.sha1(text.encode("utf-8")).hexdigest()

    def encode(self, texts: Sequence[str], batch_size: int = 64, show_progress: bool = False) -> np.ndarray:
        keys = [self._key(t) for t in texts]
        missing = list(dict.fromkeys(k for k in keys if k not in self._index))
        if missing:
            first = {k: t for k, t in zip(reversed(keys), reversed(list(texts)))}
            vectors = self.encoder.encode([first[k] for k in missing], batch_size=batch_size, show_progress=show_progress)
            start = len(self._vectors)
            self._vectors = np.concatenate([self._vectors, vectors.astype(np.float32)])
            self._index.update({k: start + i for i, k in enumerate(missing)})
            self._dirty = True
        return self._vectors[[self._index[k] for k in keys]]

    def encode_queries(self, queries: Sequence) -> np.ndarray:
        """As the wrapped `Encoder`'s: transcripts weigh in their latest turn (`toolscout.conversation`);
        a request cut from a task is embedded alone (the cache is keyed by text: no late chunking)."""
        from toolscout.conversation import emphasise_latest_turn
        from toolscout.query import as_queries

        queries = as_queries(queries)
        return emphasise_latest_turn(self.encode([q.text for q in queries]), [q.latest_turn for q in queries],
                                     self.encode, self.encoder.latest_turn_weight)

    def flush(self) -> None:
        """Write the cache (one file, replaced atomically: concurrent runs cannot leave it half written)."""
        if not self._dirty:
            return
        keys = np.array(sorted(self._index, key=self._index.get))
        tmp = self._file.with_name(f".{self._file.stem}.{os.getpid()}.tmp.npz")
        np.savez(tmp, keys=keys, vectors=self._vectors)
        os.replace(tmp, self._file)
        self._dirty = False



def encode_ms(encode: Callable[[list[str]], object], tasks: Sequence[str]) -> float:
    """Median milliseconds of `encode([task])` over `tasks` (bypass any query cache first)."""
    times = []
    for task in tasks:
        start = time.perf_counter()
        encode([task])
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def ndcg_per_set(encoder, folders: list[Path], max_queries: int | None, system: str = "dense",
                 fast_queries: bool = False) -> dict[str, float]:
    """nDCG@10 per set of the dense retriever alone (`system="dense"`: where an encoding's change shows
    most) or of the default pipeline with this encoder (`"default"`: what users get); `fast_queries`:
    tasks through the static table distilled from the encoder."""
    from toolscout.eval import evaluate
    from toolscout.pipeline import ToolScout

    options = {"retriever": "dense", "intents": None} if system == "dense" else {}

    def build(tools):
        scout = ToolScout.from_tools(tools, encoder=encoder, **options)
        return scout.use_fast_queries() if fast_queries else scout

    report = evaluate(folders, build, k=10, progress=False, max_queries=max_queries)
    return {name: s.metrics["ndcg@10"] for name, s in report.sets.items()}


def print_check_table(title: str, check: dict) -> None:
    """An `encoders.quality.verdict` as a markdown table: each set's exact and faster figure."""
    print(f"{title}\n\n| set | exact | int8 | delta |\n|---|---|---|---|")
    for name, row in check["per_set"].items():
        print(f"| {name} | {row['exact']:.2f} | {row['fast']:.2f} | {row['fast'] - row['exact']:+.2f} |")
    print(f"| macro | {check['macro_exact']:.2f} | {check['macro_fast']:.2f} | {check['macro_delta']:+.2f} |\n")


# ------------------------------------------------------------------- synthetic large catalogs

def build_catalog(data_dir: Path, n_tools: int):
    """(tools, queries-by-set, description): the real tools, then mirrored copies up to `n_tools`."""
    sets = load_sets(data_dir)
    originals = [t.with_changes(id=f"{s.name}/{t.id}", namespace=s.name) for s in sets for t in s.tools]
    tools = list(originals[:n_tools])
    copy = 0
    while len(tools) < n_tools:
        copy += 1
        ns = f"mirror{copy}"
        need = n_tools - len(tools)
        tools.extend(t.with_changes(id=f"{ns}/{t.id}", namespace=ns) for t in originals[:need])
    note = (f"{len(tools):,} tools = {min(len(originals), n_tools):,} real tools from {len(sets)} sets"
            + (f" + {len(tools) - len(originals):,} re-namespaced copies (mirror1..mirror{copy})" if copy else ""))
    return tools, sets, note


class DedupingEncoder:
    """An Encoder stand-in for DenseRetriever that embeds each distinct text once.

    Vectors are kept by content hash; `preload` fills them from a saved file. Query encoding goes
    straight to the real encoder (it is what the latency numbers measure).
    """

    def __init__(self, encoder):
        self.inner = encoder
        self.name, self.path, self.dim = encoder.name, encoder.path, encoder.dim
        self.vectors: dict[str, np.ndarray] = {}
        self.rows_seen = self.unique_seen = self.embedded = 0
        self.embed_seconds = 0.0

    def encode(self, texts, batch_size: int = 64, show_progress: bool = False) -> np.ndarray:
        from toolscout.tool import content_hash

        hashes = [content_hash(t) for t in texts]
        missing = {h: t for h, t in zip(hashes, texts) if h not in self.vectors}
        self.rows_seen += len(texts)
        self.unique_seen += len(set(hashes))
        if missing:
            start = time.perf_counter()
            vectors = self.inner.encode(list(missing.values()), batch_size=batch_size, show_progress=show_progress)
            self.embed_seconds += time.perf_counter() - start
            self.embedded += len(missing)
            self.vectors.update(zip(missing, vectors))
        return np.stack([self.vectors[h] for h in hashes]) if hashes else np.zeros((0, self.dim), np.float32)

    def encode_queries(self, queries) -> np.ndarray:
        return self.inner.encode_queries(queries)

    def save(self, path: Path, key: str, seconds_per_text: float) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        np.savez(tmp, hashes=np.array(list(self.vectors)), vectors=np.stack(list(self.vectors.values())),
                 meta=np.array(json.dumps({"key": key, "seconds_per_text": seconds_per_text})))
        os.replace(tmp, path)

    def preload(self, path: Path, key: str) -> dict | None:
        if not path.exists():
            return None
        data = np.load(path)
        meta = json.loads(str(data["meta"]))
        if meta.get("key") != key:
            print(f"  (embeddings file {path} is for another model/backend: ignored)", file=sys.stderr)
            return None
        self.vectors.update(zip(data["hashes"].tolist(), data["vectors"]))
        return meta


def encoder_key(encoder) -> str:
    """Which model and backend made a set of vectors (the embeddings file is only reused for the same)."""
    from toolscout.encoders.cache import folder_fingerprint

    folder = Path(encoder.path)
    source = folder_fingerprint(folder) if folder.is_dir() else encoder.path
    return hashlib.sha256(f"{encoder.backend_in_use}\n{source}".encode()).hexdigest()[:16]


# ------------------------------------------------------------------ MCP upstreams for the gateway benchmarks

STUB = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "mcp_stub.py"


def deal_tools(tools, servers: int, work: Path, python: str = sys.executable) -> dict:
    """Deal `tools` (toolscout Tools) to `servers` stub MCP servers over stdio (tests/fixtures/mcp_stub.py, run
    by `python`: each serves its share of the tool list and answers a call by echoing it), by a stable hash
    of each id; write each server's tool list and the gateway config (an `mcpServers` file). A server cannot
    list one name twice: such duplicates are dropped. Returns {"tools": n, "config", "servers", "lists",
    "gateway_id": {tool id: SERVER.name}}."""
    names = [f"s{i:02d}" for i in range(servers)]
    lists: dict[str, list] = {n: [] for n in names}
    gateway_id: dict[str, str] = {}
    for tool in tools:
        server = names[int(hashlib.sha256(tool.id.encode()).hexdigest(), 16) % servers]
        if any(t["name"] == tool.name for t in lists[server]):
            continue
        lists[server].append({"name": tool.name, "description": tool.description, "inputSchema": stub_schema(tool)})
        gateway_id[tool.id] = f"{server}.{tool.name}"
    mcp_servers = {}
    work.mkdir(parents=True, exist_ok=True)
    for server, listed in lists.items():
        path = work / f"{server}.json"
        path.write_text(json.dumps(listed))
        mcp_servers[server] = {"command": python, "args": [str(STUB), server, "--tools", str(path), "--no-builtins"]}
    (work / "servers.json").write_text(json.dumps({"mcpServers": mcp_servers}))
    return {"tools": len(gateway_id), "config": work / "servers.json", "servers": names, "lists": lists,
            "gateway_id": gateway_id}


def deal_catalog(folder: Path, servers: int, work: Path, max_queries: int | None) -> dict:
    """A benchmark folder's tools dealt to `servers` stub servers (`deal_tools`), with its test tasks and their
    gold labels as gateway ids (SERVER.name); tasks whose gold tools were all dropped are left out."""
    from toolscout.benchmark_sets import load_benchmark

    bench = load_benchmark(folder)
    dealt = deal_tools(bench.tools, servers, work)
    ids = dealt["gateway_id"]
    tasks = [(q.text, [ids[t] for t in q.labels if t in ids]) for q in bench.split("test")]
    return {**dealt, "set": bench.name, "tasks": [(text, gold) for text, gold in tasks if gold][:max_queries]}


def stub_schema(tool) -> dict:
    """The tool's parameters as an MCP input schema: an object (some sets write BFCL's "dict")."""
    parameters = dict(tool.parameters or {})
    parameters["type"] = "object"
    parameters.setdefault("properties", {})
    return parameters
