"""fit_toolclip: contrastive task–tool training of ToolCLIP's two towers (the ToolCLIP paper §4.4–4.6).

Loss per batch (scores are cosines of unit vectors, τ the temperature):

    L = InfoNCE(batch)                         stage 1 (plain contrastive)
    L = InfoNCE(batch ∪ extra) + λ·L_hard      stage 2 (hard negatives)

- InfoNCE is in-batch: the tools of a batch are the gold tools of its tasks. `multi_positive=True`
  (default, eq. 12): one row per task, all its gold tools share the numerator. `multi_positive=False`
  (the Table 7 "single-positive" ablation, eq. 11): one row per (task, gold tool) pair; the pair's tool is
  the target and the task's other gold tools are left out of its denominator (never pushed away).
- L_hard (eq. 14) contrasts each row's positives with only its K highest-scoring negatives among the
  batch's tools, i.e. in-batch plus the `extra` negatives (`toolscout.train.losses.hard_negative_loss`).
- `extra` negatives in stage 2: `negatives="hard"` (default) appends, per task, the top non-gold tools of
  a first-stage retriever (`miner`: the untrained dense encoder or BM25; gold tools never count);
  `negatives="random"` (the Table 7 ablation) appends the same number of tools drawn uniformly from the
  catalog instead. Everything else, the loss included, is identical between the two.
- Two stages: the first `stage1_fraction` of the optimiser steps use the plain loss, the rest the full
  one (the paper: InfoNCE pre-training, then hard-negative fine-tuning).
- Several training sets: `balance="sets"` (default) gives each set the same share of every epoch, as
  `train embed` does (`embed.epoch_examples`); hard negatives are mined among the task's own set's tools
  (a tool of another catalog is not a confusable alternative there); validation is the macro nDCG@10 of
  each set's validation tasks ranked within that set's tools, the test protocol. With by-size mixing the
  six dev sets give 97% of the tasks to metatool and toollens: a 400-step run then reached 63.9 pooled
  validation yet fell to 39.2 macro nDCG@10 zero-shot on bfcl + gorilla_huggingface, 1.1 below its
  100-step run and 1.3 below the untrained dense retriever. Set-balanced, 200 steps reached 41.4 (+0.8
  over dense; bfcl +1.7, gorilla_huggingface +0.0).
- Defaults chosen on validation (200 train-split tasks per set, each set within its own tools): the
  description component reads the tool's whole text view (`description_text="document"`) and the gates
  start at σ(−2, 3, −2) for name, description, parameters. Untrained, that scores 57.6 macro nDCG@10
  against 56.1 for the paper's field split and 57.0 for the dense retriever; after 200 set-balanced steps
  its validation is 63.7 (field split: 62.9) and zero-shot on bfcl + gorilla_huggingface 43.0 (41.4).
  `-o description_text=description -o gate_bias=null` restores the paper's split.
- Longer training pays: continuing that model (`--model DIR`) for 200 more stage-2 steps
  (`-o stage1_fraction=0`, another `--seed` so it sees new tasks) raised validation to 65.2 and zero-shot
  to 43.7 (dense: 40.5). Training all layers with one shared tower instead of the top 3 of two gave no
  gain at the same 200 steps (validation 62.8, zero-shot 43.2).

τ = 0.07 by default (the paper's); `learn_tau=True` learns it CLIP-style (log 1/τ, kept in [0.01, 1]).
λ = 0.5 and K = 7: the paper's "hard negative ratio α = 0.5 with 7 hard negatives per query", read as the
weight of L_hard and its number of negatives.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Sequence

from ..benchmark_sets import Query
from ..models import model_config
from ..results import Filter
from ..retrievers.base import check_types
from ..retrievers.toolclip_model import DESCRIPTION_TEXTS, ToolCLIPConfig, ToolCLIPEncoder, load_model, new_model
from .data import TrainingData
from .embed import BALANCES, epoch_examples, query_set, tool_sets
from .loop import RunSummary, TrainConfig, Trainer, batched, pick_device, run_settings, validation_ndcg
from .negatives import build_miner, mine_hard_negatives
from .toolclip_save import save_model

NEGATIVE_MODES = ("hard", "random")
MINERS = ("dense", "bm25")


@dataclass
class ToolCLIPOptions:
    """Training options (`toolscout train toolclip -o KEY=VALUE`). Architecture options go to ToolCLIPConfig."""

    # Table 7 ablations
    shared_towers: bool = False
    negatives: str = "hard"  # extra stage-2 negatives: "hard" (mined) | "random" (uniform from the catalog)
    multi_positive: bool = True
    # loss
    tau: float = 0.07
    learn_tau: bool = False
    hard_weight: float = 0.5  # λ
    hard_k: int = 7  # K: hardest negatives per row in L_hard
    extra_per_query: int = 1  # stage-2 negatives appended per task (mined or random)
    stage1_fraction: float = 0.5  # share of the steps trained with the plain loss
    miner: str = "dense"  # first stage that mines hard negatives: "dense" (untrained encoder) | "bm25"
    mine_depth: int = 30
    balance: str = "sets"  # several training sets: "sets" (same share each) | "size" (every task once)
    # architecture (see ToolCLIPConfig)
    max_query_length: int = 64
    max_name_length: int = 32
    max_description_length: int = 64
    max_param_length: int = 32
    max_params: int = 8
    # the description component reads the whole text view, led by its gate at the start: chosen on
    # validation (see the module doc); "description" with gate_bias=None is the paper's field split
    description_text: str = "document"
    gate_bias: tuple[float, float, float] | None = (-2.0, 3.0, -2.0)  # name, description, parameters
    pool_heads: int = 1
    head_lr_mult: float = 20.0
    dim: int | None = None
    param_grad: bool = False  # backpropagate through parameter texts (slower; see ToolCLIPConfig)
    train_layers: int | None = None  # train only the top N transformer layers of each tower
    # validation
    validate: bool = True  # nDCG@10 on the validation queries over the training catalog
    validate_at_start: bool = False  # also score the untrained model (one more pass over the catalog)

    def __post_init__(self) -> None:
        if self.negatives not in NEGATIVE_MODES:
            raise ValueError(f"toolclip option negatives={self.negatives!r}; choose one of {', '.join(NEGATIVE_MODES)}")
        if self.description_text not in DESCRIPTION_TEXTS:
            raise ValueError(f"toolclip option description_text={self.description_text!r}; "
                             f"choose one of {', '.join(DESCRIPTION_TEXTS)}")
        if self.gate_bias is not None:
            if len(self.gate_bias) != 3:
                raise ValueError(f"toolclip option gate_bias={self.gate_bias!r}: give three numbers "
                                 "(name, description, parameters)")
            self.gate_bias = tuple(float(x) for x in self.gate_bias)
        if self.balance not in BALANCES:
            raise ValueError(f"toolclip option balance={self.balance!r}; choose one of {', '.join(BALANCES)}")
        if self.miner not in MINERS:
            raise ValueError(f"toolclip option miner={self.miner!r}; choose one of {', '.join(MINERS)}")
        if not 0.0 <= self.stage1_fraction <= 1.0:
            raise ValueError(f"toolclip option stage1_fraction={self.stage1_fraction} must be in [0, 1]")
        if self.tau <= 0:
            raise ValueError(f"toolclip option tau={self.tau} must be positive")
        for name in ("hard_k", "extra_per_query", "max_params"):
            if getattr(self, name) < 0:
                raise ValueError(f"toolclip option {name}={getattr(self, name)} must be >= 0")

    @classmethod
    def make(cls, **options: Any) -> "ToolCLIPOptions":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown toolclip option(s) {unknown}; known: {', '.join(sorted(known))}")
        check_types("toolclip", cls, options, noun="option")
        return cls(**options)

    def architecture(self, base_model: str) -> ToolCLIPConfig:
        keys = {f.name for f in fields(ToolCLIPConfig)}
        chosen = {k: v for k, v in asdict(self).items() if k in keys and v is not None}
        return ToolCLIPConfig(base_model=base_model, **chosen)


@dataclass
class Batch:
    """One optimiser step's rows: (task, target tool or None for all gold tools), and its stage."""

    rows: list[tuple[Query, str | None]]
    step: int
    stage: int

    def __len__(self) -> int:
        return len(self.rows)


