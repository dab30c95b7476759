"""fit_cross: Tool-Rank (the Tool-REX paper §2.5) — fine-tune a cross-encoder reranker on (query, tool document) pairs.

The paper fine-tunes Qwen3-Reranker-4B (LoRA) with cross-entropy on "is this document relevant?"
judgements. This is the same pointwise recipe at CPU scale:

- Model: the all-MiniLM-L6-v2 encoder (or `model`) as a Hugging Face sequence classifier with one logit
  (a fresh head on the pretrained encoder). The reranker's score is sigmoid(logit) = P(relevant).
- Examples: every (train query, gold tool) pair is a positive (label 1) with `negatives` negatives
  (label 0) drawn for it. A share `hard_fraction` are hard negatives: tools the first stage
  (`first_stage`, default the untrained dense retriever) ranks in its top `depth` for the query but
  which are not gold, sampled afresh each epoch. The rest are random tools of the same set. Why both:
  at test time the reranker only ever sees the first stage's top candidates, so it must learn the fine
  distinctions among them (hard negatives); random ones keep it calibrated on obvious mismatches and
  dilute the unlabelled-but-relevant tools that hide among the hardest ones (false negatives).
- The first stage runs over each training set's own tools (one index per set), the test protocol, so a
  query's hard negatives are tools it will actually be ranked against.
- Loss: binary cross-entropy with logits over all pairs of a batch (pointwise). `batch_size` counts
  pairs; a batch holds whole groups (a positive with its negatives), at least one.
- `balance='sets'` (default, as in `fit_embed`): every training set gets the same share of an epoch,
  so one huge set does not drown the small ones.
- Validation (early stopping in `Trainer`): the validation queries (at most `max_validation`, split
  evenly over the sets) are ranked by the first stage within their own set, its top `rerank_depth` are
  reranked, and the macro nDCG@10 over the sets is the score. The first stage's candidates are fixed,
  so they are computed once. With `validate_start` the first stage alone is scored too, so the summary
  shows what reranking adds (`summary.data['first_stage_validation']`).
- Score fusion: each validation pass also tries mixing the first stage's score into the reranker's,
  (1 − w)·z(logit) + w·z(first stage) for w in `fusion_weights`, and scores the best w. After training
  the best weights are scored once more and the winning w is saved as the model's `first_stage_weight`
  (the reranker's default). Why: a small cross-encoder trained for minutes on a CPU knows less than a
  first stage built on the whole catalog; fusing keeps what each gets right, and the weight is chosen
  on held-out training queries, never on test data. `fusion_weights=(0,)` trains a pure reranker.

The model directory holds the fine-tuned model and tokenizer in `model/` (plain Hugging Face files),
the text view, `max_length`, the rerank depth it was validated at, and the run summary;
`toolscout.rerank.cross.CrossEncoderReranker(model=DIR)` and `load_reranker(DIR)` load it.
"""

from __future__ import annotations

import json
import random
from functools import lru_cache
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ..artifacts import ArtifactError, write_artifact, write_json
from ..benchmark_sets import Query
from ..encoders import quiet_transformers
from ..eval.metrics import ndcg_at_k
from ..models import model_base, model_config
from ..rerank.base import fuse_with_first_stage
from ..rerank.cross import DEFAULT_MAX_LENGTH, PairScorer, encode_pairs, load_pair_model
from ..tool import TextView
from .data import TrainingData
from .embed import BALANCES, Example, PairSetup, RandomNegatives, epoch_examples, query_set
from .loop import RunSummary, TrainConfig, Trainer, pick_device, run_settings, set_seed
from .negatives import mine_hard_negatives

# ------------------------------------------------------------------------------------- base model


def base_model_path(model: str | Path | None) -> tuple[str, str]:
    """(name to record, folder or hub name to load) for the starting weights.

    `model`: None / 'default' (the packaged all-MiniLM-L6-v2), any sentence-transformers or Hugging Face
    name or folder, a `toolscout train embed` directory (start from the fine-tuned Tool-Embed encoder)
    or an earlier `toolscout train cross` directory (continue training it).
    """
    from ..encoders import resolve_model

    trained = model_config(model)
    if trained is not None:
        folder, config = trained
        method = config.get("method")
        if method == "cross":
            return str(Path(model).resolve()), str(folder / config.get("model", "model"))
        if method == "embed":
            return str(Path(model).resolve()), _transformer_folder(folder / config.get("encoder", "encoder"))
        raise ArtifactError(f"{model}: is a {method!r} model; a cross-encoder starts from an encoder "
                            "(a sentence-transformers name or folder, or a `train embed`/`train cross` directory)")
    name = "default" if model is None else str(model)
    path = resolve_model(None if model is None else str(model))
    return name, _transformer_folder(path) if Path(path).is_dir() else path


