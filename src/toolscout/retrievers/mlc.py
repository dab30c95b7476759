"""MLC (the Tool2Vec paper §4.2): tool retrieval as multi-label classification, as a first stage.

A model directory written by `toolscout train mlc` holds a fine-tuned encoder and a linear head with
one row per tool seen in training labels. Every catalog tool gets a *linear score in the query
embedding* e(q) (unit vector from the fine-tuned encoder):

    logit_t(q) = w_t · e(q) + b_t          score_t(q) = sigmoid(logit_t(q)) = P(tool t is needed)

- **Known tools** (in the model's tool list, matched by id): w_t, b_t are the trained head row.
- **Unknown tools** (never in a training label), `fallback="dense"` (the default): a dense retriever
  over the same fine-tuned encoder, cosine between e(q) and the tool's text-view embedding d_t,
  mapped to a probability by Platt scaling fitted at training time:

      logit_t(q) = a · cos(e(q), d_t) + c,   i.e.  w_t = a · d_t,  b_t = c

  `a` and `c` are fitted by logistic regression of "is t a gold tool of q" on the cosine, over the
  validation queries × the known tools (whose labels are known), so a fallback score estimates the same
  quantity as a head score, P(needed | query), and the two merge into one ranking. The fitted values are
  in the model's `config.json` (`fallback_calibration`). On a catalog the model never saw, the ranking
  is exactly dense retrieval with the fine-tuned encoder (the map is monotonic).
- `fallback=None`: unknown tools are not scored and never returned. `unscored_ids` lists them.

Whenever `index`/`add` meet tools the head does not know, a warning (`warnings.warn`) says how many of the
catalog's tools the head scores and what scores the rest (DESIGN §4: unseen tools cannot be scored — say so).

Ranking uses the logits (float32 sigmoids saturate at 1.0 for logits above ~17 and would tie); the
returned scores are the probabilities. Identity is by tool id only: a known tool whose description
changed keeps its trained head row.

A saved retriever (inside a pipeline directory) refers to the model directory by absolute path and
stores the catalog rows and the unknown tools' embeddings; loading checks that the model directory
still holds the version it was indexed with (a retrained model needs a re-index).
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..artifacts import ArtifactError, load_array, read_json, read_json_lines, write_json
from ..encoders import Encoder
from ..models import model_config
from ..query import Query, as_queries
from ..results import Filter, Results, top_k_rows
from ..rows import RowTable
from ..tool import TextView, Tool, content_hash, tool_text
from .base import Accepts, write_retriever_config

logger = logging.getLogger(__name__)
ENCODER_FOLDER = "encoder"
HEAD_FILE = "head.npz"
FALLBACKS = ("dense", None)


class MLCModel:
    """The contents of an MLC model directory: encoder, head rows by tool id, fallback calibration."""

    def __init__(self, path: str | Path, device: str | None = None, backend: str = "auto",
                 encoder: Encoder | None = None):
        trained = model_config(path, method="mlc")
        if trained is None:
            raise ArtifactError(f"{path}: not an MLC model directory; MLC needs a trained model: run "
                                "`toolscout train mlc --data SET_DIR --out DIR` and pass --model DIR")
        folder, config = trained
        self.root = Path(path).resolve()
        self.version = folder.name
        self.config = config
        self.encoder = encoder or Encoder.load(str(folder / ENCODER_FOLDER), device=device, backend=backend)
        head = load_array(folder / HEAD_FILE)
        self.tool_ids: list[str] = [str(t) for t in head["ids"]]
        self.weight = np.ascontiguousarray(head["weight"], dtype=np.float32)
        self.bias = np.ascontiguousarray(head["bias"], dtype=np.float32)
        if self.weight.shape != (len(self.tool_ids), self.encoder.dim) or self.bias.shape != (len(self.tool_ids),):
            raise ArtifactError(f"{path}: head of shape {self.weight.shape} does not match {len(self.tool_ids)} "
                                f"tools × encoder dimension {self.encoder.dim}")
        self.row_of = {tid: i for i, tid in enumerate(self.tool_ids)}
        calibration = config.get("fallback_calibration") or {}
        self.slope = float(calibration.get("slope", 20.0))
        self.intercept = float(calibration.get("intercept", -10.0))
        self.view = TextView.from_dict(config.get("view"))


class MLCRetriever:
    """First stage from a trained MLC model (see the module doc for how unknown tools are scored).

    `model`: a directory written by `toolscout train mlc` (required). `fallback`: 'dense' (score unknown
    tools by calibrated cosine, the default) or None (leave them unscored). `backend`: the encoder
    backend for queries and unknown tools ('auto' uses ONNX on a CPU when available).
    """

    name = "mlc"
    accepts = Accepts(model=True, trained_by="mlc", needs_trained_model=True, view=True)

    def __init__(self, model: str | Path | None = None, fallback: str | None = "dense", view: TextView | None = None,
                 batch_size: int = 64, backend: str = "auto", device: str | None = None,
                 encoder: Encoder | None = None, show_progress: bool = False):
        if model is None:
            raise ValueError("the mlc retriever needs a trained model directory: run `toolscout train mlc "
                             "--data SET_DIR --out DIR`, then pass model=DIR (CLI: --model DIR)")
        if fallback == "none":
            fallback = None
        if fallback not in FALLBACKS:
            raise ValueError(f"fallback must be 'dense' or None, got {fallback!r}")
        self.model = MLCModel(model, device=device, backend=backend, encoder=encoder)
        self.encoder = self.model.encoder
        self.fallback = fallback
        self.view = view or self.model.view
        self.batch_size = batch_size
        self.backend = backend
        self.show_progress = show_progress
        self.rows = RowTable()
        self.descriptions: dict[str, np.ndarray] = {}  # unknown tools only: text-view embedding
        self.hashes: dict[str, str] = {}  # unknown tools only: hash of the embedded text
        self.encoded_last = 0
        self._rebuild()

    def __len__(self) -> int:
        return len(self.rows)

    # catalog -------------------------------------------------------------------------------
    def index(self, tools: Sequence[Tool]) -> None:
        """The catalog, whole: how much of it the trained head knows is a warning (`_unknown_note`)."""
        self.rows = RowTable()
        self.descriptions, self.hashes = {}, {}
        self._add(tools)
        note = self._unknown_note()
        if note:
            warnings.warn(note, stacklevel=2)

    def add(self, tools: Sequence[Tool]) -> None:
        """Tools joining a served catalog: the head's coverage is logged (a warning per write would flood a
        server's log; `index` warned of the catalog it started with)."""
        if self._add(tools):
            logger.info("%s", self._unknown_note())

    def _add(self, tools: Sequence[Tool]) -> int:
        """Add or update `tools`; how many of them the trained head does not know."""
        for tool in tools:
            row = self.rows.row_of.get(tool.id)
            if row is None:
                self.rows.append(tool.id, tool.namespace)
            else:
                self.rows.set_namespace(row, tool.namespace)
        unknown = [t for t in tools if t.id not in self.model.row_of]
        self.encoded_last = 0
        if unknown and self.fallback == "dense":
            texts = {t.id: tool_text(t, self.view) for t in unknown}
            changed = [t for t in unknown if self.hashes.get(t.id) != content_hash(texts[t.id])]
            if changed:
                vectors = self.encoder.encode([texts[t.id] for t in changed], batch_size=self.batch_size,
                                              show_progress=self.show_progress)
                for tool, vec in zip(changed, vectors):
                    self.descriptions[tool.id] = vec
                    self.hashes[tool.id] = content_hash(texts[tool.id])
            self.encoded_last = len(changed)
        self._rebuild()
        return len(unknown)

    def remove(self, ids: Sequence[str]) -> None:
        rows = [self.rows.row_of[t] for t in ids if t in self.rows.row_of]
        if rows:
            self.rows.remove_rows(rows)
        for tool_id in ids:
            self.descriptions.pop(tool_id, None)
            self.hashes.pop(tool_id, None)
        self._rebuild()

    def _unknown_note(self) -> str | None:
        """How much of the catalog the trained head scores, when it does not know every tool: on a catalog the
        model never saw, "mlc" is dense retrieval, and a result must not pass for the classifier's."""
        known = sum(1 for tool_id in self.rows.ids if tool_id in self.model.row_of)
        rest = len(self.rows) - known
        if not rest:
            return None
        head = (f"the MLC head knows {known} of the catalog's {len(self.rows)} tools (it was trained on the labels of "
                f"{len(self.model.tool_ids)} tools)")
        if self.fallback is None:
            return (f"{head}; the other {rest} cannot be scored (fallback=None) and are never returned (see "
                    "`unscored_ids`)")
        return (f"{head}; the other {rest} are scored by dense retrieval with its fine-tuned encoder (calibrated "
                "cosine), not by the classifier")

    @property
    def unscored_ids(self) -> list[str]:
        """Catalog tools that get no score (unknown to the model and fallback=None); never returned."""
        return [tid for tid, ok in zip(self.rows.ids, self._scored) if not ok]

    @property
    def fallback_ids(self) -> list[str]:
        """Catalog tools scored by the calibrated dense fallback rather than the trained head."""
        return [tid for tid in self.rows.ids if tid not in self.model.row_of and tid in self.descriptions]

    def _rebuild(self) -> None:
        """One (n_rows × dim) weight matrix and bias vector for the catalog, in row order."""
        m = self.model
        n, dim = len(self.rows), self.encoder.dim
        weights = np.zeros((n, dim), dtype=np.float32)
        biases = np.zeros(n, dtype=np.float32)
        scored = np.zeros(n, dtype=bool)
        for row, tool_id in enumerate(self.rows.ids):
            head_row = m.row_of.get(tool_id)
            if head_row is not None:
                weights[row], biases[row], scored[row] = m.weight[head_row], m.bias[head_row], True
            elif tool_id in self.descriptions:
                weights[row] = np.float32(m.slope) * self.descriptions[tool_id]
                biases[row], scored[row] = m.intercept, True
        self._weights, self._biases, self._scored = weights, biases, scored

    # search --------------------------------------------------------------------------------
    def logits(self, queries: Sequence[Query | str]) -> np.ndarray:
        """(n_queries × n_rows) log-odds that each catalog tool is needed; -inf for unscored tools."""
        # plain embeddings, as `train mlc` fitted the head on (not encode_queries' transcript emphasis)
        vectors = self.encoder.encode([q.text for q in as_queries(queries)], batch_size=64)
        out = vectors @ self._weights.T + self._biases
        out[:, ~self._scored] = -np.inf
        return out

    def search(self, queries: Sequence[Query | str], k: int = 10, filter: Filter | None = None) -> Results:
        queries = as_queries(queries)
        if not len(self.rows) or not len(queries):
            return Results.empty(len(queries))
        logits = self.logits(queries)
        mask = self.rows.mask(filter)
        if mask is not None:
            logits[:, ~mask] = -np.inf
        top = top_k_rows(logits, k)
        ids, scores = [], []
        for q in range(len(queries)):
            rows = top[q]
            row_logits = logits[q, rows]
            rows = rows[np.isfinite(row_logits)]
            ids.append(self.rows.id_array[rows])
            scores.append(_sigmoid(logits[q, rows]))
        return Results(tuple(ids), tuple(scores))

    # persistence ---------------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        folder = Path(folder)
        write_retriever_config(folder, self.name, **self.settings())
        with open(folder / "rows.jsonl", "w", encoding="utf-8") as fh:
            for tool_id, namespace in zip(self.rows.ids, self.rows.namespaces):
                fh.write(json.dumps({"id": tool_id, "namespace": namespace}) + "\n")
        ids = list(self.descriptions)
        np.savez(folder / "descriptions.npz", ids=np.asarray(ids, dtype=str),
                 vectors=np.stack([self.descriptions[i] for i in ids]) if ids
                 else np.zeros((0, self.encoder.dim), dtype=np.float32))
        write_json(folder / "hashes.json", self.hashes)

    def settings(self) -> dict[str, Any]:
        """What `save` records besides the rows and the unknown tools' vectors."""
        return {"model": str(self.model.root), "model_version": self.model.version, "fallback": self.fallback,
                "view": self.view.to_dict(), "batch_size": self.batch_size, "backend": self.backend}

    @classmethod
    def load(cls, folder: Path) -> "MLCRetriever":
        folder = Path(folder)
        config = read_json(folder / "config.json")
        model_dir = Path(config["model"])
        if not model_dir.exists():
            raise ArtifactError(f"{folder}: its MLC model directory {model_dir} no longer exists; "
                                "restore it or re-index the catalog with --retriever mlc --model DIR")
        trained = model_config(model_dir, method="mlc")
        live = trained[0].name if trained else None
        if live != config.get("model_version"):  # checked before loading any weights
            raise ArtifactError(f"{folder}: was indexed with version {config.get('model_version')} of the MLC model "
                                f"{model_dir}, which now holds {live or 'no MLC model'} (retrained?); re-index the catalog")
        retriever = cls(model=model_dir, fallback=config.get("fallback"), view=TextView.from_dict(config.get("view")),
                        batch_size=config.get("batch_size", 64), backend=config.get("backend", "auto"))
        rows = read_json_lines(folder / "rows.jsonl")
        retriever.rows = RowTable([r["id"] for r in rows], [r["namespace"] for r in rows])
        data = load_array(folder / "descriptions.npz")
        retriever.descriptions = {str(i): v.astype(np.float32) for i, v in zip(data["ids"], data["vectors"])}
        retriever.hashes = read_json(folder / "hashes.json")
        retriever._rebuild()
        return retriever

    def describe(self) -> dict[str, Any]:
        """What the index holds: how many tools the head scores, the fallback scores, and none scores."""
        known = sum(1 for tid in self.rows.ids if tid in self.model.row_of)
        return {"tools": len(self.rows), "head": known, "fallback": len(self.fallback_ids),
                "unscored": len(self.unscored_ids), "model_tools": len(self.model.tool_ids)}


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + np.exp(-x.astype(np.float64)))).astype(np.float32)