# ----------------------------------------------------------------------------------- the loss


def pair_nce(logits, positives, targets):
    """Single-positive InfoNCE over logits (R, T): row r's target column `targets[r]` against every
    non-gold column; the row's other gold columns (`positives`) are left out of the denominator.
    Equals `losses.info_nce(multi_positive=False)` when the target is the row's first positive."""
    import torch
    import torch.nn.functional as F

    others = positives.clone()
    others[torch.arange(len(targets)), targets] = False
    return F.cross_entropy(logits.masked_fill(others, float("-inf")), targets)


def pair_hard_nce(logits, positives, targets, top_k: int):
    """L_hard for single-positive rows: the target against the row's `top_k` highest-scoring non-gold columns."""
    import torch

    negatives = logits.masked_fill(positives, float("-inf"))
    hardest = negatives.topk(min(top_k, logits.shape[1]), dim=1).values
    target = logits.gather(1, targets[:, None])
    return (torch.logsumexp(torch.cat([target, hardest], dim=1), dim=1) - target[:, 0]).mean()


class ToolCLIPObjective:
    """Turns a Batch into tensors and a loss (called by the Trainer once per step)."""

    def __init__(self, model, featurizer, data: TrainingData, options: ToolCLIPOptions, device: str, seed: int,
                 miner=None, set_filters: dict[str, Filter] | None = None):
        self.model = model
        self.featurizer = featurizer
        self.tools = data.tools
        self.tool_ids = list(data.tools)
        self.options = options
        self.device = device
        self.seed = seed
        self.miner = miner
        self.sets_of_tools = tool_sets(data)
        self.set_filters = set_filters or {}  # set name → its tools: mining stays within a task's own set
        self._parts: dict[str, Any] = {}
        self._mined: dict[str, list[str]] = {}

    def parts(self, tool_id: str):
        if tool_id not in self._parts:
            self._parts[tool_id] = self.featurizer.parts(self.tools[tool_id])
        return self._parts[tool_id]

    def extra_negatives(self, batch: Batch) -> list[str]:
        """Stage-2 negatives to append: mined (hard) or uniform from the catalog (random), never gold."""
        opts = self.options
        if batch.stage < 2 or opts.extra_per_query == 0:
            return []
        queries = list(dict.fromkeys(q for q, _ in batch.rows))
        if opts.negatives == "random":
            rng = random.Random(self.seed * 1_000_003 + batch.step)
            out = []
            for q in queries:
                gold = set(q.labels)
                pool = [t for t in rng.sample(self.tool_ids, min(len(self.tool_ids), opts.extra_per_query + len(gold)))
                        if t not in gold]
                out.extend(pool[:opts.extra_per_query])
            return out
        todo: dict[str, list[Query]] = {}
        for q in queries:
            if q.id not in self._mined:
                todo.setdefault(query_set(q, self.sets_of_tools), []).append(q)
        for set_name, group in todo.items():
            mined = mine_hard_negatives(self.miner, group, per_query=opts.extra_per_query, depth=opts.mine_depth,
                                        filter=self.set_filters.get(set_name))
            self._mined.update({q.id: ids for q, ids in zip(group, mined)})
        return [t for q in queries for t in self._mined[q.id]]

    def tensors(self, batch: Batch):
        import torch

        gold_columns = [t for q, target in batch.rows for t in ((target,) if target else q.labels) if t in self.tools]
        columns = list(dict.fromkeys(gold_columns + self.extra_negatives(batch)))
        col = {t: i for i, t in enumerate(columns)}
        positives = torch.zeros(len(batch.rows), len(columns), dtype=torch.bool)
        for r, (q, _target) in enumerate(batch.rows):
            for label in q.labels:
                if label in col:
                    positives[r, col[label]] = True
        targets = torch.tensor([col[t] for _q, t in batch.rows], dtype=torch.long) \
            if not self.options.multi_positive else None
        tasks = {k: v.to(self.device) for k, v in self.featurizer.tasks([q.text for q, _ in batch.rows]).items()}
        tools = self.featurizer.tools([self.parts(t) for t in columns]).to(self.device)
        return tasks, tools, positives.to(self.device), None if targets is None else targets.to(self.device)

    def __call__(self, batch: Batch):
        from .losses import hard_negative_loss, info_nce

        opts = self.options
        tasks, tools, positives, targets = self.tensors(batch)
        q = self.model.encode_tasks(tasks)
        t = self.model.encode_tools(tools)
        tau = self.model.tau()
        if opts.multi_positive:
            loss = info_nce(q, t, positives, tau=tau, multi_positive=True)
            if batch.stage == 2 and opts.hard_weight:
                loss = loss + opts.hard_weight * hard_negative_loss(q, t, positives, top_k=opts.hard_k, tau=tau)
            return loss
        logits = q @ t.T / tau
        loss = pair_nce(logits, positives, targets)
        if batch.stage == 2 and opts.hard_weight:
            loss = loss + opts.hard_weight * pair_hard_nce(logits, positives, targets, opts.hard_k)
        return loss


