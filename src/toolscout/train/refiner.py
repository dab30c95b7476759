"""`toolscout train refiner`: fit ToolRefiner (see `toolscout.rerank.refiner`) on a real first stage's
candidates, so its negatives are exactly the mistakes that first stage makes.

First stages (`first_stage`; by default the method of `first_stage_model`, else "tool2vec"):
  "tool2vec" — usage vectors from the training queries (prior-blended with descriptions, as
        `train tool2vec` does), or the vectors of an existing `train tool2vec` directory
        (`first_stage_model`). Leave-one-out: a training query's own embedding is taken out of its gold
        tools' vectors before ranking and before those vectors enter the refiner. Without this the first
        stage would find the gold tools of training queries far more easily than it does for new
        queries (each gold vector contains the query), and the refiner would learn to trust a signal
        that is absent at search time. (Applied to a given directory only when its usage table was
        built from exactly these training queries; otherwise the run says so in its summary.)
  "mlc" — the rankings of a `train mlc` directory (`first_stage_model`, required), with Tool2Vec vectors
        as above: from the training queries, or from `tool2vec_model` (the paper's "ToolRefiner + MLC").
        Leave-one-out applies to the vectors; the MLC model's rankings of its own training queries are
        what they are (easier than on new queries).
  "dense" — description vectors (no leakage to remove);
  any other registered retriever (bm25, hybrid, ...) — its rankings (with its model directory, when
        `first_stage_model` names one), with description vectors.

Behind tool2vec and mlc the model directory carries the Tool2Vec usage table it was trained with
(`usage.npz`), so the reranker makes the same vectors behind any first stage (vectors="tool2vec").
Candidates for a query come from its own training set's tools (the test protocol). Validation reranks
the first stage's top `depth` for the held-out queries and measures nDCG@10; early stopping and the
best-weights rule come from `Trainer`. The model directory holds `transformer/` (HF weights and
tokenizer), `heads.pt` (projection, score embedding, output head and prior weights) and the settings the reranker needs.
"""

from __future__ import annotations

import warnings

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..artifacts import write_artifact, write_json
from ..encoders import quiet_transformers
from ..eval.metrics import ndcg_at_k
from ..models import model_base, model_config
from ..rerank.refiner import (
    HEADS_FILE,
    USAGE_FILE,
    VECTOR_SOURCES,
    build_refiner_net,
    load_transformer,
    padded_candidates,
)
from ..tool import TextView, tool_text
from .data import TrainingData
from .embed import tool_sets
from .loop import RunSummary, TrainConfig, Trainer, batched, pick_device, run_settings


@dataclass
class Candidates:
    """One query's first-stage candidates: tool ids, their vectors (leave-one-out applied) and labels."""

    ids: list[str]
    vectors: np.ndarray  # [n, D]
    labels: np.ndarray  # [n] 1.0 = gold
    scores: np.ndarray  # [n] the first stage's scores


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.maximum(np.linalg.norm(v, axis=-1, keepdims=True), 1e-12)


TOOL2VEC_FIRST_STAGES = ("tool2vec", "mlc")  # the paper's first stages, behind which the refiner reads Tool2Vec vectors


def trained_vectors(first_stage: str) -> str:
    """The `vectors` setting (rerank/refiner.py) of a refiner trained behind `first_stage`: the Tool2Vec
    vectors it carries behind tool2vec and mlc, a dense first stage's own stored vectors, else descriptions."""
    if first_stage in TOOL2VEC_FIRST_STAGES:
        return "tool2vec"
    return "first_stage" if first_stage == "dense" else "description"


def _method_of(path: str | None) -> str | None:
    trained = model_config(path)
    return trained[1].get("method") if trained else None


def first_stage_of(first_stage: str | None, first_stage_model: str | None) -> str:
    """`first_stage` as given, else the retriever `first_stage_model` was trained for, else "tool2vec"."""
    from ..retrievers.base import REGISTRY

    method = _method_of(first_stage_model)
    return first_stage or (method if method in REGISTRY else "tool2vec")


def _first_stage_methods() -> list[str]:
    """The `train` methods whose directory -o first_stage_model takes, the first stage then being that
    retriever (`first_stage_of`): tool2vec, mlc, toolclip."""
    from ..retrievers.base import REGISTRY, retriever_class

    return [name for name in REGISTRY if retriever_class(name).accepts.trained_by == name]


