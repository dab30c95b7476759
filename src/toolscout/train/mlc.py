"""fit_mlc: an encoder plus a `dim × n_tools` linear head, trained with binary cross-entropy on the
label sets of training queries (the Tool2Vec paper §4.2).

The head reads the L2-normalised sentence embedding (transformer → pooling → normalise, exactly what
`Encoder.encode` returns), so at search time a query is encoded once and scored against every tool
with one matrix product (see `toolscout.retrievers.mlc`). Tools are the ones in at least one training
label; their id list is saved with the head.

Choices, each an option of `fit_mlc`:

- `head_init="description"` (default): head row t starts as `init_scale · d_t`, with d_t the unit
  embedding of tool t's text view by the base encoder, and every bias at `logit(prior) − init_scale ·
  mean cosine` (prior = mean number of labels per query / n_tools). Step 0 is then a scaled dense
  retriever instead of a random ranking, which helps tools with few training queries.
  `"random"`: small random rows, biases at logit(prior).
- `head_lr` (default 1e-2; the input is a unit vector, so logits move by about head_lr × ‖e‖₁ ≈ 15 ×
  head_lr per Adam step) vs the encoder's `config.lr`: the `Trainer` builds one AdamW over all
  parameters with `config.lr`, so the head is stored divided by `head_lr / config.lr` and multiplied
  back in the forward pass; Adam's step is scale-free, so the head moves at `head_lr`.
- `probe_epochs` (default 20, early-stopped on validation): before fine-tuning, train the head alone on
  cached embeddings of the frozen encoder (a linear probe, then fine-tuning: "LP-FT"). It costs one
  forward pass per training query (with the fast ONNX backend on a CPU); the epochs themselves cost
  almost nothing, so the head has converged before the expensive joint steps start. Fine-tuning must
  then beat the probe on validation, or the probe's weights are kept (`summary.config["kept"]`).
  With `config.max_steps=0` the probe is the whole training (a frozen-encoder MLC).
- `validation_queries` (default 500): early stopping and calibration use at most this many validation
  queries (a fixed, hash-chosen subset): each validation re-encodes them with the training encoder.
- `max_seq_length` (default 128) caps query length.

After training (best validation weights kept), the dense fallback for tools the model never saw is
calibrated: a logistic regression `P(needed) = sigmoid(a · cos + c)` of "is tool t a gold tool of
query q" on the fine-tuned cosine between q and t's text, over the validation queries (or up to 2000
training queries when there is no validation split) × the known tools.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from dataclasses import replace
from pathlib import Path
from typing import Sequence

import numpy as np

from ..artifacts import write_artifact, write_json
from ..encoders import Encoder, quiet_transformers
from ..models import model_base
from ..results import Results
from ..retrievers.mlc import ENCODER_FOLDER, HEAD_FILE
from ..tool import TextView, tool_text
from .data import TrainingData
from .loop import (RunSummary, TrainConfig, Trainer, batched, pick_device, run_settings, set_seed, stage_dir,
                   validation_ndcg)

logger = logging.getLogger(__name__)

HEAD_INITS = ("description", "random")
CALIBRATION_QUERIES = 2000


def fit_mlc(data: TrainingData, out: str | Path, *, model: str | None = None, config: TrainConfig | None = None,
            resume: bool = True, head_init: str = "description", init_scale: float = 10.0, head_lr: float = 1e-2,
            probe_epochs: int = 20, max_seq_length: int = 128, validation_queries: int | None = 500,
            view: TextView | None = None, validate_at_start: bool = True, eval_batch_size: int = 128) -> RunSummary:
    """Train an MLC model on `data.train`, validate on `data.validation`, write the model directory `out`.

    `model`: the base encoder (a sentence-transformers name or folder; default all-MiniLM-L6-v2).
    `config.lr` is the encoder's learning rate, `head_lr` the head's. `probe_epochs` > 0 first trains
    the head alone on cached embeddings of the frozen encoder (linear probe, then fine-tune);
    `config.max_steps=0` keeps only that probe. `validation_queries` caps the validation queries used
    for early stopping and calibration (a fixed hash-ordered subset; None = all). See the module doc.
    """
    from .mlc_net import MLCNetwork

    if head_init not in HEAD_INITS:
        raise ValueError(f"head_init must be one of {', '.join(HEAD_INITS)}, got {head_init!r}")
    config = config or TrainConfig(lr=5e-5)
    view = view or TextView()
    device = pick_device(config.device)
    start = time.perf_counter()
    tool_ids = data.labelled_tool_ids
    column = {tid: i for i, tid in enumerate(tool_ids)}
    examples = [(q.text, [column[label] for label in q.labels]) for q in data.train]
    validation = _subset(data.validation, validation_queries)
    _check_calibratable(_calibration_queries(validation, data.train), column, bool(validation))  # before training
    descriptions = [tool_text(data.tools[tid], view) for tid in tool_ids]
    encoder = Encoder.load(model, device=device, max_seq_length=max_seq_length, backend="torch")
    set_seed(config.seed)
    net = MLCNetwork(encoder.model, len(tool_ids), head_scale=head_lr / config.lr).to(device)
    validate = (lambda: validation_ndcg(_head_search(net, tool_ids, eval_batch_size), validation)) \
        if validation else None
    made_with = run_settings(data, model, head_init=head_init, init_scale=init_scale, head_lr=head_lr,
                             probe_epochs=probe_epochs, max_seq_length=max_seq_length, view=view)
    trainer = Trainer("mlc", net, _bce_loss(net), lambda epoch: batched(examples, config.batch_size, config.seed, epoch),
                      config, out, validate=validate, made_with=made_with)
    history: list[dict] = []
    probe_summary = None
    if not trainer.will_resume(resume):  # a resumed run's head is in its checkpoint
        prior = sum(len(labels) for _t, labels in examples) / (len(examples) * len(tool_ids))
        net.set_head(*_initial_head(net, head_init, init_scale, prior, descriptions,
                                    [text for text, _ in examples], config.seed, eval_batch_size))
        if validate and validate_at_start:
            history.append({"phase": "init", "step": 0, "validation_ndcg@10": round(validate(), 3)})
        if probe_epochs > 0:
            # the frozen encoder's embeddings come from the fast backend (ONNX on a CPU) when it is available
            fast = Encoder.load(model, device=device, max_seq_length=max_seq_length)
            probe_summary = _probe(net, examples, validation, tool_ids, config, head_lr, probe_epochs, out,
                                   resume, lambda texts: fast.encode(texts, batch_size=eval_batch_size), made_with)
            del fast
            history.extend({"phase": "probe", **entry} for entry in probe_summary.history)
    summary, kept = _fine_tune(trainer, net, validate, probe_summary, history, resume)
    probe_embedding = dict(probe_summary.data) if probe_summary is not None else {}
    summary.history = history + summary.history
    summary.data = data.summary()
    summary.config = {**config.to_dict(), "model": encoder.name, "head_init": head_init, "init_scale": init_scale,
                      "head_lr": head_lr, "probe_epochs": probe_epochs, "max_seq_length": max_seq_length,
                      "tools": len(tool_ids), "validation_queries": len(validation), "kept": kept}
    if probe_summary is not None:
        summary.config["probe"] = {"steps": probe_summary.steps, "time_s": probe_summary.time_s,
                                   "examples": probe_summary.examples, **probe_embedding,
                                   "best_validation": probe_summary.best_validation}
    calibration = _calibrate_fallback(net, validation, data.train, tool_ids, descriptions, eval_batch_size)
    _save_mlc(out, net, tool_ids, summary, encoder=encoder.name, tools=len(tool_ids), view=view.to_dict(),
              max_seq_length=max_seq_length, head_init=head_init, fallback_calibration=calibration,
              wall_s=round(time.perf_counter() - start, 2))
    trainer.finish()
    return summary


def _fine_tune(trainer: Trainer, net, validate, probe_summary: RunSummary | None, history: list[dict],
               resume: bool) -> tuple[RunSummary, str]:
    """Train encoder and head together (unless `max_steps` or `epochs` is 0); fine-tuning must beat the probe
    it starts from on validation, or the probe's weights are kept. Returns the run summary and which
    weights the model keeps; appends the validation of the starting point to `history`."""
    config = trainer.config
    fine_tune = not (config.max_steps == 0 or config.epochs == 0)
    before = None
    if fine_tune and probe_summary is not None and validate:
        before = (validate(), _copy_state(net))
        history.append({"phase": "fine-tune", "step": 0, "validation_ndcg@10": round(before[0], 3)})
    if fine_tune:
        summary = trainer.fit(resume=resume)
        summary.history = [{"phase": "fine-tune", **entry} for entry in summary.history]
    else:
        summary = probe_summary or RunSummary("mlc")
        summary.method, summary.history = "mlc", []
    kept = "fine-tuned" if fine_tune else "probe" if probe_summary else "initial head"
    if before is not None and (summary.best_validation is None or summary.best_validation < before[0]):
        net.load_state_dict(before[1])
        kept = "probe (fine-tuning did not improve validation)"
        summary.best_validation, summary.best_step = round(before[0], 3), 0
        summary.discarded_for = "fine-tuning discarded: the linear probe it started from validated better and was kept"
    return summary, kept


def _save_mlc(out: str | Path, net, tool_ids: list[str], summary: RunSummary, **config) -> None:
    """The model directory: the fine-tuned encoder, the head with its tool ids, and `config` in config.json."""
    weight, bias = net.head_arrays()
    net.eval()
    with write_artifact(out, model_base("mlc", **config, summary=summary.to_dict())) as folder, quiet_transformers():
        net.encoder.save(str(folder / ENCODER_FOLDER))
        np.savez(folder / HEAD_FILE, ids=np.asarray(tool_ids, dtype=str), weight=weight, bias=bias)
        write_json(folder / "tools.json", tool_ids)
        write_json(folder / "summary.json", summary.to_dict())


def _copy_state(net) -> dict:
    return {key: value.detach().clone() for key, value in net.state_dict().items()}


def _subset(queries: Sequence, limit: int | None) -> list:
    """At most `limit` queries, chosen by a hash of their ids (stable, and spread over the whole set)."""
    if limit is None or len(queries) <= limit:
        return list(queries)
    return sorted(queries, key=lambda q: hashlib.sha256(q.id.encode()).hexdigest())[:limit]


def _targets(logits, batch):
    import torch

    targets = torch.zeros_like(logits)
    for row, (_item, labels) in enumerate(batch):
        targets[row, labels] = 1.0
    return targets


def _bce_loss(net):
    from .losses import multilabel_bce

    def loss_fn(batch):
        logits = net([text for text, _ in batch])
        return multilabel_bce(logits, _targets(logits, batch))

    return loss_fn


def _ranked(logits: np.ndarray, tool_ids: list[str], k: int) -> Results:
    top = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    return Results.from_lists([[tool_ids[i] for i in row] for row in top],
                              [logits[q, row] for q, row in enumerate(top)])


def _head_search(net, tool_ids: list[str], batch_size: int):
    def search(queries: list[str], k: int) -> Results:
        weight, bias = net.head_arrays()
        return _ranked(net.encode(queries, batch_size) @ weight.T + bias, tool_ids, k)

    return search


def _probe(net, examples, validation, tool_ids, config: TrainConfig, head_lr: float, epochs: int, out,
           resume: bool, embed, made_with: dict) -> RunSummary:
    """Train the head alone on cached embeddings of the frozen encoder (`embed(texts)` → unit rows);
    copy the result into `net`."""
    import torch

    from .losses import multilabel_bce

    logger.info("mlc: embedding %d training queries for the linear probe", len(examples))
    start = time.perf_counter()
    train_vectors = torch.from_numpy(embed([text for text, _ in examples]))
    cached = {q.text: v for q, v in zip(validation, embed([q.text for q in validation]))} if validation else {}
    embed_s = time.perf_counter() - start
    head = torch.nn.Linear(train_vectors.shape[1], len(tool_ids))
    weight, bias = net.head_arrays()
    with torch.no_grad():
        head.weight.copy_(torch.from_numpy(weight))
        head.bias.copy_(torch.from_numpy(bias))
    items = [(i, labels) for i, (_text, labels) in enumerate(examples)]

    def loss_fn(batch):
        logits = head(train_vectors[[i for i, _ in batch]])
        return multilabel_bce(logits, _targets(logits, batch))

    def search(queries: list[str], k: int) -> Results:
        with torch.no_grad():
            logits = head(torch.from_numpy(np.stack([cached[q] for q in queries]))).numpy()
        return _ranked(logits, tool_ids, k)

    probe_config = replace(config, lr=head_lr, epochs=epochs, max_steps=None, eval_every=None, patience=2,
                           checkpoint_every=10**9)
    trainer = Trainer("mlc-probe", head, loss_fn, lambda epoch: batched(items, config.batch_size, config.seed, epoch),
                      probe_config, stage_dir(out, "probe"),
                      validate=(lambda: validation_ndcg(search, validation)) if validation else None,
                      made_with=made_with)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # steps this small are several times faster on one thread than on two
    try:
        summary = trainer.fit(resume=resume)
    finally:
        torch.set_num_threads(threads)
    summary.data = {"embed_s": round(embed_s, 2), "embedded": len(examples) + len(cached)}
    trainer.finish()
    net.set_head(head.weight.detach().numpy(), head.bias.detach().numpy())
    return summary


def _initial_head(net, head_init: str, init_scale: float, prior: float, descriptions: list[str],
                  train_texts: list[str], seed: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    n_tools, dim = net.head_weight.shape
    prior_logit = math.log(prior / (1.0 - prior)) if 0 < prior < 1 else 0.0
    if head_init == "random":
        rng = np.random.default_rng(seed)
        weight = rng.normal(0.0, 1.0 / math.sqrt(dim), size=(n_tools, dim)).astype(np.float32)
        return weight, np.full(n_tools, prior_logit, dtype=np.float32)
    tool_vectors = net.encode(descriptions, batch_size)
    sample = random_sample(train_texts, 256, seed)
    mean_cos = float((net.encode(sample, batch_size) @ tool_vectors.T).mean()) if sample else 0.0
    return (init_scale * tool_vectors).astype(np.float32), \
        np.full(n_tools, prior_logit - init_scale * mean_cos, dtype=np.float32)


def random_sample(items: Sequence, n: int, seed: int) -> list:
    if len(items) <= n:
        return list(items)
    rng = np.random.default_rng(seed)
    return [items[i] for i in sorted(rng.choice(len(items), size=n, replace=False))]


def _calibration_queries(validation: Sequence, train: Sequence) -> list:
    """The queries mlc's fallback scores are calibrated on: the validation queries, else some training ones."""
    return list(validation) or random_sample(train, CALIBRATION_QUERIES, 0)


