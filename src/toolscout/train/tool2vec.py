"""fit_tool2vec: usage-driven tool vectors from training queries (seed 001 §4.1).

No gradient steps are needed: the model is the (optionally fine-tuned) encoder plus, per tool, the sum
and count of its training queries' embeddings. The description `prior` of the blend is picked on the
validation queries (carved from train), never on a test split.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Sequence

import numpy as np

from ..artifacts import write_artifact, write_json
from ..encoders import Encoder
from ..models import model_base
from ..retrievers.tool2vec import Tool2VecRetriever, UsageTable
from ..tool import TextView
from .data import TrainingData
from .loop import RunSummary, TrainConfig, validation_ndcg

PRIOR_GRID = (0.0, 0.5, 1.0, 2.0, 4.0)


def fit_tool2vec(data: TrainingData, out: str | Path, model: str | None = None, config: TrainConfig | None = None,
                 priors: Sequence[float] = PRIOR_GRID, view: TextView | None = None,
                 encoder: Encoder | None = None, resume: bool = True) -> RunSummary:
    """Write a Tool2Vec model directory to `out`. `model`: the encoder (name, path, or a model directory
    written by `toolscout train embed`, to use a fine-tuned encoder). `resume` is accepted for a uniform
    signature: there are no gradient steps to resume."""
    start = time.perf_counter()
    progress = config.progress if config else True
    encoder = encoder or Encoder.load(model)
    view = view or TextView()
    usage = UsageTable(encoder.dim)
    texts = [q.text for q in data.train]
    vectors = encoder.encode(texts, batch_size=128, show_progress=progress)
    for q, vec in zip(data.train, vectors):
        for label in q.labels:
            usage.add(label, vec[None, :])

    retriever = Tool2VecRetriever(encoder=encoder, view=view, prior=priors[0])
    retriever.usage = usage
    retriever.index(list(data.tools.values()))
    summary = RunSummary("tool2vec", examples=len(texts), data=data.summary())
    best_prior, best_score = priors[0], -1.0
    if data.validation and len(priors) > 1:
        for prior in priors:
            _reblend(retriever, prior)
            score = validation_ndcg(retriever.search, data.validation)
            summary.history.append({"prior": prior, "validation_ndcg@10": round(score, 3)})
            if score > best_score:
                best_prior, best_score = prior, score
    else:
        best_prior = priors[0]
        best_score = validation_ndcg(retriever.search, data.validation) if data.validation else float("nan")
    summary.best_validation = round(best_score, 3) if data.validation else None
    summary.time_s = round(time.perf_counter() - start, 2)
    summary.config = {"prior": best_prior, "model": encoder.name}

    config = model_base("tool2vec", encoder=encoder.name, prior=best_prior, view=view.to_dict(),
                        finetuned=False, summary=summary.to_dict())
    with write_artifact(out, config) as folder:
        usage.save(folder / "usage.npz")
        write_json(folder / "summary.json", summary.to_dict())
    return summary


def _reblend(retriever: Tool2VecRetriever, prior: float) -> None:
    """Recompute every stored vector for a new prior (descriptions are kept, nothing is re-encoded)."""
    retriever.prior = prior
    ids = list(retriever.descriptions)
    vectors = np.stack([retriever._blend(i, retriever.descriptions[i]) for i in ids])
    namespaces = [retriever.store.rows.namespaces[retriever.store.rows.row_of[i]] or None for i in ids]
    retriever.store.upsert(ids, vectors, namespaces)