def _check_model_dir(option: str, path: str, method: str) -> None:
    found = _method_of(path)
    if found == method:
        return
    what = f"is a {found!r} model" if found else "is not a toolscout model directory"
    hint = ""
    if option == "first_stage_model":  # the directory chooses the first stage: name every one it may be
        others = [m for m in _first_stage_methods() if m != method]
        hint = (f" (for a {found} first stage: -o first_stage={found})" if found in others else
                f", or that of another first stage: `train {'`, `train '.join(others)}` (-o first_stage follows it)")
    raise ValueError(f"-o {option}={path}: {what}; it should be a `toolscout train {method}` directory{hint}")


def tool2vec_source(first_stage: str, first_stage_model: str | None, tool2vec_model: str | None) -> str | None:
    """The `train tool2vec` directory whose vectors the refiner is trained on (None: made from the training
    queries), after checking that the model directories given fit `first_stage`."""
    from ..retrievers.base import retriever_class

    accepts = retriever_class(first_stage).accepts  # an unknown name is refused, listing the known ones
    if first_stage_model is not None:
        if first_stage == "dense" or not accepts.model:
            raise ValueError(f"-o first_stage_model: the {first_stage} first stage takes no model directory"
                             + (" (it ranks with --model's encoder)" if first_stage == "dense" else ""))
        _check_model_dir("first_stage_model", first_stage_model, accepts.trained_by)
    elif accepts.needs_trained_model and first_stage != "tool2vec":  # tool2vec's usage is made here
        raise ValueError(f"first_stage={first_stage} needs -o first_stage_model=DIR, a `toolscout train "
                         f"{accepts.trained_by}` directory")
    if tool2vec_model is not None:
        if trained_vectors(first_stage) != "tool2vec":
            raise ValueError(f"-o tool2vec_model: behind a {first_stage} first stage the refiner reads "
                             f"{trained_vectors(first_stage)} vectors (Tool2Vec ones behind "
                             f"{' or '.join(TOOL2VEC_FIRST_STAGES)})")
        _check_model_dir("tool2vec_model", tool2vec_model, "tool2vec")
    if first_stage != "tool2vec":
        return tool2vec_model
    if first_stage_model and tool2vec_model and Path(first_stage_model).resolve() != Path(tool2vec_model).resolve():
        raise ValueError("-o first_stage_model and -o tool2vec_model name two Tool2Vec models; behind a tool2vec "
                         "first stage the refiner reads the first stage's vectors: give one")
    return first_stage_model or tool2vec_model


def _check_same_encoder(model: str | None, tool2vec_encoder: str, source: str) -> None:
    """A refiner reads Tool2Vec vectors in the space of the encoder that made them, so it trains over that
    encoder: another `model` given with them would be ignored, which is refused instead."""
    from ..encoders.resolve import resolve_model

    if model is None or resolve_model(model) == resolve_model(tool2vec_encoder):
        return
    raise ValueError(f"--model {model}: the refiner reads the Tool2Vec vectors of {source}, which the encoder "
                     f"{tool2vec_encoder} made, and trains over that encoder; leave --model out (or give that "
                     "encoder)")


