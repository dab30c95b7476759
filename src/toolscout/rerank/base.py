"""The second-stage contract: a reranker reorders a first stage's candidates for each query.

A reranker never adds or drops a tool: for every query it returns exactly the candidate ids it was
given, reordered, with its own scores (higher is better). `ToolScout` hands it the first stage's top
`depth` candidates and cuts the reranked list to k.

A query the reranker cannot judge (an LLM call failed) keeps the first stage's list as it came: the same
ids in the same order with the first stage's scores (`judged_or_kept`), never numbers of the reranker's
own, and a `errors.DegradedResults` warning says so. Its hits are then the first stage's in every way: a
`min_score` means what it means without the reranker, and the pipeline gives them the first stage's
calibrated probabilities (`kept_first_stage` tells such a list apart). `judged_or_kept` also says why, per
query, in the Results' `degraded` (the reranker's reason, e.g. the LLM's first error for the task); the
pipeline carries that to each task's answer, so a caller sees which tasks the reranker did not rank.

Three rerankers are registered:
  `cross`   — a cross-encoder (Tool-Rank) fine-tuned by `toolscout train cross`;
  `refiner` — ToolRefiner (the Tool2Vec paper §4.3), trained by `toolscout train refiner`;
  `llm`     — an OpenAI-compatible chat model asked "does this tool meet the task?" (P(true)).

Saved rerankers: `save(folder)` writes a `config.json` of kind `toolscout.reranker` naming the class;
a trained model directory (kind `toolscout.model`, method `cross` or `refiner`) loads directly too.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from ..artifacts import ArtifactError, read_config, read_json, write_json
from ..errors import InvalidRequest
from ..models import MODEL_KIND, model_config
from ..registry import lookup
from ..results import Degraded, Results
from ..tool import Tool

RERANKER_KIND = "toolscout.reranker"
FORMAT_VERSION = 1
DEFAULT_DEPTH = 20

REGISTRY: dict[str, str] = {
    "cross": "toolscout.rerank.cross:CrossEncoderReranker",
    "refiner": "toolscout.rerank.refiner:ToolRefinerReranker",
    "llm": "toolscout.rerank.llm:LLMReranker",
}


@runtime_checkable
class Reranker(Protocol):
    name: str
    depth: int  # how many first-stage candidates it wants per query
    settings: tuple[str, ...]  # the keyword settings `load(folder, **settings)` accepts (checked by `load_reranker`)

    def rerank(self, queries: Sequence[str], candidates: Results, tools: Mapping[str, Tool],
               first_stage: Any = None) -> Results:
        """Reorder each query's candidates. `tools` maps every candidate id to its Tool; `first_stage`
        is the retriever that produced them (a reranker may reuse its vectors)."""
        ...

    def save(self, folder: Path) -> None:
        """Write a `config.json` of kind `toolscout.reranker` (and whatever else it needs) into `folder`."""

    @classmethod
    def load(cls, folder: Path, **options: Any) -> "Reranker":
        """The reranker `save` wrote into `folder`; `options` (e.g. depth=32) override saved settings."""


def reranker_class(name: str):
    return lookup("reranker", name, REGISTRY)


def write_reranker_config(folder: Path, name: str, **config: Any) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_json(folder / "config.json", {"kind": RERANKER_KIND, "format_version": FORMAT_VERSION,
                                        "reranker": name, **config})


def load_reranker(path: str | Path, **options: Any) -> Reranker:
    """A reranker from a `toolscout train cross|refiner` model directory, or from a saved reranker folder.
    `options` (e.g. depth=32) override the saved settings; a setting the reranker does not have is an
    error that lists the ones it has."""
    trained = model_config(path)
    if trained is not None:
        method = trained[1].get("method")
        if method not in REGISTRY:
            raise ArtifactError(f"{path}: is a {method!r} model, which is a first stage, not a reranker; "
                                f"rerankers: {', '.join(REGISTRY)}")
        cls = reranker_class(method)
        return cls(model=str(Path(path).resolve()), **checked_settings(cls, options, path))
    folder, config = read_config(path, kind=RERANKER_KIND, max_format=FORMAT_VERSION)
    cls = reranker_class(config["reranker"])
    return cls.load(folder, **checked_settings(cls, options, path))


def reranker_config(reranker: Reranker) -> dict[str, Any]:
    """The `config.json` the reranker's `save` writes: all a pipeline's saved configuration keeps of it
    (every reranker saves a reference: its trained model directory's path, or its LLM endpoint's settings
    without the key), and all `reranker_from_config` needs to make it again."""
    with tempfile.TemporaryDirectory(prefix="toolscout-reranker-") as folder:
        reranker.save(Path(folder))
        files = sorted(p.name for p in Path(folder).iterdir())
        if files != ["config.json"]:
            raise ArtifactError(f"the {reranker.name} reranker saves {files}, not a reference in one config.json: "
                                "a pipeline's configuration cannot hold it")
        return read_json(Path(folder) / "config.json")


def reranker_from_config(config: Mapping[str, Any]) -> Reranker:
    """The reranker `config` (what `reranker_config` gave) refers to, loaded as its class's `load` loads a
    saved reranker folder."""
    with tempfile.TemporaryDirectory(prefix="toolscout-reranker-") as folder:
        write_json(Path(folder) / "config.json", dict(config))
        return load_reranker(folder)


def checked_settings(cls: Any, options: dict[str, Any], where: Any) -> dict[str, Any]:
    """`options` when every key is one of `cls.settings`; else InvalidRequest naming the stranger."""
    unknown = sorted(set(options) - set(cls.settings))
    if unknown:
        raise InvalidRequest(f"{where}: {', '.join(unknown)} is not a setting of the {cls.name} reranker "
                             f"(its settings: {', '.join(cls.settings)})")
    return options


def check_candidates(queries: Sequence[str], candidates: Results) -> None:
    if len(queries) != len(candidates):
        raise ValueError(f"{len(queries)} queries but candidates for {len(candidates)}")


def reorder(ids: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sort one query's candidates by score, best first; ties keep the first stage's order (stable)."""
    scores = np.asarray(scores, dtype=np.float32)
    order = np.argsort(-scores, kind="stable")
    return np.asarray(ids, dtype=object)[order], scores[order]


