"""ToolCLIP first stage (the ToolCLIP paper): tasks through the task tower, tools through the tool tower.

Everything else is the dense machinery: vectors in a store (numpy or FAISS), filters, content hashes so
`add` re-encodes only tools whose parts changed. Tools the model never saw in training are encoded by the
tool tower like any other: adding them needs no retraining, and a catalog of unseen tools works (zero-shot).

`model`: a directory written by `toolscout train toolclip`, or a base encoder name/path (an untrained
ToolCLIP whose towers both start from that encoder; see `toolclip_model`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ..artifacts import ArtifactError, read_json
from ..store.base import VectorStore
from ..tool import Tool
from .base import Accepts
from .dense import DenseRetriever, saved_index


class ToolCLIPRetriever(DenseRetriever):
    name = "toolclip"
    accepts = Accepts(model=True, trained_by="toolclip", store=True)

    def __init__(self, model: str | Path | None = None, store: str = "numpy", batch_size: int = 32,
                 encoder=None, show_progress: bool = False, device: str | None = None, *,
                 vectors: VectorStore | None = None, hashes: Mapping[str, str] | None = None):
        from .toolclip_model import ToolCLIPEncoder, hash_view

        encoder = encoder or ToolCLIPEncoder.load(model, device=device)
        # the view only feeds content hashes: it covers every text the tool tower reads
        super().__init__(store=store, view=hash_view(encoder.config), batch_size=batch_size, encoder=encoder,
                         show_progress=show_progress, summary_weight=0.0,  # the tool tower makes the vectors
                         vectors=vectors, hashes=hashes)

    def _tool_vectors(self, tools: Sequence[Tool], texts: list[str]) -> np.ndarray:
        return self.encoder.encode_tools(tools, batch_size=self.batch_size, show_progress=self.show_progress)

    # persistence ---------------------------------------------------------------------------
    def settings(self) -> dict:
        return {"model": self.encoder.name, "weights_sha": self.encoder.weights_sha, "store_kind": self.store_kind,
                "batch_size": self.batch_size}

    @classmethod
    def load(cls, folder: Path, device: str | None = None) -> "ToolCLIPRetriever":
        from .toolclip_model import ToolCLIPEncoder

        config = read_json(folder / "config.json")
        encoder = ToolCLIPEncoder.load(config["model"], device=device)
        if config.get("weights_sha") != encoder.weights_sha:
            raise ArtifactError(f"{folder}: the index was built with model {config['model']} whose weights have "
                                "changed since (it was retrained or replaced); rebuild the index with the current model")
        return cls(encoder=encoder, **saved_index(folder, config, default_batch_size=32))