class CandidateBuilder:
    """Ranks each query's own set's tools with the chosen first stage and keeps the top `depth`.

    `vectors` are the candidate vectors the refiner reads (`trained_vectors`): Tool2Vec vectors (from
    `tool2vec_model`, a `train tool2vec` directory, or made from the training queries), a dense first
    stage's vectors, or descriptions."""

    def __init__(self, data: TrainingData, first_stage: str, first_stage_model: str | None, model: str | None,
                 view: TextView, prior: float, depth: int, progress: bool, tool2vec_model: str | None = None):
        from ..retrievers.dense import default_summary_weight, embed_tools, encoder_for

        self.data, self.first_stage, self.depth, self.view = data, first_stage, depth, view
        self.first_stage_model = first_stage_model
        self.vector_kind = trained_vectors(first_stage)
        self.set_of = tool_sets(data)
        self.notes: dict = {}
        source = tool2vec_source(first_stage, first_stage_model, tool2vec_model)
        trained = model_config(source, method="tool2vec") if source else None
        if trained is not None:
            folder, config = trained
            self.encoder_name = str(folder / "encoder") if config.get("finetuned") else config.get("encoder")
            _check_same_encoder(model, self.encoder_name, source)
            self.prior = float(config.get("prior", prior))
            self.view = TextView.from_dict(config.get("view")) if config.get("view") else view
        else:
            self.encoder_name, self.prior = model, prior
        self.encoder = encoder_for(self.encoder_name)
        ids = list(data.tools)
        self.row = {tid: i for i, tid in enumerate(ids)}
        self.ids = ids
        tools = [data.tools[t] for t in ids]
        # a dense first stage's stored vectors blend in the summary (DenseRetriever); Tool2Vec's do not
        self.summary_weight = default_summary_weight(self.encoder_name) if first_stage == "dense" else 0.0
        if self.summary_weight:
            self.notes["summary_weight"] = self.summary_weight
        self.descriptions = embed_tools(self.encoder, tools, self.view, [tool_text(t, self.view) for t in tools],
                                        self.summary_weight, batch_size=64, show_progress=progress)
        self.train_vectors = self.encoder.encode([q.text for q in data.train], batch_size=128, show_progress=progress)
        self.validation_vectors = self.encoder.encode([q.text for q in data.validation], batch_size=128)
        dim = self.descriptions.shape[1]
        self.sums = np.zeros((len(ids), dim), np.float32)
        self.counts = np.zeros(len(ids), np.int64)
        self.leave_one_out = False
        self.usage = None  # the Tool2Vec usage table the refiner carries ("tool2vec" vectors)
        if self.vector_kind == "tool2vec":
            self._usage(trained)
        self.vectors = self._blend(self.sums, self.counts)

    def _usage(self, trained) -> None:
        """Tool2Vec usage sums: from the training queries, or from the `train tool2vec` directory's table.
        Leave-one-out (subtracting a query from its gold tools' vectors) is only right when the usage
        is exactly these training queries, so a directory's table is compared against them first."""
        from ..retrievers.tool2vec import UsageTable

        for q, vec in zip(self.data.train, self.train_vectors):
            for label in q.labels:
                if label in self.row:
                    self.sums[self.row[label]] += vec
                    self.counts[self.row[label]] += 1
        self.leave_one_out = True
        if trained is None:
            self.usage = UsageTable(self.descriptions.shape[1])
            for tid, i in self.row.items():
                if self.counts[i]:
                    self.usage.sums[tid], self.usage.counts[tid] = self.sums[i].copy(), int(self.counts[i])
            return
        self.usage = UsageTable.load(trained[0] / "usage.npz", self.descriptions.shape[1])  # carried whole
        own_counts = self.counts.copy()
        self.sums[:] = 0
        self.counts[:] = 0
        for tid, total in self.usage.sums.items():
            if tid in self.row:
                self.sums[self.row[tid]], self.counts[self.row[tid]] = total, self.usage.counts[tid]
        if own_counts.any() and not self.counts.any():
            raise ValueError(f"{trained[0]}: its Tool2Vec usage names none of these tools (trained on another "
                             "set?): give the tool2vec directory trained on this data")
        self.leave_one_out = bool(np.array_equal(own_counts, self.counts))
        self.notes["leave_one_out"] = self.leave_one_out
        if not self.leave_one_out:
            self.notes["warning"] = ("the tool2vec directory's usage differs from these training queries: "
                                     "no leave-one-out, so training candidates are easier than real ones")
            warnings.warn(f"{trained[0]}: {self.notes['warning']}", stacklevel=2)

    def _blend(self, sums: np.ndarray, counts: np.ndarray) -> np.ndarray:
        blended = _unit(sums + self.prior * self.descriptions)
        return np.where((counts > 0)[:, None], blended, self.descriptions).astype(np.float32)

    def _without(self, row: int, query_vector: np.ndarray) -> np.ndarray:
        """Tool `row`'s Tool2Vec vector without one of its usage queries (its description if that was the only one)."""
        if self.counts[row] == 1:
            return self.descriptions[row]
        return _unit(self.sums[row] - query_vector + self.prior * self.descriptions[row])

    def build(self, queries, query_vectors: np.ndarray, leave_one_out: bool) -> list[Candidates]:
        leave_one_out = leave_one_out and self.leave_one_out
        if self.first_stage in ("tool2vec", "dense"):
            return self._by_vectors(queries, query_vectors, leave_one_out)
        return self._by_retriever(queries, query_vectors, leave_one_out)

    def _set_rows(self) -> dict[str, np.ndarray]:
        groups: dict[str, list[int]] = {}
        for tid, i in self.row.items():
            groups.setdefault(self.set_of.get(tid, ""), []).append(i)
        return {name: np.asarray(rows) for name, rows in groups.items()}

    def _by_vectors(self, queries, query_vectors: np.ndarray, leave_one_out: bool) -> list[Candidates]:
        set_rows = self._set_rows()
        by_set: dict[str, list[int]] = {}
        for i, q in enumerate(queries):
            known = [t for t in q.labels if t in self.row]
            by_set.setdefault(self.set_of.get(known[0], "") if known else "", []).append(i)
        out: list[Candidates | None] = [None] * len(queries)
        for name, members in by_set.items():
            rows = set_rows.get(name, np.arange(len(self.ids)))
            where = {int(r): j for j, r in enumerate(rows)}
            set_vectors = self.vectors[rows]
            scores = query_vectors[members] @ set_vectors.T  # [queries of the set, its tools]
            for m, i in enumerate(members):
                q, e = queries[i], query_vectors[i]
                gold = {self.row[t] for t in q.labels if t in self.row}
                own: dict[int, np.ndarray] = {}  # column -> the gold tool's vector without this query
                if leave_one_out:
                    for g in gold:
                        if g in where and self.counts[g] > 0:
                            own[where[g]] = self._without(g, e)
                            scores[m, where[g]] = float(own[where[g]] @ e)
                top = np.argsort(-scores[m], kind="stable")[: self.depth]
                vectors = set_vectors[top].copy()
                for j, col in enumerate(top):
                    if int(col) in own:
                        vectors[j] = own[int(col)]
                ids = [self.ids[rows[col]] for col in top]
                labels = np.asarray([1.0 if self.row[t] in gold else 0.0 for t in ids], np.float32)
                out[i] = Candidates(ids, vectors, labels, scores[m, top].astype(np.float32))
        return out  # type: ignore[return-value]

    def _retriever(self):
        from ..retrievers.base import make_retriever

        model = {"model": self.first_stage_model} if self.first_stage_model else {}
        return make_retriever(self.first_stage, **model)

    def _by_retriever(self, queries, query_vectors: np.ndarray, leave_one_out: bool) -> list[Candidates]:
        """Candidates ranked by the first stage itself, each set's tools indexed in turn; their vectors are
        `self.vectors` (Tool2Vec ones leave-one-out for a training query's gold tools)."""
        by_set: dict[str, list[int]] = {}
        for i, q in enumerate(queries):
            by_set.setdefault(self.set_of.get(q.labels[0], "") if q.labels else "", []).append(i)
        out: list[Candidates | None] = [None] * len(queries)
        retriever = self._retriever()
        for name, members in by_set.items():
            retriever.index([self.data.tools[t] for t in self.ids if self.set_of.get(t, "") == name])
            results = retriever.search([queries[i].text for i in members], self.depth)
            for i, (ids, scores) in zip(members, results):
                rows = [self.row[t] for t in ids]
                gold = {self.row[t] for t in queries[i].labels if t in self.row}
                vectors = self.vectors[rows]
                for j, r in enumerate(rows):
                    if leave_one_out and r in gold and self.counts[r] > 0:
                        vectors[j] = self._without(r, query_vectors[i])
                out[i] = Candidates(list(ids), vectors, np.asarray([1.0 if r in gold else 0.0 for r in rows], np.float32),
                                    np.asarray(scores, np.float32))
        return out  # type: ignore[return-value]