# ----------------------------------------------------------------------------------- batches


def training_rows(data: TrainingData, multi_positive: bool) -> list[tuple[Query, str | None]]:
    """One row per task (multi-positive), or one per (task, gold tool) pair (single-positive)."""
    queries = [q for q in data.train if any(label in data.tools for label in q.labels)]
    if multi_positive:
        return [(q, None) for q in queries]
    return [(q, label) for q in queries for label in dict.fromkeys(q.labels) if label in data.tools]


def row_batches(rows: Sequence, groups: Sequence[str], balance: str, batch_size: int, seed: int,
                epoch: int) -> list[list]:
    """One epoch's batches of rows; deterministic for (seed, epoch). `groups[i]` is row i's training set.
    'sets' with several sets: each set gets the same share of the epoch (`embed.epoch_examples`)."""
    if balance != "sets" or len(set(groups)) < 2:
        return batched(list(rows), batch_size, seed, epoch)
    chosen = [rows[i] for i in epoch_examples(range(len(rows)), groups, "sets", seed, epoch)]
    return [chosen[s:s + batch_size] for s in range(0, len(chosen), batch_size)]


# ------------------------------------------------------------------------------------------ fit


def fit_toolclip(data: TrainingData, out: str | Path, *, model: str | None = None, config: TrainConfig | None = None,
                 resume: bool = True, **options: Any) -> RunSummary:
    """Train ToolCLIP on `data` and write a model directory to `out` (see the module doc for the loss).

    `model`: the base encoder both towers start from (name or path; default all-MiniLM-L6-v2), or a
    toolclip model directory to continue training. `options`: see `ToolCLIPOptions`.
    """
    opts = ToolCLIPOptions.make(**options)
    cfg = config or TrainConfig()
    device = pick_device(cfg.device)
    net, featurizer, base_model = _start_model(model, opts, device, cfg.seed)
    rows = training_rows(data, opts.multi_positive)
    if not rows:
        raise ValueError("no training query has a gold tool in the training catalog; nothing to train on")
    sets_of_tools = tool_sets(data)
    schedule = StageSchedule(rows, [query_set(q, sets_of_tools) for q, _target in rows], opts, cfg)
    set_filters = _set_filters(sets_of_tools)
    miner = None
    if opts.negatives == "hard" and schedule.stage2_from < schedule.total_steps and opts.extra_per_query > 0:
        miner = build_miner(opts.miner, base_model, list(data.tools.values()))
    objective = ToolCLIPObjective(net, featurizer, data, opts, device, cfg.seed, miner, set_filters)
    encoder = ToolCLIPEncoder(net, featurizer, "training", device)
    validate = _macro_validation(encoder, data, sets_of_tools, set_filters)
    use_validation = opts.validate and bool(data.validation)
    before = validate() if use_validation and opts.validate_at_start else None
    trainer = Trainer("toolclip", net, objective, schedule.epoch_batches, cfg, out,
                      validate=validate if use_validation else None, made_with=run_settings(data, model, **options))
    summary = trainer.fit(resume=resume)
    summary.data = data.summary()
    summary.config = {**summary.config, **asdict(opts), "base_model": base_model,
                      "stage2_from_step": schedule.stage2_from, "total_steps": schedule.total_steps,
                      "rows": len(rows), "device": device}
    if before is not None:
        summary.history.insert(0, {"step": 0, "validation_ndcg@10": round(before, 3)})
    net.eval()
    save_model(out, net, featurizer, summary=summary.to_dict(), training=asdict(opts))
    trainer.finish()
    return summary


