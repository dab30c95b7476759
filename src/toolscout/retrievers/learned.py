"""What dense retrievers learn from use (`toolscout.feedback`), folded into tool vectors with no retraining.

A taught tool's vector is `toolscout.feedback.blend` of its own vector (description, summary blend,
trained usage: whatever the retriever makes) and the embeddings of the requests that used it; a tool
never taught keeps its own vector, bit for bit. The sums are kept per (tool, source) and added up in
source order whenever a vector is made, so taking a source back (`forget`) leaves exactly the vector
the tool would have had without it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..feedback import USAGE_PRIOR, blend


class LearnedVectors:
    """Per tool and source, the sum and count of the embeddings of the requests that taught the tool, and
    each taught tool's own vector (to blend again after an edit, or to restore when all is forgotten)."""

    def __init__(self, prior: float = USAGE_PRIOR):
        if not prior > 0:
            raise ValueError(f"usage prior must be > 0, got {prior}")
        self.prior = float(prior)
        self.sums: dict[str, dict[str, np.ndarray]] = {}
        self.counts: dict[str, dict[str, int]] = {}
        self.own: dict[str, np.ndarray] = {}

    def __contains__(self, tool_id: str) -> bool:
        return tool_id in self.sums

    def __len__(self) -> int:
        return len(self.sums)

    def add(self, tool_id: str, source: str, vector: np.ndarray) -> None:
        sums = self.sums.setdefault(tool_id, {})
        counts = self.counts.setdefault(tool_id, {})
        vector = np.asarray(vector, dtype=np.float32)
        sums[source] = sums[source] + vector if source in sums else vector.copy()
        counts[source] = counts.get(source, 0) + 1

    def forget(self, tool_id: str, source: str) -> None:
        self.sums.get(tool_id, {}).pop(source, None)
        self.counts.get(tool_id, {}).pop(source, None)
        if not self.sums.get(tool_id):
            self.sums.pop(tool_id, None)
            self.counts.pop(tool_id, None)

    def drop(self, tool_id: str) -> None:
        self.sums.pop(tool_id, None)
        self.counts.pop(tool_id, None)
        self.own.pop(tool_id, None)

    def count(self, tool_id: str) -> int:
        return sum(self.counts.get(tool_id, {}).values())

    def vector(self, tool_id: str, own: np.ndarray) -> np.ndarray:
        """The vector to store for `tool_id` whose own vector is `own` (see the module doc)."""
        sums = self.sums.get(tool_id)
        if not sums:
            return own
        return blend(own, [sums[source] for source in sorted(sums)], self.prior)

    # persistence ---------------------------------------------------------------------------
    def save(self, path: Path) -> None:
        rows = [(t, s) for t in sorted(self.sums) for s in sorted(self.sums[t])]
        dim = next((v.shape[0] for v in self.own.values()), 0)
        np.savez(path, prior=np.float64(self.prior),
                 tools=np.asarray([t for t, _s in rows], dtype=str), sources=np.asarray([s for _t, s in rows], dtype=str),
                 sums=np.stack([self.sums[t][s] for t, s in rows]) if rows else np.zeros((0, dim), np.float32),
                 counts=np.asarray([self.counts[t][s] for t, s in rows], dtype=np.int64),
                 own_ids=np.asarray(sorted(self.own), dtype=str),
                 own=np.stack([self.own[t] for t in sorted(self.own)]) if self.own else np.zeros((0, dim), np.float32))

    @classmethod
    def load(cls, path: Path) -> "LearnedVectors":
        data = np.load(path)
        learned = cls(float(data["prior"]))
        for tool_id, source, vector, count in zip(data["tools"], data["sources"], data["sums"], data["counts"]):
            learned.sums.setdefault(str(tool_id), {})[str(source)] = vector.astype(np.float32)
            learned.counts.setdefault(str(tool_id), {})[str(source)] = int(count)
        learned.own = {str(t): v.astype(np.float32) for t, v in zip(data["own_ids"], data["own"])}
        return learned