def fit_refiner(data: TrainingData, out: str | Path, *, model: str | None = None, config: TrainConfig | None = None,
                resume: bool = True, first_stage: str | None = None, first_stage_model: str | None = None,
                tool2vec_model: str | None = None, depth: int = 32, prior: float = 1.0, max_query_length: int = 64,
                head_lr: float = 1e-3, max_validation: int | None = 500, validate_start: bool = True,
                view: TextView | dict | None = None) -> RunSummary:
    """Train ToolRefiner on `data.train` over `first_stage`'s top `depth` candidates; write a model dir.

    `first_stage`: a retriever name (default: what `first_stage_model` was trained for, else tool2vec);
    `first_stage_model`: its model directory; `tool2vec_model`: behind mlc, the `train tool2vec` directory
    whose vectors the refiner reads (default: Tool2Vec vectors made from the training queries).
    `model`: the transformer to start from and the encoder of queries and descriptions (default
    all-MiniLM-L6-v2). `prior`: the Tool2Vec description blend when the usage is built here.
    `head_lr`: learning rate of the fresh projection and output head (the transformer uses `config.lr`).
    """
    from ..encoders import resolve_model

    if depth < 1:
        raise ValueError(f"depth must be at least 1, got {depth}")
    config = config or TrainConfig()
    view = TextView.from_dict(view) if isinstance(view, dict) else (view or TextView())
    device = pick_device(config.device)
    start = time.perf_counter()
    first_stage = first_stage_of(first_stage, first_stage_model)
    builder = CandidateBuilder(data, first_stage, first_stage_model, model, view, prior, depth, config.progress,
                               tool2vec_model)
    train = builder.build(data.train, builder.train_vectors, leave_one_out=True)
    validation_queries = data.validation[:max_validation] if max_validation else data.validation
    validation = builder.build(validation_queries, builder.validation_vectors[:len(validation_queries)],
                               leave_one_out=False)
    prepare_s = time.perf_counter() - start

    base_path = resolve_model(builder.encoder_name)  # `model`, or the Tool2Vec directory's encoder
    transformer, tokenizer = load_transformer(base_path)
    dim = builder.descriptions.shape[1]
    net = _refiner_net(transformer, dim, max_query_length, head_lr, device)
    inputs = RefinerInputs(tokenizer, dim, max_query_length, device)
    usable = [i for i, c in enumerate(train) if len(c.ids)]
    trainer = Trainer("refiner", net, _bce_loss(net, inputs, train, [q.text for q in data.train]),
                      lambda epoch: batched(usable, config.batch_size, config.seed, epoch), config, out,
                      validate=_reranked_ndcg(net, inputs, validation, validation_queries) if validation else None,
                      made_with=run_settings(data, model, first_stage=first_stage, first_stage_model=first_stage_model,
                                             tool2vec_model=tool2vec_model, depth=depth, prior=prior,
                                             max_query_length=max_query_length, head_lr=head_lr, view=view))
    summary = trainer.fit(resume=resume)
    net.eval()
    recall = sum(c.labels.sum() / max(1, len(q.labels)) for c, q in zip(train, data.train)) / max(1, len(train))
    summary.data = {**data.summary(), "prepare_s": round(prepare_s, 2), "first_stage": first_stage,
                    "train_candidate_recall": round(100.0 * float(recall), 2), **builder.notes}
    if validation and validate_start:
        summary.data["first_stage_validation"] = round(_first_stage_ndcg(validation, validation_queries), 3)
    summary.config = {**summary.config, "depth": depth, "head_lr": head_lr, "max_query_length": max_query_length,
                      "first_stage": first_stage, "first_stage_model": first_stage_model,
                      "tool2vec_model": tool2vec_model, "prior": builder.prior}
    config_out = model_base("refiner", base_model=base_path, depth=depth, vectors=builder.vector_kind,
                            vector_dim=dim, max_query_length=max_query_length, view=builder.view.to_dict(),
                            description_encoder=builder.encoder_name, first_stage=first_stage,
                            prior=builder.prior, summary=summary.to_dict())
    _save_refiner(out, config_out, net, transformer, tokenizer, summary, builder.usage)
    trainer.finish()
    return summary