def _transformer_folder(path: str | Path) -> str:
    """The Hugging Face model folder inside a sentence-transformers folder (its Transformer module's
    path: '' for MiniLM, '0_Transformer' for older saves); a plain HF folder is returned as is."""
    path = Path(path)
    modules = path / "modules.json"
    if modules.exists():
        for module in json.loads(modules.read_text()):
            if str(module.get("type", "")).endswith("Transformer"):
                return str(path / module.get("path", ""))
    return str(path)


# ------------------------------------------------------------------------------------- first stage


def make_first_stage(first_stage: str | Path):
    """A fresh (unindexed) retriever: a registered retriever name ('dense', 'bm25', ...) or a
    `toolscout train embed` directory (a dense retriever over that encoder)."""
    from ..retrievers.base import REGISTRY, make_retriever

    if isinstance(first_stage, str) and first_stage in REGISTRY:
        return make_retriever(first_stage)
    trained = model_config(first_stage)
    if trained is not None and trained[1].get("method") == "embed":
        return make_retriever("dense", model=str(first_stage))
    raise ValueError(f"first_stage must be one of {', '.join(REGISTRY)} or a `train embed` directory, "
                     f"got {first_stage!r}")


def queries_by_set(queries: Sequence[Query], sets_of_tools: Mapping[str, str]) -> dict[str, list[int]]:
    """set name → indices of its queries."""
    out: dict[str, list[int]] = {}
    for qi, q in enumerate(queries):
        out.setdefault(query_set(q, sets_of_tools), []).append(qi)
    return out


