"""Dense first stage: one encoder for queries and tool texts; a score is a cosine (or, with the
summary blend, a weighted mean of two cosines)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ..artifacts import load_array, read_json, write_json
from ..encoders import Encoder
from ..encoders.contract import QueryEncoder
from ..models import model_config
from ..query import Query
from ..results import Filter, Results
from ..store.base import VectorStore
from ..store.local import load_store, make_store
from ..tool import TextView, Tool, content_hash, tool_text
from .base import Accepts, write_retriever_config

LEARNED_FILE = "learned.npz"  # indexes saved before learning became its own channel: the taught tools' own vectors


def encoder_for(model: str | Path | None, **options) -> Encoder:
    """The Encoder for `model`: a sentence-transformers name or folder, or a model directory written by
    `toolscout train embed` (its fine-tuned `encoder/` folder). `options` go to `Encoder.load`.

    For a model directory the encoder's `name` is the directory's absolute path, so a saved index
    records the directory (not one version folder inside it) and reloads whatever version is live.
    """
    trained = model_config(model, method="embed")
    if trained is None:
        return Encoder.load(None if model is None else str(model), **options)
    folder, config = trained
    encoder = Encoder.load(str(folder / config.get("encoder", "encoder")), **options)
    encoder.name = str(Path(model).resolve())
    return encoder


def encoding_of(encoder) -> str:
    """The kind of encoding that made an index's vectors, as a backend to search it with: "onnx-int8", or
    "exact" for the float32 encodings (ONNX or torch: the same vectors). Indexes saved before this was
    recorded are "exact": int8 was never chosen for them."""
    return "onnx-int8" if getattr(encoder, "backend_in_use", None) == "onnx-int8" else "exact"


SUMMARY_WEIGHT = 0.3  # the best on train-split validation queries (benchmarks/views.py --summary-weight)


def summary_view(view: TextView) -> TextView:
    """The short second text embedded for each tool (see DenseRetriever): the parts of `view` that say
    what the tool is (name, description), without the parameter list, tags, category, profile or usage.
    A view reading plain descriptions summarises by their first sentence: a long description otherwise
    drowns the name, which is what a task most often matches."""
    lead = "lead" if view.descriptions == "plain" else view.descriptions
    return replace(view, parameters=False, tags=False, category=False, profile_fields=(), usage=0, descriptions=lead)


def trained_view(model: str | Path | None) -> TextView | None:
    """The text view a `toolscout train embed` directory was trained with (None for a plain encoder)."""
    trained = model_config(model, method="embed")
    return None if trained is None else TextView.from_dict(trained[1].get("view"))


def default_summary_weight(model: str | Path | None) -> float:
    """`SUMMARY_WEIGHT` for a pretrained encoder. For a `train embed` directory, the weight it records: 0 for
    weights it trained (on one view), its starting model's when the run was discarded and kept those (so it
    ranks as its starting model does); 0 for a directory from before the weight was recorded."""
    trained = model_config(model, method="embed")
    return SUMMARY_WEIGHT if trained is None else float(trained[1].get("summary_weight", 0.0))


def vector_hash(tool: Tool, view: TextView, text: str, summary_weight: float) -> str:
    """Content hash of everything a tool's dense vector is made from (`text`: its text under `view`):
    equal hashes mean a stored vector is still valid. Without a summary it is the hash of the text
    alone, as before summaries existed, so older indexes keep their vectors."""
    if not summary_weight:
        return content_hash(text)
    summary = tool_text(tool, summary_view(view))
    return content_hash(f"{text}\x00summary {float(summary_weight)!r}\x00{summary}")


def embed_tools(encoder, tools: Sequence[Tool], view: TextView, texts: Sequence[str], summary_weight: float,
                batch_size: int = 64, show_progress: bool = False):
    """Dense vectors of `tools` (`texts`: their text under `view`): (e(text) + w·e(summary)) / (1 + w).

    Dividing by 1 + w keeps a score a weighted mean of two cosines, in [−1, 1] like a plain cosine
    (`min_score` thresholds keep their meaning); it does not change any ranking. A tool whose summary
    is its whole text (no parameters, tags or profile) keeps its one embedding.
    """
    vectors = encoder.encode(list(texts), batch_size=batch_size, show_progress=show_progress)
    if not summary_weight or not len(tools):
        return vectors
    short = summary_view(view)
    summaries = [tool_text(t, short) for t in tools]
    differ = [i for i, (summary, text) in enumerate(zip(summaries, texts)) if summary != text]
    blended = np.array(vectors, dtype=np.float32, copy=True)
    if differ:
        extra = encoder.encode([summaries[i] for i in differ], batch_size=batch_size)
        blended[differ] = (vectors[differ] + summary_weight * extra) / (1.0 + summary_weight)
    return blended


class DenseRetriever:
    """Embeds each tool's text view once; re-embeds a tool only when its text changes (content hash).

    `model`: any sentence-transformers name or folder (default: toolscout's default encoder), or a model directory
    written by `toolscout train embed` (its fine-tuned encoder and, unless `view` is given, its text view).
    `store`: 'numpy' for exact search (default) or 'faiss:FACTORY', e.g. 'faiss:HNSW32'.

    `summary_weight` w: a tool's vector is (e(full text) + w·e(summary)) / (1 + w), from the unit
    vectors of its text view and of a short summary (the view's name and description, `summary_view`),
    so a query scores (cos(full) + w·cos(summary)) / (1 + w). Why: for a tool with many parameters the
    parameter list dominates one embedding of the whole text, and a task usually names what the tool
    does, not its arguments. It is one vector per tool, so search costs the same; indexing embeds the
    short text too. Default `SUMMARY_WEIGHT` (0.3, chosen on validation) for a pretrained encoder; for a
    `train embed` directory the one it records (`default_summary_weight`): 0 for an encoder trained on the
    single view.
    """

    name = "dense"
    accepts = Accepts(model=True, trained_by="embed", store=True, view=True, encoder=True)
    summary_weight = 0.0  # what subclasses that make their own vectors (and their `load`) rely on

    def __init__(self, model: str | None = None, store: str = "numpy", view: TextView | None = None,
                 batch_size: int = 64, encoder: Encoder | None = None, show_progress: bool = False,
                 summary_weight: float | None = None, *, vectors: VectorStore | None = None,
                 hashes: Mapping[str, str] | None = None):
        """`vectors` and `hashes`: an index already built (a loaded store of kind `store` and the content
        hash of each of its tools); without them the index starts empty."""
        self.encoder = encoder or encoder_for(model)
        self.store_kind = store
        source = model if encoder is None else encoder.name
        self.view = view or trained_view(source) or TextView()
        if summary_weight is None:
            summary_weight = default_summary_weight(source)
        if not summary_weight >= 0:
            raise ValueError(f"summary_weight must be >= 0, got {summary_weight}")
        self.summary_weight = float(summary_weight)
        self.batch_size = batch_size
        self.show_progress = show_progress
        self.store = vectors if vectors is not None else make_store(store, self.encoder.dim)
        self.hashes: dict[str, str] = dict(hashes or {})
        self.encoded_last = 0  # tools embedded by the last index/add call (re-embedding is the cost)
        self.query_encoder: QueryEncoder | None = None  # what encodes tasks at search time when not `encoder` (`use_fast_queries`)

    def __len__(self) -> int:
        return len(self.store)

    def index(self, tools: Sequence[Tool]) -> None:
        self.store = make_store(self.store_kind, self.encoder.dim)
        self.hashes = {}
        self.add(tools)

    def add(self, tools: Sequence[Tool]) -> None:
        texts = {t.id: tool_text(t, self.view) for t in tools}
        hashes = {t.id: vector_hash(t, self.view, texts[t.id], self.summary_weight) for t in tools}
        changed = [t for t in tools if self.hashes.get(t.id) != hashes[t.id]]
        moved = [t for t in tools if t.id in self.hashes and self.hashes[t.id] == hashes[t.id]]
        if changed:
            vectors = self._tool_vectors(changed, [texts[t.id] for t in changed])
            self.store.upsert([t.id for t in changed], vectors, [t.namespace for t in changed])
        if moved:  # same text, maybe a new namespace: keep the vector, refresh the metadata
            self.store.upsert([t.id for t in moved], self.store.get([t.id for t in moved]),
                              [t.namespace for t in moved])
        self.hashes.update({t.id: hashes[t.id] for t in changed})
        self.encoded_last = len(changed)

    def put(self, tools: Sequence[Tool], vectors: np.ndarray, hashes: Sequence[str]) -> None:
        """Insert or replace tools whose vectors were made elsewhere (a shared PostgreSQL index made them),
        with their content hashes: stored as they are, nothing embedded here."""
        self.store.upsert([t.id for t in tools], vectors, [t.namespace for t in tools])
        self.hashes.update({t.id: h for t, h in zip(tools, hashes)})

    def _tool_vectors(self, tools: Sequence[Tool], texts: list[str]):
        """Vectors for tools whose text changed (subclasses blend in other evidence)."""
        return embed_tools(self.encoder, tools, self.view, texts, self.summary_weight, self.batch_size,
                           self.show_progress)

    def remove(self, ids: Sequence[str]) -> None:
        self.store.delete(ids)
        for tid in ids:
            self.hashes.pop(tid, None)

    def search(self, queries: Sequence[Query | str], k: int = 10, filter: Filter | None = None) -> Results:
        vectors = (self.query_encoder or self.encoder).encode_queries(queries)  # the contract reads plain strings
        return self.store.search(vectors, k, filter)

    def use_fast_queries(self, kind: str = "table") -> None:
        """Encode tasks at search time with the fast tier `kind` distilled from this retriever's encoder
        ("table" or "student", `encoders/fast.py`); tool vectors and learning keep the encoder. Raises
        FastQueriesUnavailable (saying why) when that tier cannot serve the encoder."""
        from ..encoders.fast import fast_queries_for

        self.query_encoder = fast_queries_for(self.encoder, kind)

    # persistence ---------------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        store_config = self.store.save(folder / "store")
        write_retriever_config(folder, self.name, store=store_config, **self.settings())
        write_json(folder / "hashes.json", self.hashes)

    def settings(self) -> dict:
        """What `save` records besides the store and the hashes (subclasses add their own settings)."""
        return {"model": self.encoder.name, "view": self.view.to_dict(), "store_kind": self.store_kind,
                "batch_size": self.batch_size, "summary_weight": self.summary_weight,
                "encoding": encoding_of(self.encoder)}

    @classmethod
    def load(cls, folder: Path) -> "DenseRetriever":
        config = read_json(folder / "config.json")
        return cls.from_settings(config, **saved_index(folder, config, default_batch_size=64))

    @classmethod
    def from_settings(cls, settings: Mapping, *, encoder: Encoder | None = None, **index) -> "DenseRetriever":
        """The retriever `settings` (what `settings()` gave) describe: its encoder (or `encoder`, one already
        loaded for that model), view and summary weight; `index`: an index already built (`vectors`,
        `hashes`, `store`, `batch_size`)."""
        encoder = encoder or encoder_for(settings["model"], backend=settings.get("encoding", "exact"))
        index.setdefault("batch_size", settings.get("batch_size", 64))
        return cls(encoder=encoder, view=TextView.from_dict(settings.get("view")),
                   summary_weight=float(settings.get("summary_weight", 0.0)),  # indexes saved before it: none
                   **index)


def saved_index(folder: Path, config: Mapping, default_batch_size: int) -> dict:
    """The constructor arguments that restore what a dense-style retriever saved in `folder` (`config`:
    its config.json): the store kind, the filled store, its tools' content hashes and the batch size."""
    vectors = load_store(folder / "store", config["store"])
    _restore_own_vectors(folder, vectors)
    return {"store": config["store_kind"], "vectors": vectors,
            "hashes": read_json(folder / "hashes.json"), "batch_size": config.get("batch_size", default_batch_size)}


def _restore_own_vectors(folder: Path, vectors: VectorStore) -> None:
    """An index saved while feedback moved tool vectors keeps each taught tool's own vector aside: put it
    back (learning is its own channel now, `toolscout.learning`; the requests are in the pipeline's ledger)."""
    learned = folder / LEARNED_FILE
    if not learned.exists():
        return
    data = load_array(learned)
    for tool_id, own in zip(data["own_ids"], data["own"]):
        try:
            vectors.update_vectors([str(tool_id)], own[None, :].astype(np.float32))
        except KeyError:  # a tool removed since: nothing to restore
            continue