def _refiner_net(transformer, dim: int, max_query_length: int, head_lr: float, device: str):
    """A fresh ToolRefiner on `transformer`; its fresh layers learn at `head_lr`, the transformer at the
    trainer's rate."""
    net = build_refiner_net(transformer, dim, max_query_length).to(device)
    net.param_groups = lambda lr: [
        {"params": list(net.transformer.parameters()), "lr": lr},
        {"params": [p for name, p in net.named_parameters() if not name.startswith("transformer.")], "lr": head_lr}]
    return net


class RefinerInputs:
    """The network's tensors for some queries and their candidates, padded to the most candidates."""

    def __init__(self, tokenizer, dim: int, max_query_length: int, device: str):
        self.tokenizer, self.dim, self.max_query_length, self.device = tokenizer, dim, max_query_length, device

    def __call__(self, indices: Sequence[int], cands: list[Candidates], query_texts: Sequence[str]):
        """(input_ids, attention_mask, vectors, candidate_mask, first-stage scores, labels) of `indices`."""
        import torch

        tokens = self.tokenizer([query_texts[i] for i in indices], padding=True, truncation=True,
                                max_length=self.max_query_length, return_tensors="pt")
        vectors, mask, scores = padded_candidates([cands[i].vectors for i in indices],
                                                  [cands[i].scores for i in indices], self.dim)
        labels = np.zeros(mask.shape, np.float32)
        for row, i in enumerate(indices):
            labels[row, :len(cands[i].ids)] = cands[i].labels
        device = self.device
        return (tokens["input_ids"].to(device), tokens["attention_mask"].to(device),
                torch.from_numpy(vectors).to(device), torch.from_numpy(mask).to(device),
                torch.from_numpy(scores).to(device), torch.from_numpy(labels).to(device))


