"""Heavier learning from use, opt-in: train a model on the feedback a pipeline has accumulated, and keep
it only when held-back feedback says it ranks better.

    result = retrain(scout, "mlc", workdir)        # or "refiner", "embed"
    if result.improved:
        scout = result.scout                         # the same catalog and feedback, with the new model

The taught requests (`ToolScout.ledger`) become labelled queries: each request with the tools it taught.
A hash of the request holds `holdout` of them back. Two pipelines learn live from the rest, the same way:
the baseline (the pipeline as it is) and the candidate (the pipeline with the trained model:

- `embed`: its encoder fine-tuned on the requests (`fit_embed`), every tool embedded again;
- `mlc`: a multi-label classifier over the taught tools (`fit_mlc`) in place of its dense retriever;
- `refiner`: a ToolRefiner (`fit_refiner`) as its second stage).

Both are scored on the held-back requests (nDCG@10, their tools as the gold). Only a candidate that
beats the baseline is rebuilt to learn from every request and returned for swapping in; otherwise the
pipeline stays as it is.
"""

from __future__ import annotations

import hashlib
import inspect
import tempfile
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

from ..benchmark_sets import Query
from ..errors import Conflict, InvalidRequest
from ..learning.space import space_for
from ..pipeline import ToolScout
from ..retrievers.base import HasEncoder, make_retriever, parts
from .data import TrainingData
from .loop import TrainConfig, validation_ndcg

METHODS = ("mlc", "refiner", "embed")
HOLDOUT = 0.2
MIN_QUERIES = 20  # below this there is too little to train on or to judge by
RETRAIN_SETS = {"data", "out", "model", "config"}  # fit keywords that retraining sets itself


@dataclass
class Retrained:
    """What one round of heavier learning found. `scout` is the pipeline to swap in (None unless improved)."""

    method: str
    baseline: float
    candidate: float
    train_queries: int
    holdout_queries: int
    model_dir: str
    scout: ToolScout | None = field(default=None, repr=False)

    @property
    def improved(self) -> bool:
        return self.scout is not None

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "baseline_ndcg@10": round(self.baseline, 3),
                "candidate_ndcg@10": round(self.candidate, 3), "improved": self.improved,
                "train_queries": self.train_queries, "holdout_queries": self.holdout_queries,
                "model_dir": self.model_dir}


def feedback_queries(scout: ToolScout) -> list[Query]:
    """Each taught request with every tool it taught (all sources together), as a labelled query."""
    labels: dict[str, dict[str, None]] = {}
    for usage in scout.ledger.taught():
        labels.setdefault(usage.query, {})[usage.tool_id] = None
    return [Query(hashlib.sha256(text.encode()).hexdigest()[:16], text, tuple(tools), "train")
            for text, tools in labels.items()]


def held_back(query: Query, fraction: float) -> bool:
    return int(query.id, 16) / 16 ** len(query.id) < fraction