def _check_calibratable(queries: Sequence, column: dict[str, int], validation: bool) -> None:
    """Refuse, before training, queries that give calibration no gold or no other (query, tool) pair."""
    gold = sum(len({t for t in q.labels if t in column}) for q in queries)
    if gold == 0 or gold == len(queries) * len(column):
        raise ValueError(f"too little to calibrate mlc's scores on: the {len(queries)} "
                         f"{'validation' if validation else 'training'} queries it reads give no "
                         f"{'gold' if gold == 0 else 'non-gold'} (query, tool) pair among {len(column)} tools; "
                         "train on more labelled queries")


def _calibrate_fallback(net, validation: Sequence, train: Sequence, tool_ids: list[str], descriptions: list[str],
                        batch_size: int) -> dict:
    """Fit P(needed | cosine) = sigmoid(slope · cos + intercept) on held-out (or training) queries."""
    queries = _calibration_queries(validation, train)
    column = {tid: i for i, tid in enumerate(tool_ids)}
    cosine = net.encode([q.text for q in queries], batch_size) @ net.encode(descriptions, batch_size).T
    labels = np.zeros(cosine.shape, dtype=bool)
    for row, q in enumerate(queries):
        labels[row, [column[t] for t in q.labels if t in column]] = True
    slope, intercept = fit_platt(cosine.ravel(), labels.ravel())
    return {"slope": slope, "intercept": intercept, "fitted_on": "validation" if validation else "train",
            "queries": len(queries), "pairs": int(labels.size), "positives": int(labels.sum())}