def _bce_loss(net, inputs: RefinerInputs, train: list[Candidates], texts: Sequence[str]):
    """The training loss of a batch of query indices: binary cross-entropy over real candidate slots."""
    import torch

    def loss_fn(batch: list[int]):
        input_ids, attention, vectors, mask, scores, labels = inputs(batch, train, texts)
        logits = net(input_ids, attention, vectors, mask, scores)
        per_position = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels, reduction="none")
        weights = mask.float()
        return (per_position * weights).sum() / weights.sum().clamp(min=1.0)

    return loss_fn


def _reranked_ndcg(net, inputs: RefinerInputs, validation: list[Candidates], queries: Sequence):
    """Validation: mean nDCG@10 (points) of each query's candidates reordered by the live network."""
    import torch

    texts = [q.text for q in queries]

    def validate() -> float:
        net.eval()
        total = 0.0
        with torch.inference_mode():
            for chunk in batched(list(range(len(validation))), 64, 0, 0, shuffle=False):
                chunk = [i for i in chunk if len(validation[i].ids)]
                if not chunk:
                    continue
                input_ids, attention, vectors, mask, scores, _labels = inputs(chunk, validation, texts)
                probs = torch.sigmoid(net(input_ids, attention, vectors, mask, scores)).cpu().numpy()
                for row, i in enumerate(chunk):
                    ids = validation[i].ids
                    order = np.argsort(-probs[row, :len(ids)], kind="stable")
                    total += ndcg_at_k([ids[j] for j in order], set(queries[i].labels), 10)
        return 100.0 * total / max(1, len(validation))

    return validate


def _first_stage_ndcg(validation: list[Candidates], queries: Sequence) -> float:
    """Mean nDCG@10 (points) of the candidates in the first stage's own order."""
    return 100.0 * sum(ndcg_at_k(c.ids, set(q.labels), 10) for c, q in zip(validation, queries)) \
        / max(1, len(validation))


def _save_refiner(out: str | Path, config: dict, net, transformer, tokenizer, summary: RunSummary, usage) -> None:
    """The model directory; `usage`: the Tool2Vec usage table its "tool2vec" vectors are made from."""
    import torch

    assert config["vectors"] in VECTOR_SOURCES and (usage is not None) == (config["vectors"] == "tool2vec")
    with write_artifact(out, config) as folder, quiet_transformers():
        if usage is not None:
            usage.save(folder / USAGE_FILE)
        transformer.save_pretrained(str(folder / "transformer"))
        tokenizer.save_pretrained(str(folder / "transformer"))
        torch.save({k: v for k, v in net.state_dict().items() if not k.startswith("transformer.")}, folder / HEADS_FILE)
        write_json(folder / "summary.json", summary.to_dict())
