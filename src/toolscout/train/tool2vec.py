"""fit_tool2vec: usage-driven tool vectors from training queries (the Tool2Vec paper §4.1).

No gradient steps are needed: the model is the (optionally fine-tuned) encoder plus, per tool, the sum
and count of its training queries' embeddings. The description `prior` of the blend is picked on the
validation queries (carved from train), never on a test split.

`finetune=True` first fine-tunes the encoder on the same training pairs with `fit_embed` (the paper
fine-tunes its encoder for one epoch with a triplet loss; here the loss is `finetune_loss`, InfoNCE by
default — see `FINETUNE_LOSS`), then computes the usage vectors with the fine-tuned encoder, which is
saved in the model directory's `encoder/` folder (`finetuned: true` in its config).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..artifacts import write_artifact, write_json
from ..encoders import Encoder
from ..models import model_base, model_config
from ..retrievers.dense import encoder_for
from ..retrievers.tool2vec import Tool2VecRetriever, UsageTable
from ..tool import TextView
from .data import TrainingData
from .loop import RunSummary, TrainConfig, stage_dir, validation_ndcg

PRIOR_GRID = (0.0, 0.5, 1.0, 2.0, 4.0)
# Chosen on validation only. Train splits of apibank + gorilla_torchhub + rotbench, 40 steps of 32 pairs
# (1 same-set random negative, sets balanced, lr 5e-5), prior picked on validation as usual:
#   Tool2Vec validation nDCG@10: no fine-tuning 73.99, triplet 75.64, InfoNCE 76.69
#   (the encoder's own validation: start 60.99, triplet 64.28, InfoNCE 66.84).
# InfoNCE also uses every other pair of the batch as a negative; the triplet loss sees one negative per pair.
FINETUNE_LOSS = "infonce"


def fit_tool2vec(data: TrainingData, out: str | Path, model: str | None = None, config: TrainConfig | None = None,
                 priors: Sequence[float] = PRIOR_GRID, view: TextView | None = None,
                 encoder: Encoder | None = None, resume: bool = True, finetune: bool = False,
                 finetune_steps: int | None = None, finetune_loss: str = FINETUNE_LOSS,
                 finetune_options: Mapping[str, Any] | None = None) -> RunSummary:
    """Write a Tool2Vec model directory to `out`. `model`: the encoder (name, path, or a model directory
    written by `toolscout train embed`, to use a fine-tuned encoder).

    `finetune`: fine-tune the encoder first (`fit_embed` with `finetune_loss`, at most `finetune_steps`
    steps, other `fit_embed` options in `finetune_options`), into `OUT.finetune/` — a fine-tuning run
    that was interrupted resumes from its checkpoint when `resume` is set; the folder is removed once
    the Tool2Vec directory is written."""
    start = time.perf_counter()
    progress = config.progress if config else True
    view = view or TextView()
    tuned_dir, tune_summary = None, None
    if finetune:
        if encoder is not None:
            raise ValueError("finetune=True trains its own encoder from `model`; do not pass `encoder` as well")
        tuned_dir, tune_summary = _finetune(data, Path(out), model, config, view, resume, finetune_steps,
                                            finetune_loss, dict(finetune_options or {}))
        encoder = encoder_for(tuned_dir)
    encoder = encoder or encoder_for(model)
    usage = UsageTable(encoder.dim)
    texts = [q.text for q in data.train]
    vectors = encoder.encode(texts, batch_size=128, show_progress=progress)
    for q, vec in zip(data.train, vectors):
        for label in q.labels:
            usage.add(label, vec[None, :])

    retriever = Tool2VecRetriever(encoder=encoder, view=view, prior=priors[0], usage_table=usage)
    retriever.index(list(data.tools.values()))
    summary = RunSummary("tool2vec", examples=len(texts), data=data.summary())
    best_prior, best_score = priors[0], -1.0
    if data.validation and len(priors) > 1:
        for prior in priors:
            retriever.reblend(prior)
            score = validation_ndcg(retriever.search, data.validation)
            summary.history.append({"prior": prior, "validation_ndcg@10": round(score, 3)})
            if score > best_score:
                best_prior, best_score = prior, score
    else:
        best_prior = priors[0]
        best_score = validation_ndcg(retriever.search, data.validation) if data.validation else float("nan")
    summary.best_validation = round(best_score, 3) if data.validation else None
    summary.time_s = round(time.perf_counter() - start, 2)
    base_name = (model or "default") if finetune else encoder.name  # a fine-tuned encoder's own path is temporary
    summary.config = {"prior": best_prior, "model": base_name}
    if tune_summary is not None:
        summary.config.update(finetune_loss=finetune_loss, finetune_steps=tune_summary.steps)
        summary.data["finetune"] = tune_summary.to_dict()
        if tune_summary.discarded_for:  # the encoder is the starting one: the CLI's last line says so
            summary.discarded_for = ("fine-tuning discarded: the starting encoder validated better and was kept "
                                     "for the usage vectors")

    config = model_base("tool2vec", encoder=base_name, prior=best_prior,
                        view=view.to_dict(), finetuned=finetune, summary=summary.to_dict())
    with write_artifact(out, config) as folder:
        usage.save(folder / "usage.npz")
        write_json(folder / "summary.json", summary.to_dict())
        if tuned_dir is not None:
            tuned_folder, tuned_config = model_config(tuned_dir, method="embed")
            shutil.copytree(tuned_folder / tuned_config.get("encoder", "encoder"), folder / "encoder")
    if tuned_dir is not None:
        shutil.rmtree(tuned_dir, ignore_errors=True)
    return summary


def _finetune(data: TrainingData, out: Path, model: str | None, config: TrainConfig | None, view: TextView,
              resume: bool, steps: int | None, loss: str, options: dict) -> tuple[Path, RunSummary]:
    """Fine-tune the encoder into `OUT.finetune` (or reuse one a previous, interrupted run completed)."""
    from ..artifacts import read_json
    from . import check_options
    from .embed import fit_embed, training_config

    check_options("embed (tool2vec's fine-tuning)", fit_embed, options, flag="finetune_options")
    tuned_dir = stage_dir(out, "finetune")
    done = model_config(tuned_dir, method="embed")
    if resume and done is not None:
        return tuned_dir, RunSummary(**{k: v for k, v in read_json(done[0] / "summary.json").items()
                                        if k in RunSummary.__dataclass_fields__})
    summary = fit_embed(data, tuned_dir, model=model, config=training_config(config, max_steps=steps),
                        resume=resume, loss=loss, view=view, **options)
    return tuned_dir, summary