def fit_platt(x: np.ndarray, y: np.ndarray, iterations: int = 50) -> tuple[float, float]:
    """Logistic regression of y (bool) on one feature x: (slope, intercept) by Newton's method.

    A tiny ridge (1e-6) keeps the Hessian invertible when the classes are separable; the slope is
    kept positive (a higher cosine never lowers the score)."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    if y.sum() == 0 or y.sum() == len(y):
        raise ValueError("Platt scaling needs both positive and negative pairs")
    features = np.stack([x, np.ones_like(x)], axis=1)
    theta = np.array([1.0, math.log(y.mean() / (1 - y.mean()))])

    def loss(t):
        z = features @ t
        return float(np.mean(np.logaddexp(0.0, z) - y * z)) + 0.5e-6 * float(t @ t)

    current = loss(theta)
    for _ in range(iterations):
        p = 1.0 / (1.0 + np.exp(-(features @ theta)))
        grad = features.T @ (p - y) / len(y) + 1e-6 * theta
        hess = (features * (p * (1 - p))[:, None]).T @ features / len(y) + 1e-6 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        scale = 1.0
        while scale > 1e-4:  # damped Newton: halve the step until the loss goes down
            candidate = theta - scale * step
            new = loss(candidate)
            if new <= current:
                break
            scale /= 2
        else:
            break
        converged = abs(current - new) < 1e-12
        theta, current = candidate, new
        if converged:
            break
    return max(float(theta[0]), 1e-3), float(theta[1])
