"""Calibrated relevance: each hit's `probability` that its tool is one the task needs.

A hit's score orders one ranking and says little beyond it: the default pipeline divides each list by its
best score, so the top hit scores about 4 for nearly every task, a sure match and a guess alike. The
probability is comparable across tasks and catalogs. It comes from features of the ranking that mean the
same on any catalog (`FEATURES`, made by `ranking_features`):

- the fused score, its share of the best, the rank, and the gap between the first two;
- the dense cosine of the tool and the best cosine in the list (an absolute measure, where the fused score
  is relative), each also above a knee (`COSINE_KNEE`);
- how many requests the task holds (`toolscout.intents.split_intents`), and the rank per request;
- how crowded the top is: tools within 90% of the best score, and how alike the listed tools are (a tool
  whose near twin is listed beside it is less surely the one the task names).

A logistic model maps them to P(relevant) (`eval.calibration.LogisticModel`); down a list the probability
never rises (each is capped by the one above), so it orders hits as their scores do. The model is fitted
offline on the dev sets' train splits, with tasks of one set searched against another set's catalog as
tasks no tool fits, and ships as a small JSON file in `data/calibration/` with the threshold below which
nothing is likely relevant (the chance that one of the best five hits is: `hits.abstains`). `python
scripts/build_calibration.py` rebuilds it; docs/scores.md has the figures on the test splits. A calibration belongs to the pipeline it was fitted for (`applies_to`: the
first stage, its fusion and encoder, no reranker): any other pipeline gets no probabilities.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from .errors import ToolScoutError
from .eval.calibration import LogisticModel
from .intents import split_intents
from .query import Query
from .results import Results
from .retrievers.base import Encoding, Retriever, encoding_parts
from .spec import PipelineSpec

CALIBRATION_DIR = Path(__file__).resolve().parent / "data" / "calibration"
CALIBRATION_KIND = "toolscout.calibration"
CALIBRATION_FORMAT = 1
DEPTH = 10  # the ranking depth the features are computed over (searches rank at least this deep)
COSINE_KNEE = 0.45  # about the median best cosine of a task: above it, cosine counts once more
CROWD = 0.9  # a tool within this share of the best score crowds the top
MAX_REQUESTS = 5
FEATURES = ("score", "relative", "log_rank", "cosine", "best_cosine", "gap", "log_requests", "log_crowd",
            "log_rank_per_request", "redundancy", "top_redundancy", "cosine_over_knee", "best_cosine_over_knee")


def ranking_features(text: str, scores: Sequence[float], cosines: Sequence[float],
                     vectors: np.ndarray) -> np.ndarray:
    """One row of `FEATURES` per hit of one ranking (best first): the task's `text`, the hits' fused
    `scores`, their dense `cosines` with the task, and their tools' dense `vectors` (one row each)."""
    s = np.asarray(scores, dtype=np.float64)
    cos = np.asarray(cosines, dtype=np.float64)
    n = len(s)
    if not n:
        return np.zeros((0, len(FEATURES)))
    rank = np.arange(1, n + 1, dtype=np.float64)
    # the top hit is 1 and crowds itself, even when nothing scored above zero (log(0) made it -inf)
    relative = s / float(s[0]) if s[0] > 0 else np.where(s >= s[0], 1.0, 0.0)
    requests = float(min(max(len(split_intents(text)), 1), MAX_REQUESTS))
    redundancy = _redundancy(np.asarray(vectors, dtype=np.float64))
    best = float(cos.max())
    columns = {
        "score": s, "relative": relative, "log_rank": np.log(rank), "cosine": cos, "best_cosine": best,
        "gap": float(s[0] - (s[1] if n > 1 else 0.0)), "log_requests": np.log(requests),
        "log_crowd": np.log(float((relative >= CROWD).sum())), "log_rank_per_request": np.log(rank) / requests,
        "redundancy": redundancy, "top_redundancy": float(redundancy[0]),
        "cosine_over_knee": np.maximum(0.0, cos - COSINE_KNEE), "best_cosine_over_knee": max(0.0, best - COSINE_KNEE),
    }
    out = np.empty((n, len(FEATURES)))
    for j, name in enumerate(FEATURES):
        out[:, j] = columns[name]
    return out


def _redundancy(vectors: np.ndarray) -> np.ndarray:
    """For each tool, its largest cosine with another tool of the list (0 when it is alone)."""
    if len(vectors) < 2:
        return np.zeros(len(vectors))
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    similar = unit @ unit.T
    np.fill_diagonal(similar, -np.inf)
    return similar.max(axis=1)