def split_feedback(scout: ToolScout, holdout: float = HOLDOUT) -> tuple[list[Query], list[Query]]:
    """The taught requests to train on and those held back to judge by; Conflict when there are too few."""
    queries = feedback_queries(scout)
    train = [q for q in queries if not held_back(q, holdout)]
    test = [q for q in queries if held_back(q, holdout)]
    least_held = max(5, MIN_QUERIES // 4)
    if len(train) < MIN_QUERIES or len(test) < least_held:
        raise Conflict(f"too little feedback to train on and judge by yet: {len(train)} requests to train on and "
                       f"{len(test)} held back (at least {MIN_QUERIES} and {least_held} needed)")
    return train, test


def split_options(method: str, options: dict[str, Any], config: TrainConfig | None = None
                  ) -> tuple[TrainConfig, dict[str, Any]]:
    """`options` as the shared training settings (TrainConfig's fields, over `config`) and the rest, the
    method's own (its fit function's keywords); InvalidRequest names an unknown method or setting."""
    if method not in METHODS:
        raise InvalidRequest(f"unknown training method {method!r} for feedback; use one of {', '.join(METHODS)}")
    shared = {f.name for f in fields(TrainConfig)}
    own = set(inspect.signature(_fit(method)).parameters) - RETRAIN_SETS
    unknown = sorted(set(options) - shared - own)
    if unknown:
        raise InvalidRequest(f"unknown setting(s) {', '.join(map(repr, unknown))} for retraining {method}; known: "
                             f"{', '.join(sorted(shared | own))}")
    config = replace(config or TrainConfig(progress=False), **{k: v for k, v in options.items() if k in shared})
    return config, {k: v for k, v in options.items() if k not in shared}


def check_retraining(scout: ToolScout, method: str, options: dict[str, Any], holdout: float = HOLDOUT) -> None:
    """Raise now what `retrain` would raise before training: an unknown method or setting, too little feedback."""
    split_options(method, options)
    split_feedback(scout, holdout)


def retrain(scout: ToolScout, method: str, workdir: str | Path | None = None, *, holdout: float = HOLDOUT,
            config: TrainConfig | None = None, model_dir: str | Path | None = None, **options: Any) -> Retrained:
    """One round of heavier learning on `scout`'s feedback (module doc); `scout` itself is not changed.
    `options`: TrainConfig's fields (over `config`) and the method's own fit settings. `model_dir`: where
    the trained model goes (default: in `workdir`, a temporary folder): the pipeline swapped in refers to
    it, so a deployment keeps it with its index."""
    config, options = split_options(method, options, config)
    train, test = split_feedback(scout, holdout)
    workdir = Path(workdir or tempfile.mkdtemp(prefix="toolscout-retrain-"))
    data = TrainingData({t.id: t for t in scout.tools}, train, [], ["feedback"])
    model_dir = Path(model_dir or workdir / method)
    _train(method, data, model_dir, scout, config, options)
    trained = {q.text for q in train}
    baseline = _learned_copy(scout, workdir / "baseline", trained.__contains__, None, None)
    candidate = _learned_copy(scout, workdir / "candidate", trained.__contains__, method, model_dir)
    scores = [validation_ndcg(lambda texts, k, s=s: s.retrieve(texts, k), test) for s in (baseline, candidate)]
    result = Retrained(method, scores[0], scores[1], len(train), len(test), str(model_dir))
    if scores[1] > scores[0]:
        result.scout = _learned_copy(scout, workdir / "final", lambda _text: True, method, model_dir)
    return result


def _fit(method: str) -> Callable[..., Any]:
    from . import trainer_for

    return trainer_for(method)


def _train(method: str, data: TrainingData, out: Path, scout: ToolScout, config: TrainConfig, options: dict) -> None:
    if method == "refiner":
        _fit(method)(data, out, config=config, **options)
    else:
        _fit(method)(data, out, model=_dense_encoder_name(scout), config=config, **options)


def _learned_copy(scout: ToolScout, folder: Path, keep: Callable[[str], bool], method: str | None,
                  model_dir: Path | None) -> ToolScout:
    """The pipeline (with `method`'s model from `model_dir`, or as it is) having learned live from the
    taught requests `keep` accepts, each from its own source. A copy through its saved directory, so the
    vectors it holds are not made again; its ledger is the original's (what it was taught, all of it),
    its learned channel keeps its settings, history and scores, and is taught the kept requests only."""
    scout.save(folder)
    copy = ToolScout.load(folder)
    first_stage = copy.retriever
    if method in ("embed", "mlc"):  # a new first stage
        first_stage = _first_stage_with(copy.retriever, method, str(model_dir))
    reranker = copy.reranker
    if method == "refiner":
        from ..rerank.base import load_reranker

        reranker = load_reranker(model_dir)
    # the channel's settings (a freeze, weights set by hand), history and scores go with it: only what it
    # learned is learned again
    learning = copy.learning.afresh(space=space_for(first_stage))
    learning.scorecard = copy.learning.scorecard
    copy = ToolScout(first_stage, copy.tools, indexed=first_stage is copy.retriever, reranker=reranker,
                     intents=copy.intents, ledger=copy.ledger, learning=learning)
    copy.relearn(lambda usage: keep(usage.query))
    return copy


def _first_stage_with(retriever: Any, method: str, model_dir: str):
    """A first stage like `retriever` whose dense part is the trained model: a fine-tuned encoder (embed)
    or a classifier (mlc); BM25 parts are kept as they are."""
    name = "dense" if method == "embed" else "mlc"
    if retriever.name == "hybrid":
        components = [c if c.name == "bm25" else make_retriever(name, model=model_dir) for c in parts(retriever)]
        return make_retriever("hybrid", components=components, **retriever.settings())
    if retriever.name in ("dense", "mlc"):
        return make_retriever(name, model=model_dir)
    raise ValueError(f"--train {method} needs a dense or hybrid pipeline, not {retriever.name!r}")


def _dense_encoder_name(scout: ToolScout) -> str | None:
    """The encoder the pipeline's dense part uses (what training starts from)."""
    dense = next((p for p in parts(scout.retriever) if isinstance(p, HasEncoder)), None)
    return None if dense is None else dense.encoder.name
