"""The ONNX backend at run time: an exported encoder folder run with onnxruntime."""

from __future__ import annotations

import json
import logging
import threading
from importlib.util import find_spec
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np

from ..artifacts import replace_file
from ..defaults import usable_cores

logger = logging.getLogger(__name__)

SPLIT_LAYER_NORM = "layer_norm_split"  # meta.json: model.onnx already is `runtime_graph`'s graph (a shipped export)
CASE_PROBE = "Send An Email To Bob About The Q3 Report"


def same_tokens(tokenize) -> bool:
    """Whether `tokenize` reads a text the same in either letter case (its tokenizer lowercases, as the
    default model's does): then a text's vector does not depend on its case."""
    return list(tokenize(CASE_PROBE)) == list(tokenize(CASE_PROBE.lower()))


class OnnxEncoder:
    """Runs an exported encoder folder (`model.onnx`, `tokenizer.json`, `meta.json`) with onnxruntime.

    Thread-safe: the tokenizer is configured once and only read afterwards, and onnxruntime sessions
    accept concurrent `run` calls. `threads` (onnxruntime's intra-op threads; default: one per core,
    one for an int8 graph), `spin` and `arena` are onnxruntime session settings.

    An int8 graph encodes every text in a run of its own (`per_text`). Its activations are quantised
    with one scale per tensor, computed from the whole batch, so in a batch each text's vector would
    depend on the texts beside it (cosine ~0.993 to its own vector alone, measured on metatool
    queries): a query would rank differently with and without concurrent traffic. Alone it is the
    same every time, and no slower: int8 gains nothing from batching here (3.3 ms per toollens query
    alone or in batches of 16, one thread; tool texts 3.7 ms alone, 6.7 batched, padding included).
    Many texts (an index build) run on `workers` threads, one single-threaded run each.
    """

    def __init__(self, folder: Path, max_seq_length: int | None = None, threads: int | None = None,
                 spin: bool = False, arena: bool = False, max_batch_tokens: int = 4096,
                 workers: int | None = None):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        folder = Path(folder)
        self.folder = folder
        self.meta = json.loads((folder / "meta.json").read_text())
        self.per_text = str(self.meta.get("graph", "")).startswith("int8")
        if self.per_text and not threads:
            threads = 1  # parallelism comes from running texts side by side (`workers`)
        self.workers = max(1, int(workers or usable_cores()))
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.dim = int(self.meta["dim"])
        limit = int(max_seq_length or self.meta["max_seq_length"])
        if self.meta.get("max_positions"):
            limit = min(limit, int(self.meta["max_positions"]))
        self.max_seq_length = limit
        self.max_batch_tokens = int(max_batch_tokens)
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=limit, strategy="longest_first",
                                         direction=self.meta["truncation_side"])
        self._session_settings = (spin, arena)
        self.session = self._new_session(threads)
        # a long text alone runs on every core (`session_for`); built on first use
        self._wide = None if not self.per_text or usable_cores() < 2 else False
        self.input_names = list(self.meta["inputs"])
        self.case_blind = same_tokens(lambda text: self.tokenizer.encode(text).ids)
        self.output_names = [o.name for o in self.session.get_outputs()]  # "tokens" since export format 3

    def _new_session(self, threads: int | None):
        import onnxruntime as ort

        spin, arena = self._session_settings
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        # Idle worker threads that spin steal the cores the vector scan right after needs (measured on a
        # 2-core box); without the arena, memory taken by a large indexing batch goes back to the OS.
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        options.enable_cpu_mem_arena = arena
        graph = self.folder / "model.onnx"
        return ort.InferenceSession(str(graph) if self.meta.get(SPLIT_LAYER_NORM) else runtime_graph(graph), options,
                                    providers=["CPUExecutionProvider"])

    # An int8 text at least this long, encoded in the calling thread, runs on every core: one thread takes
    # a 256-token task ~28 ms on two EPYC cores, two ~17 ms; short texts gain nothing (3.1 against 3.0 ms
    # at 30 tokens), so they stay on one thread and concurrent searches keep the other core.
    WIDE_FROM_TOKENS = 128

    def session_for(self, encoding, wide: bool = True):
        """The session that runs `encoding` alone in the calling thread: a long text under int8 gets one
        with every core (its vectors are bit-identical to one thread's: integer products, same order),
        made on first use (`wide=False`: never; the second session costs ~30 MB for MiniLM)."""
        if not wide or self._wide is None or len(encoding.ids) < self.WIDE_FROM_TOKENS:
            return self.session
        with self._pool_lock:
            if self._wide is False:
                self._wide = self._new_session(usable_cores())
            return self._wide

    def _feeds(self, encodings: list) -> dict[str, np.ndarray]:
        width = max(len(e.ids) for e in encodings)
        n = len(encodings)
        pad_id, pad_type = int(self.meta["pad_id"]), int(self.meta["pad_type_id"])
        ids = np.full((n, width), pad_id, dtype=np.int64)
        mask = np.zeros((n, width), dtype=np.int64)
        types = np.full((n, width), pad_type, dtype=np.int64)
        left = self.meta["padding_side"] == "left"
        for row, e in enumerate(encodings):
            cols = slice(width - len(e.ids), width) if left else slice(0, len(e.ids))
            ids[row, cols] = e.ids
            mask[row, cols] = e.attention_mask
            types[row, cols] = e.type_ids
        feeds = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return {name: feeds[name] for name in self.input_names}

    def encode(self, texts: Sequence[str], batch_size: int = 64, show_progress: bool = False,
               wide: bool = True) -> np.ndarray:
        """Unit rows of `texts`. `wide=False`: a long int8 text alone stays on one thread (the same vectors;
        for checks that should not make the second session)."""
        texts = [str(t) for t in texts]
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        encodings = self.tokenizer.encode_batch(texts)
        if len(encodings) == 1:
            vectors = self.session_for(encodings[0], wide).run(["embedding"], self._feeds(encodings))[0]
            return np.ascontiguousarray(vectors, dtype=np.float32)
        if self.per_text:
            return self._encode_each(encodings, show_progress, wide)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        batches = self._batches([len(e.ids) for e in encodings], max(1, int(batch_size)))
        if show_progress:
            from tqdm.auto import tqdm

            batches = tqdm(batches, desc="encoding", unit="batch")
        for rows in batches:
            out[rows] = self.session.run(["embedding"], self._feeds([encodings[i] for i in rows]))[0]
        return out

    # Fewer texts than this (a server's batch of searches) run in the calling thread: concurrent searches
    # already keep the cores busy, and handing a few short runs to other threads costs more than it saves.
    POOLED_FROM = 16

    def _encode_each(self, encodings: list, show_progress: bool, wide: bool = True) -> np.ndarray:
        """One run per text, on `workers` threads (onnxruntime releases the GIL while it runs)."""
        def one(encoding, session=None) -> np.ndarray:
            return (session or self.session).run(["embedding"], self._feeds([encoding]))[0][0]

        if self.workers == 1 or len(encodings) < self.POOLED_FROM:
            rows = (one(e, self.session_for(e, wide)) for e in encodings)
        else:  # the pool's threads already use every core: one thread each
            rows = self._executor().map(one, encodings)
        if show_progress:
            from tqdm.auto import tqdm

            rows = tqdm(rows, total=len(encodings), desc="encoding", unit="text")
        return np.ascontiguousarray(np.stack(list(rows)), dtype=np.float32)

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="toolscout-encode")
            return self._pool

    # One run costs about as much as this many more padded tokens, whatever its size (mostly reading the
    # weights; MiniLM on a 2-core Xeon: ~4 ms per run + ~0.28 ms per padded token, single-threaded).
    RUN_COST_TOKENS = 16
    PLANNED_UP_TO = 256  # texts per call split by cost (below); larger calls (indexing) take full batches

    def _batches(self, lengths: list[int], batch_size: int) -> list[np.ndarray]:
        """Rows longest first (like sentence-transformers: similar lengths waste less padding), at most
        `batch_size` per batch and at most `max_batch_tokens` padded tokens, which bounds the memory
        of a batch of long texts (attention grows with batch x length^2) without slowing short ones.
        A small call (a server's batch of concurrent queries, mixed lengths) is cut where that costs
        least: padding a short query to a long one's length costs more than a run of its own."""
        order = np.argsort([-n for n in lengths], kind="stable")
        if len(order) <= self.PLANNED_UP_TO:
            return self._planned_batches([max(1, lengths[i]) for i in order], order, batch_size)
        batches, start = [], 0
        while start < len(order):
            width = max(1, lengths[order[start]])
            size = max(1, min(batch_size, self.max_batch_tokens // width))
            batches.append(order[start:start + size])
            start += size
        return batches

    def _planned_batches(self, widths: list[int], order: np.ndarray, batch_size: int) -> list[np.ndarray]:
        """Contiguous runs of `order` (widths longest first) with the least estimated cost: per run,
        RUN_COST_TOKENS + rows x the run's first (largest) width; the same limits as `_batches`."""
        n = len(widths)
        best = [0.0] + [float("inf")] * n  # best[j]: cost of rows [0, j)
        cut = [0] * (n + 1)
        for j in range(1, n + 1):
            for i in range(j - 1, max(-1, j - batch_size - 1), -1):
                rows = j - i
                if rows > 1 and rows * widths[i] > self.max_batch_tokens:
                    break
                cost = best[i] + self.RUN_COST_TOKENS + rows * widths[i]
                if cost < best[j]:
                    best[j], cut[j] = cost, i
        batches, j = [], n
        while j > 0:
            batches.append(order[cut[j]:j])
            j = cut[j]
        return batches[::-1]


def split_layer_norms(folder: Path) -> None:
    """Rewrite an export's model.onnx as the graph onnxruntime runs (`runtime_graph`) and mark it so in its
    meta.json: loading it then needs no `onnx` package and no rewrite (an export is written once, loaded at
    every start of every server). Without `onnx` here it is left as it is, unmarked."""
    if find_spec("onnx") is None:
        return
    graph = runtime_graph(folder / "model.onnx")
    if isinstance(graph, bytes):  # each file replaced whole: a process loading it meanwhile reads either graph
        replace_file(folder / "model.onnx", graph)
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    meta[SPLIT_LAYER_NORM] = True
    replace_file(folder / "meta.json", json.dumps(meta, indent=2))


def split_once(folder: Path) -> None:
    """`split_layer_norms` for an export cached before exports were stored split, unless another process did it
    first; where the cache cannot be written the graph stays as it is (`runtime_graph` splits it at each load)."""
    try:
        if not is_split(folder):
            split_layer_norms(folder)
    except OSError as exc:
        logger.info("ONNX export %s: left as it is (%s); split at each load instead", folder, exc)


def is_split(folder: Path) -> bool:
    """Whether an export's model.onnx is stored as onnxruntime runs it (`split_layer_norms`)."""
    return bool(json.loads((Path(folder) / "meta.json").read_text(encoding="utf-8")).get(SPLIT_LAYER_NORM))


def runtime_graph(path: Path) -> str | bytes:
    """The graph onnxruntime runs for an exported `model.onnx`: the file itself, or, for a graph fused by
    the transformer optimizer, the same graph with each SkipLayerNormalization node split back into
    Add (+ Add bias) + LayerNormalization. The sums are the same float additions in the same order; the
    normalisation differs by float rounding only (embeddings within 2e-7). onnxruntime's fused CPU
    kernel costs 3x the pair (measured: 323 vs 106 us on 43k values), 7-12% of a query's encoding time
    on a 2-core Xeon. An export written into the cache is stored so already (`split_layer_norms`); here the
    file on disk is left as it is, and without the `onnx` package the file is run."""
    try:
        import onnx
        from onnx import helper
    except ImportError:
        return str(path)
    model = onnx.load(str(path))
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    if opset < 17 or not any(n.op_type == "SkipLayerNormalization" for n in model.graph.node):
        return str(path)
    nodes = []
    for node in model.graph.node:
        outputs = [o for o in node.output if o]
        if node.op_type != "SkipLayerNormalization" or node.domain != "com.microsoft" \
                or len(outputs) != 1 or node.output[0] != outputs[0]:
            nodes.append(node)
            continue
        x, skip, gamma = node.input[:3]
        beta = node.input[3] if len(node.input) > 3 else ""
        bias = node.input[4] if len(node.input) > 4 else ""
        epsilon = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-12)  # the contrib op's default
        total = f"{node.name}/skip_sum"
        nodes.append(helper.make_node("Add", [x, skip], [total], name=f"{node.name}/add_skip"))
        if bias:
            nodes.append(helper.make_node("Add", [total, bias], [f"{total}_bias"], name=f"{node.name}/add_bias"))
            total = f"{total}_bias"
        norm_inputs = [total, gamma] + ([beta] if beta else [])
        nodes.append(helper.make_node("LayerNormalization", norm_inputs, outputs, name=f"{node.name}/layer_norm",
                                      axis=-1, epsilon=epsilon))
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model.SerializeToString()
