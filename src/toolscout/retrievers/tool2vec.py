"""Tool2Vec (the Tool2Vec paper §4.1): a tool's vector is the mean embedding of the user requests that used it.

Blend, for a tool with usage queries q_1..q_n (unit embeddings) and description embedding d:

    v = normalise( Σ q_i + prior · d )

`prior` is how many queries the description is worth. prior = 0 is the paper's plain mean; a small
prior keeps rarely used tools near their description, and a tool with no usage at all is exactly its
description vector (so unseen tools are still searchable). `add_usage` folds new requests (training
data or logged traffic) into a tool's vector without retraining anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ..artifacts import load_array, read_json
from ..encoders import Encoder
from ..models import model_config
from ..store.base import VectorStore
from ..tool import TextView, Tool
from .base import Accepts
from .dense import DenseRetriever, encoder_for, saved_index


class UsageTable:
    """Per tool: the sum and count of the unit embeddings of the requests that used it."""

    def __init__(self, dim: int):
        self.dim = dim
        self.sums: dict[str, np.ndarray] = {}
        self.counts: dict[str, int] = {}

    def add(self, tool_id: str, vectors: np.ndarray) -> None:
        if len(vectors) == 0:
            return
        self.sums[tool_id] = self.sums.get(tool_id, np.zeros(self.dim, dtype=np.float32)) + vectors.sum(axis=0)
        self.counts[tool_id] = self.counts.get(tool_id, 0) + len(vectors)

    def __contains__(self, tool_id: str) -> bool:
        return tool_id in self.sums

    def blended(self, tool_id: str, description: np.ndarray, prior: float) -> np.ndarray:
        """The Tool2Vec paper's blend: normalise(prior · d/‖d‖ + Σ q_i), at the description's length; a
        tool nobody used is its description. (ToolRefiner's carried vectors are made here too.)"""
        if tool_id not in self.sums:
            return description
        length = float(np.linalg.norm(description))
        mixed = prior * description / max(length, 1e-12) + self.sums[tool_id]
        return (length * mixed / max(float(np.linalg.norm(mixed)), 1e-12)).astype(np.float32)

    def save(self, path: Path) -> None:
        ids = sorted(self.sums)
        np.savez(path, ids=np.asarray(ids, dtype=str),
                 sums=np.stack([self.sums[i] for i in ids]) if ids else np.zeros((0, self.dim), np.float32),
                 counts=np.asarray([self.counts[i] for i in ids], dtype=np.int64))

    @classmethod
    def load(cls, path: Path, dim: int) -> "UsageTable":
        table = cls(dim)
        data = load_array(path)
        for tid, vec, n in zip(data["ids"], data["sums"], data["counts"]):
            table.sums[str(tid)], table.counts[str(tid)] = vec.astype(np.float32), int(n)
        return table


class Tool2VecRetriever(DenseRetriever):
    """Usage-driven tool vectors over the dense machinery (stores, filters, content hashes).

    `model`: an encoder name/path, or a directory written by `toolscout train tool2vec` (its encoder,
    possibly fine-tuned, and the usage it learned from training queries). `usage`: more requests per tool
    id to learn from. `usage_table`, `descriptions`, `vectors`, `hashes`: a saved index's state (`load`).
    """

    name = "tool2vec"
    accepts = Accepts(model=True, trained_by="tool2vec", needs_trained_model=True, store=True, view=True)

    def __init__(self, model: str | None = None, usage: Mapping[str, Sequence[str]] | None = None,
                 prior: float | None = None, store: str = "numpy", view: TextView | None = None,
                 batch_size: int = 64, encoder: Encoder | None = None, show_progress: bool = False, *,
                 usage_table: UsageTable | None = None, descriptions: Mapping[str, np.ndarray] | None = None,
                 vectors: VectorStore | None = None, hashes: Mapping[str, str] | None = None):
        trained = model_config(model, method="tool2vec")
        encoder_name = model
        table_file = None
        if trained is not None:
            folder, config = trained
            encoder_name = str(folder / "encoder") if config.get("finetuned") else config.get("encoder")
            table_file = folder / "usage.npz"
            prior = config.get("prior", 1.0) if prior is None else prior
            view = view or TextView.from_dict(config.get("view"))
        super().__init__(model=None if encoder else encoder_name, store=store, view=view,
                         batch_size=batch_size, encoder=encoder, show_progress=show_progress,
                         summary_weight=0.0,  # the prior was chosen against single-view description vectors
                         vectors=vectors, hashes=hashes)
        self.prior = 1.0 if prior is None else float(prior)
        if usage_table is None:
            usage_table = UsageTable.load(table_file, self.encoder.dim) if table_file else UsageTable(self.encoder.dim)
        self.usage = usage_table
        self.descriptions: dict[str, np.ndarray] = dict(descriptions or {})  # tool id -> its description vector
        if usage:
            for tool_id, queries in usage.items():
                self.usage.add(tool_id, self.encoder.encode(list(queries), batch_size=batch_size))

    def _blend(self, tool_id: str, description: np.ndarray) -> np.ndarray:
        return self.usage.blended(tool_id, description, self.prior)

    def _tool_vectors(self, tools: Sequence[Tool], texts: list[str]) -> np.ndarray:
        descriptions = super()._tool_vectors(tools, texts)
        for tool, vec in zip(tools, descriptions):
            self.descriptions[tool.id] = vec
        return np.stack([self._blend(t.id, d) for t, d in zip(tools, descriptions)])

    def remove(self, ids: Sequence[str]) -> None:
        super().remove(ids)
        for tool_id in ids:
            self.descriptions.pop(tool_id, None)

    def add_usage(self, tool_id: str, queries: Sequence[str]) -> None:
        """Fold requests known to need `tool_id` into its vector (no retraining)."""
        if tool_id not in self.descriptions:
            raise KeyError(f"no tool with id {tool_id!r} in this index")
        self.usage.add(tool_id, self.encoder.encode(list(queries), batch_size=self.batch_size))
        blended = self._blend(tool_id, self.descriptions[tool_id])[None, :]
        self.store.update_vectors([tool_id], blended)

    def reblend(self, prior: float) -> None:
        """Use `prior` from now on and recompute every stored vector with it (nothing is re-encoded)."""
        self.prior = float(prior)
        ids = list(self.descriptions)
        if ids:
            blended = np.stack([self._blend(i, self.descriptions[i]) for i in ids])
            self.store.update_vectors(ids, blended)

    # persistence ---------------------------------------------------------------------------
    def settings(self) -> dict:
        return {**super().settings(), "prior": self.prior}

    def save(self, folder: Path) -> None:
        super().save(folder)
        self.usage.save(folder / "usage.npz")
        ids = list(self.descriptions)
        np.savez(folder / "descriptions.npz", ids=np.asarray(ids, dtype=str),
                 vectors=np.stack([self.descriptions[i] for i in ids]) if ids else np.zeros((0, self.encoder.dim)))

    @classmethod
    def load(cls, folder: Path) -> "Tool2VecRetriever":
        config = read_json(folder / "config.json")
        encoder = encoder_for(config["model"], backend=config.get("encoding", "exact"))
        data = load_array(folder / "descriptions.npz")
        return cls(encoder=encoder, prior=config.get("prior", 1.0), view=TextView.from_dict(config.get("view")),
                   usage_table=UsageTable.load(folder / "usage.npz", encoder.dim),
                   descriptions={str(i): v.astype(np.float32) for i, v in zip(data["ids"], data["vectors"])},
                   **saved_index(folder, config, default_batch_size=64))