def dense_part(retriever: Retriever) -> Encoding | None:
    """The first stage's dense part, whose cosines and tool vectors the features read (None: it has none)."""
    dense = encoding_parts(retriever)
    return dense[0] if dense else None


def features_of(part: Encoding, queries: Sequence[Query], results: Results) -> list[np.ndarray]:
    """`ranking_features` of each query's ranking in `results`, the cosines and vectors read from the first
    stage's dense `part` (its task vectors come from the encoder's query cache: the ranking just made them)."""
    tasks = (part.query_encoder or part.encoder).encode_queries(list(queries))
    out = []
    for query, task, (ids, scores) in zip(queries, tasks, results):
        vectors = part.store.get(list(ids)) if len(ids) else np.zeros((0, len(task)), dtype=np.float32)
        out.append(ranking_features(query.text, scores, vectors @ task, vectors))
    return out


@dataclass(frozen=True)
class Calibration:
    """A fitted relevance model and what it is for. `applies_to`: the `signature` of the pipelines it
    was fitted for; `threshold`: below it a search abstains (on the chance that one of its best hits is
    relevant, `hits.abstains`; chosen on train splits); `about`: how it was made (data, rule, the command
    that rebuilds it)."""

    model: LogisticModel
    threshold: float
    applies_to: Mapping[str, Any]
    about: Mapping[str, Any]

    def __post_init__(self) -> None:
        if tuple(self.model.features) != FEATURES:
            raise ToolScoutError(f"calibration features {list(self.model.features)} are not this version's "
                                 f"{list(FEATURES)}: rebuild it with scripts/build_calibration.py")
        if not 0.0 <= self.threshold <= 1.0:
            raise ToolScoutError(f"calibration threshold must be a probability, got {self.threshold}")

    def probabilities(self, features: np.ndarray) -> np.ndarray:
        """P(relevant) of each hit of one ranking (rows of `FEATURES`, best first), never above the one
        before it."""
        if not len(features):
            return np.zeros(0)
        return np.minimum.accumulate(self.model.predict(features))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": CALIBRATION_KIND, "format_version": CALIBRATION_FORMAT, "applies_to": dict(self.applies_to),
                "threshold": self.threshold, "depth": DEPTH, "model": self.model.to_dict(), "about": dict(self.about)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "calibration") -> "Calibration":
        if data.get("kind") != CALIBRATION_KIND or int(data.get("format_version", 0)) > CALIBRATION_FORMAT:
            raise ToolScoutError(f"{where}: not a calibration this version reads (kind {data.get('kind')!r}, "
                                 f"format {data.get('format_version')!r})")
        try:
            return cls(LogisticModel.from_dict(data["model"]), float(data["threshold"]), dict(data["applies_to"]),
                       dict(data.get("about", {})))
        except (KeyError, TypeError, ValueError) as exc:
            raise ToolScoutError(f"{where}: malformed calibration ({exc})") from None

    @classmethod
    def read(cls, path: Path) -> "Calibration":
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ToolScoutError(f"{path}: cannot read the calibration ({exc})") from None
        return cls.from_dict(data, str(path))


def signature(spec: PipelineSpec) -> dict[str, Any]:
    """What a calibration depends on in a pipeline's spec: the first stage's retrievers, a hybrid's fusion
    and weights, the dense encoder and its summary weight, and whether a reranker reorders the list."""
    return {"first_stage": _node_signature(spec.retriever), "reranker": spec.reranker is not None}


def _node_signature(node: Mapping[str, Any]) -> dict[str, Any]:
    settings = node.get("settings") or {}
    out: dict[str, Any] = {"name": node["name"]}
    if "components" in node:
        out.update(fusion=settings.get("fusion"), weights=[float(w) for w in settings.get("weights") or []],
                   components=[_node_signature(child) for child in node["components"]])
    elif node["name"] == "dense":
        out.update(model=settings.get("model"), summary_weight=float(settings.get("summary_weight", 0.0)))
    return out


def shipped_calibration(spec: PipelineSpec, folder: Path = CALIBRATION_DIR) -> Calibration | None:
    """The calibration shipped for pipelines like `spec`, or None when none was fitted for it."""
    wanted = signature(spec)
    for path in sorted(Path(folder).glob("*.json")):
        calibration = Calibration.read(path)
        if dict(calibration.applies_to) == wanted:
            return calibration
    return None