def _start_model(model: str | None, opts: ToolCLIPOptions, device: str, seed: int):
    """(network on `device`, featurizer, base model name): a toolclip model directory to continue, or a
    fresh ToolCLIP whose towers start from the encoder `model`."""
    from .loop import set_seed

    set_seed(seed)  # the heads' initialisation (non-square projections) depends on it
    if model_config(model, method="toolclip") is not None:
        net, featurizer, _meta = load_model(model, device)
        base_model = net.config.base_model
    else:
        base_model = str(model) if model else "default"
        net, featurizer = new_model(opts.architecture(base_model))
    net.to(device)
    return net, featurizer, base_model


class StageSchedule:
    """The batches of each epoch, every one marked with its optimiser step and stage: steps before
    `stage2_from` (the first `stage1_fraction` of all `total_steps`) are stage 1, the rest stage 2."""

    def __init__(self, rows: list, groups: list[str], opts: ToolCLIPOptions, cfg: TrainConfig):
        self.rows, self.groups, self.opts, self.cfg = rows, groups, opts, cfg
        self.steps_per_epoch = len(self.epoch_rows(0))
        self.total_steps = self.steps_per_epoch * cfg.epochs if cfg.max_steps is None \
            else min(self.steps_per_epoch * cfg.epochs, cfg.max_steps)
        self.stage2_from = int(round(self.total_steps * opts.stage1_fraction))  # steps with index >= this: stage 2

    def epoch_rows(self, epoch: int) -> list[list[tuple[Query, str | None]]]:
        return row_batches(self.rows, self.groups, self.opts.balance, self.cfg.batch_size, self.cfg.seed, epoch)

    def epoch_batches(self, epoch: int) -> list[Batch]:
        out_batches = []
        for i, chunk in enumerate(self.epoch_rows(epoch)):
            step = epoch * self.steps_per_epoch + i
            out_batches.append(Batch(chunk, step, 2 if step >= self.stage2_from else 1))
        return out_batches