def zscores(scores) -> np.ndarray:
    """Scores standardised within one query's list (mean 0, std 1; all-equal scores give zeros), so that
    scores on different scales (a logit, a cosine, BM25, RRF) can be mixed."""
    scores = np.asarray(scores, dtype=np.float64)
    if scores.size == 0:
        return scores
    std = scores.std()
    return (scores - scores.mean()) / std if std > 1e-12 else np.zeros_like(scores)


def fuse_with_first_stage(own: np.ndarray, first_stage: np.ndarray, weight: float) -> np.ndarray:
    """(1 − weight)·z(own) + weight·z(first stage), per query. weight 0 keeps the reranker's order; the
    first stage's score carries evidence the reranker does not see (lexical overlap, usage vectors), so
    a small weight often helps a reranker that has seen little training data."""
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"first_stage_weight must be in [0, 1], got {weight}")
    if weight == 0.0:
        return np.asarray(own, dtype=np.float64)
    return (1.0 - weight) * zscores(own) + weight * zscores(first_stage)


def reordered(per_query: Sequence[tuple[np.ndarray, np.ndarray]]) -> Results:
    pairs = [reorder(ids, scores) for ids, scores in per_query]
    return Results(tuple(p[0] for p in pairs), tuple(p[1] for p in pairs))


def judged_or_kept(candidates: Results, judged: Sequence[np.ndarray | None],
                   kept_because: Sequence[Degraded | None] | None = None) -> Results:
    """Each query's candidates reordered by the reranker's scores `judged[q]`, or, where it could not judge
    the query (None), kept as the first stage gave them: ids, order and scores (the module doc's rule), with
    why in the Results' `degraded` (`kept_because[q]`, or that the reranker could not judge the task)."""
    lists = [(ids, scores) if own is None else reorder(ids, own) for (ids, scores), own in zip(candidates, judged)]
    why = kept_because or [None] * len(judged)
    degraded = tuple(None if own is not None else because or _UNJUDGED for own, because in zip(judged, why))
    return Results(tuple(np.asarray(ids, dtype=object) for ids, _ in lists),
                   tuple(np.asarray(scores, dtype=np.float32) for _, scores in lists), degraded)


_UNJUDGED = Degraded("reranker", "it could not judge this task, so the first stage's ranking is kept")


def kept_first_stage(reranked: Results, candidates: Results) -> list[bool]:
    """Per query, whether the reranker kept the first stage's list (`judged_or_kept`): the same ids with
    the same scores. Scores of its own never equal them all: they are on another scale."""
    return [len(ids) == len(first_ids) and np.array_equal(ids, first_ids)
            and np.array_equal(np.asarray(scores, np.float32), np.asarray(first_scores, np.float32))
            for (ids, scores), (first_ids, first_scores) in zip(reranked, candidates)]


__all__ = ["Reranker", "REGISTRY", "RERANKER_KIND", "DEFAULT_DEPTH", "reranker_class", "load_reranker",
           "write_reranker_config", "reranker_config", "reranker_from_config", "checked_settings",
           "check_candidates", "reorder", "reordered", "judged_or_kept", "kept_first_stage", "zscores",
           "fuse_with_first_stage", "MODEL_KIND"]