def cap_validation(queries: Sequence[Query], sets_of_tools: Mapping[str, str], max_queries: int | None,
                   seed: int) -> dict[str, list[Query]]:
    """The validation queries per set, at most `max_queries` in all (split evenly over the sets)."""
    by_set = {name: [queries[i] for i in idx] for name, idx in queries_by_set(queries, sets_of_tools).items()}
    per_set = None if not max_queries else max(1, max_queries // max(1, len(by_set)))
    rng = random.Random(seed)
    return {name: (rng.sample(qs, per_set) if per_set and len(qs) > per_set else qs)
            for name, qs in sorted(by_set.items())}


def first_stage_runs(data: TrainingData, first_stage: str | Path, sets_of_tools: Mapping[str, str], *,
                     depth: int, rerank_depth: int, validation: Mapping[str, Sequence[Query]],
                     mine: bool = True) -> tuple[dict[int, list[str]], dict[str, list[tuple[list[str], list[float]]]]]:
    """Run the first stage once per training set, over that set's tools only (the test protocol).

    Returns (hard-negative pool per train query index: its top-`depth` non-gold tools; per set, the
    top-`rerank_depth` (candidate ids, first-stage scores) of each of `validation[set]`'s queries, in
    first-stage order).
    """
    if not mine and not validation:
        return {}, {}
    retriever = make_first_stage(first_stage)
    train_by_set = queries_by_set(data.train, sets_of_tools) if mine else {}
    members: dict[str, list] = {}
    for tid, tool in data.tools.items():
        members.setdefault(sets_of_tools.get(tid, ""), []).append(tool)
    pools: dict[int, list[str]] = {}
    candidates: dict[str, list[tuple[list[str], list[float]]]] = {}
    for name in sorted(set(train_by_set) | set(validation)):
        tools = members.get(name, [])
        if not tools:
            continue
        retriever.index(tools)  # index() starts over: one set's tools at a time
        idx = train_by_set.get(name, [])
        if idx:
            mined = mine_hard_negatives(retriever, [data.train[i] for i in idx], per_query=depth, depth=depth)
            pools.update(zip(idx, mined))
        val = list(validation.get(name, ()))
        if val:
            results = retriever.search([q.text for q in val], rerank_depth)
            candidates[name] = [(list(ids), [float(x) for x in scores]) for ids, scores in results]
    return pools, candidates


# ------------------------------------------------------------------------------------- examples


def hard_count(negatives: int, hard_fraction: float) -> int:
    """How many of a pair's `negatives` are hard (rounded half up: 3 × 0.5 → 2)."""
    return min(negatives, int(negatives * hard_fraction + 0.5))


def make_groups(examples: Sequence[tuple[int, str]], queries: Sequence[Query], pools: Mapping[int, Sequence[str]],
                sampler: RandomNegatives, negatives: int, hard_fraction: float, seed: int,
                epoch: int) -> list[Example]:
    """One `Example` per (query, gold tool): its hard negatives (sampled from the query's mined pool) then
    random ones of the same set; never a gold tool, never twice. A short pool is topped up with random
    tools so every pair gets `negatives` when its set has that many other tools. Deterministic per epoch."""
    rng = random.Random(seed * 7_919 + epoch + 1)
    n_hard = hard_count(negatives, hard_fraction)
    out = []
    for qi, tool in examples:
        gold = frozenset(queries[qi].labels)
        pool = [t for t in pools.get(qi, ()) if t not in gold]  # mining excludes gold already; be safe
        hard = rng.sample(pool, min(n_hard, len(pool)))
        rand = sampler.sample(gold | set(hard), negatives - len(hard), rng, like=tool)
        out.append(Example(qi, tool, tuple(hard + rand)))
    return out


def group_batches(groups: Sequence[Example], batch_size: int, negatives: int) -> list[list[Example]]:
    """Cut groups into batches of about `batch_size` pairs (whole groups, at least one per batch)."""
    per_batch = max(1, batch_size // (1 + negatives))
    return [list(groups[s:s + per_batch]) for s in range(0, len(groups), per_batch)]


def pair_count(batch: Sequence[Example]) -> int:
    return sum(1 + len(ex.negatives) for ex in batch)


def batch_pairs(batch: Sequence[Example], queries: Sequence[Query],
                documents: Mapping[str, str]) -> tuple[list[str], list[str], list[float]]:
    """(query texts, tool texts, labels) of every pair of a batch."""
    qs, ds, labels = [], [], []
    for ex in batch:
        text = queries[ex.query].text
        for tid, label in [(ex.tool, 1.0)] + [(n, 0.0) for n in ex.negatives]:
            qs.append(text)
            ds.append(documents[tid])
            labels.append(label)
    return qs, ds, labels


class PairLoss:
    """Mean binary cross-entropy with logits over the pairs of a batch."""

    def __init__(self, model, tokenizer, queries: Sequence[Query], documents: Mapping[str, str], max_length: int,
                 device: str):
        self.model, self.tokenizer, self.queries, self.documents = model, tokenizer, queries, documents
        self.max_length, self.device = max_length, device

    def __call__(self, batch: Sequence[Example]):
        import torch
        import torch.nn.functional as F

        qs, ds, labels = batch_pairs(batch, self.queries, self.documents)
        features = {k: v.to(self.device) for k, v in encode_pairs(self.tokenizer, qs, ds, self.max_length).items()}
        logits = self.model(**features).logits[:, 0]
        return F.binary_cross_entropy_with_logits(logits.float(), torch.tensor(labels, device=logits.device))


# ------------------------------------------------------------------------------------- validation


def ranked_ndcg(candidates: Sequence[Sequence[str]], queries: Sequence[Query], k: int = 10) -> float:
    """Mean nDCG@k (points) of ranked id lists."""
    if not queries:
        return float("nan")
    return 100.0 * sum(ndcg_at_k(list(ids), set(q.labels), k) for ids, q in zip(candidates, queries)) / len(queries)


FUSION_WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


class RerankValidation:
    """Macro nDCG@10 over the sets of the first stage's top candidates reranked by the live model.

    Each call scores every weight of `fusion_weights` (see `fuse_with_first_stage`) from one pass of the
    model and returns the best; `weight`, `per_set` and `pure` (the unfused score) describe that call.
    Ties go to the smaller weight: the reranker's own order is preferred when fusion adds nothing.
    """

    def __init__(self, scorer: PairScorer, validation: Mapping[str, Sequence[Query]],
                 candidates: Mapping[str, Sequence[tuple[Sequence[str], Sequence[float]]]],
                 documents: Mapping[str, str], fusion_weights: Sequence[float] = FUSION_WEIGHTS):
        self.scorer, self.documents = scorer, documents
        self.queries = {s: list(validation[s]) for s in candidates}
        self.candidates = {s: [(list(ids), np.asarray(scores, dtype=np.float64)) for ids, scores in candidates[s]]
                           for s in candidates}
        self.fusion_weights = sorted({float(w) for w in fusion_weights}) or [0.0]
        self.per_set: dict[str, float] = {}
        self.weight = 0.0
        self.pure: float | None = None
        self.by_weight: dict[float, float] = {}

    def __len__(self) -> int:
        return sum(len(q) for q in self.queries.values())

    def first_stage(self) -> tuple[float, dict[str, float]]:
        per_set = {s: ranked_ndcg([ids for ids, _ in self.candidates[s]], self.queries[s]) for s in self.queries}
        return _macro(per_set), per_set

    def __call__(self) -> float:
        pairs_q, pairs_d, spans = [], [], []
        for name in self.queries:
            for q, (ids, scores) in zip(self.queries[name], self.candidates[name]):
                start = len(pairs_d)
                pairs_q.extend([q.text] * len(ids))
                pairs_d.extend(self.documents[t] for t in ids)
                spans.append((name, ids, scores, start, len(pairs_d)))
        logits = self.scorer.logits(pairs_q, pairs_d)  # one pass over every pair: length-sorted batches
        best = None
        self.by_weight, self.pure = {}, None
        for weight in self.fusion_weights:
            ranked: dict[str, list[list[str]]] = {name: [] for name in self.queries}
            for name, ids, scores, a, b in spans:
                fused = fuse_with_first_stage(logits[a:b], scores, weight)
                order = np.argsort(-fused, kind="stable")  # ties keep the first stage's order
                ranked[name].append([ids[i] for i in order])
            per_set = {s: ranked_ndcg(ranked[s], self.queries[s]) for s in self.queries}
            score = _macro(per_set)
            self.by_weight[weight] = round(score, 3)
            if weight == 0.0:
                self.pure = score
            if best is None or score > best[0] + 1e-9:
                best = (score, weight, per_set)
        score, self.weight, self.per_set = best
        return score


def _macro(per_set: Mapping[str, float]) -> float:
    return sum(per_set.values()) / len(per_set) if per_set else float("nan")


# ------------------------------------------------------------------------------------- fit


def fit_cross(data: TrainingData, out: str | Path, *, model: str | None = None, config: TrainConfig | None = None,
              resume: bool = True, first_stage: str = "dense", negatives: int = 3, hard_fraction: float = 0.5,
              depth: int = 30, max_length: int = DEFAULT_MAX_LENGTH, balance: str = "sets",
              max_validation: int | None = 300, rerank_depth: int = 20, view: TextView | dict | None = None,
              validate_start: bool = True, fusion_weights: Sequence[float] = FUSION_WEIGHTS) -> RunSummary:
    """Fine-tune a cross-encoder reranker on `data.train` and write a model directory to `out`.

    `model`: starting weights (default all-MiniLM-L6-v2; see `base_model_path`). `first_stage`: the
    retriever that mines hard negatives and gives validation candidates ('dense', 'bm25', ... or a
    `train embed` directory). `negatives`: negatives per positive pair, `hard_fraction` of them mined
    from the first stage's top `depth` (the rest random tools of the same set). `max_length`: tokens
    per (query, tool text) pair. `balance`: 'sets' or 'size' (as in `fit_embed`). Validation reranks the
    first stage's top `rerank_depth` for at most `max_validation` queries; `rerank_depth` is also the
    depth the saved reranker uses by default. `view`: the tool text view. `validate_start`: also score
    the first stage alone (summary.data['first_stage_validation']). `fusion_weights`: the first-stage
    weights tried on validation (module docstring); the best is saved as `first_stage_weight`.
    `config.batch_size` counts (query, tool) pairs.
    """
    _check_cross_options(balance, negatives, hard_fraction, depth, rerank_depth, max_length)
    config = config or TrainConfig()
    view = TextView.from_dict(view) if isinstance(view, dict) else (view or TextView())
    device = pick_device(config.device)
    base_name, base_path = base_model_path(model)
    set_seed(config.seed)  # the fresh classification head is drawn here: same seed, same start
    tokenizer, net = load_pair_model(base_path, device=device)

    setup = PairSetup.of(data, view)
    sampler = RandomNegatives(list(data.tools), groups=setup.sets_of_tools)  # random negatives from the pair's own set
    validation = cap_validation(data.validation, setup.sets_of_tools, max_validation, config.seed)
    pools, candidates = first_stage_runs(data, first_stage, setup.sets_of_tools, depth=depth,
                                         rerank_depth=rerank_depth, validation=validation,
                                         mine=hard_count(negatives, hard_fraction) > 0)

    @lru_cache(maxsize=2)
    def epoch_batches(epoch: int):
        examples = epoch_examples(setup.pairs, setup.pair_groups, balance, config.seed, epoch)
        groups = make_groups(examples, data.train, pools, sampler, negatives, hard_fraction, config.seed, epoch)
        return group_batches(groups, config.batch_size, negatives)

    validate = None
    if candidates:  # PairScorer: the very inputs the reranker will see
        scorer = PairScorer(tokenizer, net, max_length=max_length, batch_size=max(32, config.batch_size))
        validate = RerankValidation(scorer, validation, candidates, setup.documents, fusion_weights)
    trainer = Trainer("cross", net, PairLoss(net, tokenizer, data.train, setup.documents, max_length, device),
                      epoch_batches, config, out, validate=validate, batch_size_of=pair_count,
                      made_with=run_settings(data, model, first_stage=first_stage, negatives=negatives,
                                             hard_fraction=hard_fraction, depth=depth, max_length=max_length,
                                             balance=balance, view=view))

    trainer.will_resume(resume)  # a checkpoint made with other settings is refused before the start validation
    start_score, start_per_set = (validate.first_stage() if validate is not None and validate_start else (None, {}))
    summary = trainer.fit(resume=resume)
    net.eval()
    first_stage_weight = _best_fusion_weight(validate, summary)
    summary.data = {**data.summary(), "pairs": len(setup.pairs), "balance": balance,
                    "examples_per_epoch": sum(pair_count(b) for b in epoch_batches(0)),
                    "hard_negatives_per_pair": hard_count(negatives, hard_fraction),
                    "queries_with_mined_negatives": sum(1 for p in pools.values() if p),
                    "validation_queries": len(validate) if validate is not None else 0,
                    **_validation_record(summary, validate, start_score, start_per_set, first_stage_weight)}
    summary.config = {**summary.config, "base_model": base_name, "first_stage": str(first_stage),
                      "negatives": negatives, "hard_fraction": hard_fraction, "depth": depth,
                      "max_length": max_length, "balance": balance, "rerank_depth": rerank_depth,
                      "max_validation": max_validation, "fusion_weights": list(fusion_weights)}
    _save_cross(out, net, tokenizer, summary, base_model=base_name, model="model", view=view.to_dict(),
                max_length=max_length, depth=rerank_depth, first_stage=str(first_stage),
                first_stage_weight=first_stage_weight)
    trainer.finish()
    return summary


def _best_fusion_weight(validate: RerankValidation | None, summary: RunSummary) -> float:
    """The first-stage weight that validates best with the trained weights (0 without validation)."""
    if validate is None or summary.best_validation is None:
        return 0.0
    validate()  # the best weights are back in the model: pick the fusion weight for them
    return validate.weight


def _save_cross(out: str | Path, net, tokenizer, summary: RunSummary, **config) -> None:
    """The model directory: `model/` (Hugging Face files), the summary, and `config` in config.json."""
    with write_artifact(out, model_base("cross", **config, summary=summary.to_dict())) as folder, \
            quiet_transformers():
        net.save_pretrained(str(folder / "model"))
        tokenizer.save_pretrained(str(folder / "model"))
        write_json(folder / "summary.json", summary.to_dict())


def _check_cross_options(balance: str, negatives: int, hard_fraction: float, depth: int, rerank_depth: int,
                         max_length: int) -> None:
    if balance not in BALANCES:
        raise ValueError(f"balance must be one of {', '.join(BALANCES)}, got {balance!r}")
    if negatives < 1:
        raise ValueError(f"negatives must be >= 1 (a pointwise loss needs negative pairs), got {negatives}")
    if not 0.0 <= hard_fraction <= 1.0:
        raise ValueError(f"hard_fraction must be in [0, 1], got {hard_fraction}")
    if depth < 1 or rerank_depth < 1 or max_length < 8:
        raise ValueError(f"need depth >= 1, rerank_depth >= 1 and max_length >= 8; got {depth}, {rerank_depth}, "
                         f"{max_length}")


def _validation_record(summary: RunSummary, validate: RerankValidation | None, start_score: float | None,
                       start_per_set: Mapping[str, float], first_stage_weight: float) -> dict:
    """What validation found, for the run summary: the first stage alone, the gain, the fusion weights."""
    out: dict = {}
    if start_score is not None:
        out["first_stage_validation"] = round(start_score, 3)
        out["first_stage_validation_per_set"] = {k: round(v, 3) for k, v in start_per_set.items()}
        if summary.best_validation is not None:
            out["reranking_gain"] = round(summary.best_validation - start_score, 3)
    if validate is not None and validate.per_set:
        out["best_validation_per_set"] = {k: round(v, 3) for k, v in validate.per_set.items()}
        out["validation_by_first_stage_weight"] = {str(w): v for w, v in validate.by_weight.items()}
        out["first_stage_weight"] = first_stage_weight
        out["reranker_alone_validation"] = round(validate.pure, 3) if validate.pure is not None else None
    return out


__all__ = ["fit_cross", "base_model_path", "make_first_stage", "first_stage_runs", "make_groups", "group_batches",
           "PairLoss", "RerankValidation", "hard_count", "FUSION_WEIGHTS"]