def _set_filters(sets_of_tools: dict[str, str]) -> dict[str, Filter]:
    """Set name → a filter to its own tools (none with a single set: the catalog is the set)."""
    members: dict[str, list[str]] = {}
    for tool_id, set_name in sets_of_tools.items():
        members.setdefault(set_name, []).append(tool_id)
    return {name: Filter.make(ids=ids) for name, ids in members.items()} if len(members) > 1 else {}


def _macro_validation(encoder: ToolCLIPEncoder, data: TrainingData, sets_of_tools: dict[str, str],
                      set_filters: dict[str, Filter]):
    """Validation: the macro nDCG@10 over the sets, each set's validation tasks ranked among its own tools."""
    catalog = list(data.tools.values())
    validation_sets: dict[str, list[Query]] = {}
    for q in data.validation:
        validation_sets.setdefault(query_set(q, sets_of_tools), []).append(q)

    def validate() -> float:
        from ..retrievers.toolclip import ToolCLIPRetriever

        retriever = ToolCLIPRetriever(encoder=encoder, batch_size=64)
        retriever.index(catalog)
        scores = [validation_ndcg(lambda texts, k, f=set_filters.get(name): retriever.search(texts, k, filter=f),
                                  queries) for name, queries in sorted(validation_sets.items())]
        return sum(scores) / len(scores)

    return validate
