"""Training data: labelled queries from benchmark folders, with a validation split carved from train.

Validation queries are chosen by a hash of (set, query id), so the split is the same on every machine
and every run, and never touches a set's test split.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from ..benchmark_sets import BenchmarkSet, Query, load_benchmark
from ..errors import ToolScoutError
from ..tool import Tool


@dataclass
class TrainingData:
    """Tools of every given set, and their labelled train / validation queries."""

    tools: dict[str, Tool]
    train: list[Query]
    validation: list[Query]
    sets: list[str] = field(default_factory=list)

    def usage(self, queries: Sequence[Query] | None = None) -> dict[str, list[str]]:
        """tool id → the texts of the queries that used it."""
        out: dict[str, list[str]] = {}
        for q in self.train if queries is None else queries:
            for label in q.labels:
                out.setdefault(label, []).append(q.text)
        return out

    @property
    def labelled_tool_ids(self) -> list[str]:
        """Tools that appear in at least one training label, in catalog order."""
        used = {label for q in self.train for label in q.labels}
        return [tid for tid in self.tools if tid in used]

    def identity(self) -> dict:
        """What a checkpoint records of the data it was trained on: the sets, and a digest of their tools and
        train queries (so a set edited under the same name, or another --validation-fraction, differs too)."""
        digest = hashlib.sha256()
        for tid in self.tools:
            digest.update(tid.encode() + b"\x00")
        for q in self.train:
            digest.update("\x00".join([q.id, q.text, *q.labels]).encode() + b"\x01")
        return {"sets": list(self.sets), "digest": digest.hexdigest()[:16]}

    def summary(self) -> dict:
        return {"sets": self.sets, "tools": len(self.tools), "train_queries": len(self.train),
                "validation_queries": len(self.validation)}


def in_validation(set_name: str, query_id: str, fraction: float) -> bool:
    digest = hashlib.sha256(f"{set_name}\x00{query_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < fraction


def load_training_data(sets: Iterable[str | Path | BenchmarkSet], validation_fraction: float = 0.1,
                       max_validation: int | None = 2000, require_train: bool = True) -> TrainingData:
    """Gather the train splits of `sets`. A set without train queries still contributes its tools."""
    if not 0 <= validation_fraction < 1:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction}")
    tools: dict[str, Tool] = {}
    train: list[Query] = []
    validation: list[Query] = []
    names = []
    for item in sets:
        bench = item if isinstance(item, BenchmarkSet) else load_benchmark(item)
        names.append(bench.name)
        for tool in bench.tools:
            if tool.id in tools:
                raise ToolScoutError(f"tool id {tool.id!r} appears in two training sets (second: {bench.name})")
            tools[tool.id] = tool
        for q in bench.split("train"):
            (validation if in_validation(bench.name, q.id, validation_fraction) else train).append(q)
        validation.extend(bench.split("validation"))
    if require_train and not train:
        raise ToolScoutError(f"no train-split queries in {', '.join(names)}; training needs labelled queries")
    if max_validation is not None and len(validation) > max_validation:
        # keep the choice deterministic: lowest hashes first
        validation.sort(key=lambda q: hashlib.sha256(q.id.encode()).hexdigest())
        validation = validation[:max_validation]
    return TrainingData(tools, train, validation, names)
