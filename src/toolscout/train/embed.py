"""fit_embed: Tool-Embed (the Tool-REX paper §2.5) — fine-tune one embedding model on (query, tool document) pairs.

Every (train query, gold tool) pair is one example. A batch of pairs becomes one contrastive problem:

- rows: the batch's distinct queries; columns: the distinct tool documents of the batch — every pair's
  gold tool plus `negatives` tools drawn at random from the catalog for that pair (never one of the
  query's gold tools);
- InfoNCE (`loss="infonce"`, the paper's loss) over cosine / τ with the multi-positive form: for a
  multi-tool query every one of its gold tools present in the batch counts as a positive, so a query's
  other gold tools are never pushed away as negatives (other pairs' tools are in-batch negatives);
- `loss="triplet"` is Tool2Vec's variant (the Tool2Vec paper §5): for each (query, gold tool, random negative)
  triplet, max(0, margin − cos(q, pos) + cos(q, neg)).

`balance` chooses how the examples of several training sets are mixed (see `epoch_examples`):
'size' uses every pair once per epoch (big sets dominate); 'sets' (the default) gives every set the
same share of each epoch (small sets repeat, big sets are subsampled). Validation is the macro nDCG@10
over the training sets, each set's validation queries ranked within its own tools (the test protocol),
with a DenseRetriever over the model being trained.

Why 'sets' by default: on the six dev sets with a train split, by-size mixing is 65% ToolLens and 25%
MetaTool pairs (web plugins, noisy labels). In 80-step runs the two mixes tied on macro validation
(68.7 size vs 68.1 sets, from 61.6 untrained: within the noise of ~15-60 validation queries per small
set), but by-size mixing made gorilla_torchhub worse than the untrained model (21.2 vs 23.3) while
set-balanced mixing improved every set; no set of an unseen domain should pay for the largest ones.

`trainable` chooses which weights change: 'all' (every weight), 'layers' (the transformer layers; the
token, position and type embeddings, their LayerNorm and the unused BERT pooler stay bit-identical to
the base model, so a shipped delta needs only the layers), or 'top:N' (only the top N transformer
layers). `hard_negatives` adds, per query, that many tools a first-stage retriever (`miner`: the
starting encoder or BM25) ranks highest among the tools of the query's own training set without being
gold; they are mined once per query, on first use, and join the random negatives.

The model directory holds the fine-tuned sentence-transformers model in `encoder/` (loadable by
`SentenceTransformer(path)` offline and by `DenseRetriever(model=DIR)`), the text view it was trained
with, and the run summary.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Mapping, Sequence

from ..artifacts import write_artifact, write_json
from ..benchmark_sets import Query
from ..encoders import quiet_transformers
from ..models import model_base
from ..results import Filter
from ..tool import TextView, tool_text
from .data import TrainingData
from .loop import RunSummary, TrainConfig, Trainer, _copy_state, run_settings, validation_ndcg

LOSSES = ("infonce", "triplet")
BALANCES = ("size", "sets")
MINERS = ("dense", "bm25")


@dataclass(frozen=True)
class Example:
    """One (query, gold tool) pair with the random negative tools drawn for it."""

    query: int  # index into the training queries
    tool: str
    negatives: tuple[str, ...] = ()


# ------------------------------------------------------------------------------------- negatives


class RandomNegatives:
    """Draws tools uniformly at random, never one of the given gold tools, never twice per draw.

    With `groups` (tool id → group, e.g. its benchmark set), a pair's negatives come from the group of
    its gold tool (`like`): the tools that query is ranked against at test time, rather than mostly
    tools of whichever set has the largest catalog.
    """

    def __init__(self, tool_ids: Sequence[str], groups: Mapping[str, str] | None = None):
        self.tool_ids = list(dict.fromkeys(tool_ids))
        self.groups = dict(groups or {})
        self.members: dict[str, list[str]] = {}
        for tid in self.tool_ids:
            self.members.setdefault(self.groups.get(tid, ""), []).append(tid)

    def sample(self, gold: set[str] | frozenset[str], n: int, rng: random.Random, like: str | None = None) -> list[str]:
        """`n` distinct tools, none in `gold` (fewer when the pool has fewer non-gold tools)."""
        pool = self.members.get(self.groups.get(like, ""), self.tool_ids) if self.groups else self.tool_ids
        allowed = [t for t in pool if t not in gold] if len(pool) <= 4 * (n + len(gold)) else None
        if n <= 0 or (allowed is not None and not allowed):
            return []
        if allowed is not None:  # a small pool: choose among the allowed tools directly
            return rng.sample(allowed, min(n, len(allowed)))
        chosen: list[str] = []
        seen: set[str] = set()
        while len(chosen) < n:  # rejection sampling: the pool is at least 4x larger than what is excluded
            tool = pool[rng.randrange(len(pool))]
            if tool in gold or tool in seen:
                continue
            seen.add(tool)
            chosen.append(tool)
        return chosen


# ------------------------------------------------------------------------------------- sets


def tool_sets(data: TrainingData) -> dict[str, str]:
    """tool id → name of the training set it came from.

    Uses `data.tool_sets` when the data carries it; otherwise a tool belongs to the longest set name
    its id starts with (the benchmark folders' ids are prefixed by their set, e.g. `apibank::X`);
    tools matching no set name share the group ''.
    """
    known = getattr(data, "tool_sets", None)
    if known:
        return dict(known)
    names = sorted(data.sets, key=len, reverse=True)
    return {tid: next((s for s in names if tid.startswith(s)), "") for tid in data.tools}


def query_set(query: Query, sets_of_tools: Mapping[str, str]) -> str:
    return sets_of_tools.get(query.labels[0], "") if query.labels else ""


# ------------------------------------------------------------------------------------- examples


def training_pairs(queries: Sequence[Query], tool_ids: set[str] | frozenset[str]) -> list[tuple[int, str]]:
    """(query index, gold tool id) for every gold tool of every query (labels outside the catalog skipped)."""
    pairs = []
    for qi, query in enumerate(queries):
        for label in dict.fromkeys(query.labels):
            if label in tool_ids:
                pairs.append((qi, label))
    return pairs


@dataclass(frozen=True)
class PairSetup:
    """What the pair trainers (`fit_embed`, `fit_cross`) start from: every (query, gold tool) pair, the
    training set of each tool and of each pair (for balancing), and the tool texts."""

    pairs: list[tuple[int, str]]
    sets_of_tools: dict[str, str]
    pair_groups: list[str]
    documents: dict[str, str]

    @classmethod
    def of(cls, data: TrainingData, view: TextView) -> "PairSetup":
        pairs = training_pairs(data.train, frozenset(data.tools))
        if not pairs:
            raise ValueError("no (query, tool) pairs: the training queries' labels name no tool of the catalog")
        sets_of_tools = tool_sets(data)
        return cls(pairs, sets_of_tools, [sets_of_tools.get(tool, "") for _qi, tool in pairs],
                   {tid: tool_text(tool, view) for tid, tool in data.tools.items()})


def epoch_examples(pairs: Sequence[tuple[int, str]], groups: Sequence[str], balance: str, seed: int,
                   epoch: int) -> list[tuple[int, str]]:
    """The pairs of one epoch, shuffled; deterministic for (seed, epoch).

    'size': each pair once. 'sets': the epoch keeps the same number of examples, split evenly over the
    groups (`groups[i]` is pair i's set): a group with fewer pairs than its share repeats them (each
    pair as evenly as possible), a bigger group contributes a random subset that changes every epoch.
    """
    rng = random.Random(seed * 1_000_003 + epoch)
    if balance == "size":
        chosen = list(pairs)
    elif balance == "sets":
        by_group: dict[str, list[tuple[int, str]]] = {}
        for pair, group in zip(pairs, groups):
            by_group.setdefault(group, []).append(pair)
        share = len(pairs) // max(1, len(by_group))
        chosen = []
        for group in sorted(by_group):
            members = by_group[group]
            repeats, rest = divmod(share, len(members))
            chosen.extend(members * repeats)
            chosen.extend(rng.sample(members, rest))
    else:
        raise ValueError(f"balance must be one of {', '.join(BALANCES)}, got {balance!r}")
    rng.shuffle(chosen)
    return chosen


def make_batches(examples: Sequence[tuple[int, str]], queries: Sequence[Query], sampler: RandomNegatives,
                 negatives: int, batch_size: int, seed: int, epoch: int) -> list[list[Example]]:
    """Cut an epoch into batches and draw each pair's random negatives (deterministic per epoch)."""
    rng = random.Random(seed * 7_919 + epoch + 1)
    batches = []
    for start in range(0, len(examples), batch_size):
        batch = []
        for qi, tool in examples[start:start + batch_size]:
            gold = frozenset(queries[qi].labels)
            batch.append(Example(qi, tool, tuple(sampler.sample(gold, negatives, rng, like=tool))))
        batches.append(batch)
    return batches


class MinedNegatives:
    """Per training query, the top `per_query` non-gold tools a first-stage retriever ranks among the
    tools of the query's own training set (`filters`: set name → Filter; no entry: the whole catalog).

    Mined on first use and kept: the miner is fixed, so the lists are the same on every call and a
    resumed run sees the negatives it saw before.
    """

    def __init__(self, miner, queries: Sequence[Query], sets_of_tools: Mapping[str, str],
                 filters: Mapping[str, Filter], per_query: int, depth: int):
        self.miner, self.queries, self.sets_of_tools = miner, queries, sets_of_tools
        self.filters, self.per_query, self.depth = filters, per_query, depth
        self.mined: dict[int, tuple[str, ...]] = {}

    def __call__(self, query_indices: Sequence[int]) -> dict[int, tuple[str, ...]]:
        from .negatives import mine_hard_negatives

        todo: dict[str, list[int]] = {}
        for qi in dict.fromkeys(query_indices):
            if qi not in self.mined:
                todo.setdefault(query_set(self.queries[qi], self.sets_of_tools), []).append(qi)
        for set_name, indices in sorted(todo.items()):
            found = mine_hard_negatives(self.miner, [self.queries[i] for i in indices], per_query=self.per_query,
                                        depth=self.depth, filter=self.filters.get(set_name))
            self.mined.update({qi: tuple(ids) for qi, ids in zip(indices, found)})
        return {qi: self.mined[qi] for qi in query_indices}


def set_filters(sets_of_tools: Mapping[str, str]) -> dict[str, Filter]:
    """set name → a Filter allowing only that set's tools (empty when there is a single set)."""
    members: dict[str, list[str]] = {}
    for tool_id, name in sets_of_tools.items():
        members.setdefault(name, []).append(tool_id)
    return {name: Filter.make(ids=ids) for name, ids in members.items()} if len(members) > 1 else {}


# ------------------------------------------------------------------------------------- what trains


_LAYER = re.compile(r"(?:^|\.)layers?\.(\d+)\.")


def freeze_parameters(model, trainable: str) -> list[str]:
    """Set `requires_grad` on `model`'s parameters for `trainable` and return the trainable names.

    'all': every parameter. 'layers': all but the embedding block (token, position and type
    embeddings and their LayerNorm: parameter names containing `embeddings.`) and the BERT pooler
    (`pooler.`, which sentence-transformers' pooling never reads). 'top:N': only the top N transformer
    layers (names with `layer.I.`, I among the N highest) and modules after the transformer (e.g. a
    Dense projection); the embedding block, the lower layers and the pooler stay frozen.
    """
    named = list(model.named_parameters())
    layer_of = {name: int(m.group(1)) for name, _ in named if (m := _LAYER.search(name))}
    in_embeddings = {name for name, _ in named if "embeddings." in name}
    if trainable == "all":
        keep = {name for name, _ in named}
    elif trainable == "layers":
        if not in_embeddings:
            raise ValueError("trainable='layers': the model has no embedding parameters (names with "
                             "'embeddings.') to freeze; use trainable='all'")
        keep = {name for name, _ in named if name not in in_embeddings and "pooler." not in name}
    elif trainable.startswith("top:") and trainable[4:].isdigit() and int(trainable[4:]) >= 1:
        if not layer_of:
            raise ValueError(f"trainable={trainable!r}: found no transformer layers (names with 'layer.N.') "
                             "in the model; use trainable='all' or 'layers'")
        n_layers = max(layer_of.values()) + 1
        lowest = max(0, n_layers - int(trainable[4:]))
        first_module = named[0][0].split(".", 1)[0]  # the transformer module of a sentence-transformers model
        keep = {name for name, _ in named
                if (name in layer_of and layer_of[name] >= lowest) or name.split(".", 1)[0] != first_module}
    else:
        raise ValueError(f"trainable must be 'all', 'layers' or 'top:N' (N >= 1), got {trainable!r}")
    for name, param in named:
        param.requires_grad_(name in keep)
    return [name for name, _ in named if name in keep]


# ------------------------------------------------------------------------------------- model


LENGTH_CHUNK = 32  # texts per forward pass when a batch is encoded in chunks of similar length


def embed_texts(model, texts: Sequence[str], max_length: int, device: str, chunk: int | None = None):
    """Unit embeddings of `texts` through the SentenceTransformer's modules, with gradients.

    With `chunk` (default `LENGTH_CHUNK`; 0 = one batch), the texts are sorted by token count and
    encoded `chunk` at a time, each chunk padded only to its own longest text: the same embeddings as
    one padded batch (padding is masked out), for less work when a few long tool documents would
    otherwise pad every text of the batch (the training sets' documents have a median of 22-54 tokens,
    the longest 128+). Measured on 2 busy cores, a step of 32 pairs with 3 random negatives each: about
    35 s instead of 45 s.
    """
    import torch
    import torch.nn.functional as F

    chunk = LENGTH_CHUNK if chunk is None else chunk
    features = _tokenize(model, list(texts), max_length)
    n = len(texts)
    if not chunk or n <= chunk or "attention_mask" not in features:
        features = {k: (v.to(device) if hasattr(v, "to") else v) for k, v in features.items()}
        return F.normalize(model(features)["sentence_embedding"], p=2.0, dim=-1)
    lengths = features["attention_mask"].sum(dim=1)
    order = torch.argsort(lengths, stable=True)
    parts = []
    for start in range(0, n, chunk):
        rows = order[start:start + chunk]
        width = int(lengths[rows].max())
        part = {k: (v[rows, :width].to(device) if torch.is_tensor(v) and v.dim() == 2 and v.shape[0] == n
                    else v[rows].to(device) if torch.is_tensor(v) and v.dim() == 1 and v.shape[0] == n else v)
                for k, v in features.items()}
        parts.append(model(part)["sentence_embedding"])
    embeddings = torch.empty((n, parts[0].shape[1]), dtype=parts[0].dtype, device=parts[0].device)
    embeddings = embeddings.index_copy(0, order.to(embeddings.device), torch.cat(parts))
    return F.normalize(embeddings, p=2.0, dim=-1)


def _tokenize(model, texts: list[str], max_length: int) -> dict:
    old = model.max_seq_length
    model.max_seq_length = max_length
    try:  # sentence-transformers >= 6 calls it `preprocess`; `tokenize` is the older (deprecated) name
        prepare = getattr(model, "preprocess", None) or model.tokenize
        return prepare(texts)
    finally:
        model.max_seq_length = old


class BatchLoss:
    """Turns a batch of `Example`s into the training loss (InfoNCE or triplet)."""

    def __init__(self, model, queries: Sequence[Query], documents: Mapping[str, str], *, loss: str, tau: float,
                 margin: float, max_query_length: int, max_doc_length: int, device: str,
                 mined: MinedNegatives | None = None):
        if loss not in LOSSES:
            raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {loss!r}")
        self.model, self.queries, self.documents, self.mined = model, queries, documents, mined
        self.loss, self.tau, self.margin = loss, tau, margin
        self.max_query_length, self.max_doc_length, self.device = max_query_length, max_doc_length, device

    def __call__(self, batch: Sequence[Example]):
        import torch

        from .losses import info_nce

        query_ids = list(dict.fromkeys(ex.query for ex in batch))
        if self.mined is not None:  # each example also gets its query's mined negatives
            mined = self.mined(query_ids)
            batch = [replace(ex, negatives=tuple(dict.fromkeys(ex.negatives + mined[ex.query]))) for ex in batch]
        tool_ids = list(dict.fromkeys([ex.tool for ex in batch] + [n for ex in batch for n in ex.negatives]))
        q = embed_texts(self.model, [self.queries[i].text for i in query_ids], self.max_query_length, self.device)
        t = embed_texts(self.model, [self.documents[i] for i in tool_ids], self.max_doc_length, self.device)
        if self.loss == "infonce":
            positives = torch.tensor([[tid in set(self.queries[qi].labels) for tid in tool_ids] for qi in query_ids],
                                     dtype=torch.bool, device=q.device)
            return info_nce(q, t, positives, tau=self.tau, multi_positive=True)
        row = {qi: r for r, qi in enumerate(query_ids)}
        col = {tid: c for c, tid in enumerate(tool_ids)}
        anchors, pos, neg = [], [], []
        for ex in batch:
            for negative in ex.negatives:
                anchors.append(row[ex.query])
                pos.append(col[ex.tool])
                neg.append(col[negative])
        if not anchors:
            raise ValueError("loss='triplet' needs negatives >= 1 and a catalog with non-gold tools")
        a = q[torch.tensor(anchors, device=q.device)]
        s_pos = (a * t[torch.tensor(pos, device=q.device)]).sum(-1)
        s_neg = (a * t[torch.tensor(neg, device=q.device)]).sum(-1)
        return torch.relu(self.margin - s_pos + s_neg).mean()


def _training_encoder(model, name: str):
    """A toolscout Encoder that encodes with the live (training) torch model."""
    from ..encoders import Encoder

    return Encoder(name=name, path=name, device=str(model.device), backend="torch", _model=model)


class SetValidation:
    """Macro nDCG@10 over the training sets: each set's validation queries ranked among its own tools.

    To stay cheap while the model changes under it (every call re-encodes the tools), at most
    `max_queries` queries are used (split evenly over the sets) and each set's candidates are its
    validation queries' gold tools plus random other tools of the set, `max_tools` per set at most.
    """

    def __init__(self, model, data: TrainingData, view: TextView, sets_of_tools: Mapping[str, str],
                 max_queries: int | None, max_tools: int | None, seed: int, doc_length: int):
        self.model, self.view, self.doc_length = model, view, doc_length
        by_set: dict[str, list[Query]] = {}
        for q in data.validation:
            by_set.setdefault(query_set(q, sets_of_tools), []).append(q)
        per_set = None if not max_queries else max(1, max_queries // max(1, len(by_set)))
        rng = random.Random(seed)
        self.queries = {s: (rng.sample(qs, per_set) if per_set and len(qs) > per_set else qs)
                        for s, qs in sorted(by_set.items())}
        self.candidates: dict[str, list[str]] = {}
        for name, queries in self.queries.items():
            members = [t for t in data.tools if sets_of_tools.get(t, "") == name]
            gold = list(dict.fromkeys(label for q in queries for label in q.labels if label in data.tools))
            others = [t for t in members if t not in set(gold)]
            room = len(others) if max_tools is None else max(0, max_tools - len(gold))
            self.candidates[name] = gold + (rng.sample(others, room) if room < len(others) else others)
        ids = list(dict.fromkeys(t for c in self.candidates.values() for t in c))
        self.tools = [data.tools[t] for t in ids]
        self.filters = {s: Filter.make(ids=c) for s, c in self.candidates.items()}
        self.per_set: dict[str, float] = {}

    def __len__(self) -> int:
        return sum(len(q) for q in self.queries.values())

    def __call__(self, summary_weight: float = 0.0) -> float:
        """`summary_weight`: the summary blend the model is ranked with; 0 (the default) for weights being
        trained on the single view, the starting model's own for the starting model (as it is used)."""
        from ..retrievers.dense import DenseRetriever

        old = self.model.max_seq_length
        self.model.max_seq_length = self.doc_length  # cheap and close to what training sees
        try:
            retriever = DenseRetriever(encoder=_training_encoder(self.model, "training"), view=self.view,
                                       batch_size=64, summary_weight=summary_weight)
            retriever.index(self.tools)
        finally:
            self.model.max_seq_length = old
        self.per_set = {}
        for name, queries in self.queries.items():
            flt = self.filters[name]
            self.per_set[name] = validation_ndcg(lambda texts, k, f=flt: retriever.search(texts, k, filter=f), queries)
        return sum(self.per_set.values()) / len(self.per_set)


# ------------------------------------------------------------------------------------- fit


def _check_embed_options(loss: str, balance: str, negatives_from: str, miner: str, hard_negatives: int,
                         mine_depth: int) -> None:
    """Refuse unknown `fit_embed` options before any model is loaded."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {loss!r}")
    if balance not in BALANCES:
        raise ValueError(f"balance must be one of {', '.join(BALANCES)}, got {balance!r}")
    if negatives_from not in ("set", "all"):
        raise ValueError(f"negatives_from must be 'set' or 'all', got {negatives_from!r}")
    if miner not in MINERS:
        raise ValueError(f"miner must be one of {', '.join(MINERS)}, got {miner!r}")
    if hard_negatives < 0 or mine_depth < 1:
        raise ValueError(f"hard_negatives must be >= 0 and mine_depth >= 1, got {hard_negatives}, {mine_depth}")


@dataclass
class StartingModel:
    """The model a run starts from, as validation saw it: ranked as it is used on its own, with `weight`, its
    summary blend (`default_summary_weight`; a pretrained encoder's 0.3). A run that does not beat it keeps its
    weights and that blend, which the directory records, so the directory ranks exactly as the start does."""

    weight: float
    score: float | None = None
    per_set: dict = field(default_factory=dict)
    state: dict | None = None

    @classmethod
    def validated(cls, st_model, validate: "SetValidation | None", weight: float) -> "StartingModel":
        """Its validation score and weights (none without `validate`)."""
        if validate is None:
            return cls(weight)
        return cls(weight, validate(weight), dict(validate.per_set), _copy_state(st_model))

    def kept_if_better(self, st_model, summary: RunSummary) -> bool:
        """Training that never beat the starting model on validation: the starting weights are put back, and
        the summary says so."""
        if self.state is None or summary.best_validation is None or self.score < summary.best_validation:
            return False
        st_model.load_state_dict(self.state)
        summary.best_validation, summary.best_step = round(self.score, 3), 0
        summary.discarded_for = ("training discarded: the starting model validated better and was kept, to rank "
                                 "as it does")
        return True


def _validation_record(validate, start: StartingModel) -> dict:
    """The validation figures a run's summary keeps: query count, the start and the last per-set scores."""
    record = {"validation_queries": len(validate) if validate is not None else 0}
    if start.score is not None:
        record["start_validation"] = round(start.score, 3)
        record["start_validation_per_set"] = {k: round(v, 3) for k, v in start.per_set.items()}
    if validate is not None and validate.per_set:
        record["last_validation_per_set"] = {k: round(v, 3) for k, v in validate.per_set.items()}
    return record


def _mined_negatives(data: TrainingData, model: str | None, sets_of_tools, hard_negatives: int, miner: str,
                     mine_depth: int) -> "MinedNegatives | None":
    """The hard-negative miner for `hard_negatives` > 0, else None."""
    if not hard_negatives:
        return None
    from .negatives import build_miner  # the same miners ToolCLIP's hard-negative stage uses

    return MinedNegatives(build_miner(miner, model or "default", list(data.tools.values())), data.train,
                          sets_of_tools, set_filters(sets_of_tools), hard_negatives, mine_depth)


def fit_embed(data: TrainingData, out: str | Path, *, model: str | None = None, config: TrainConfig | None = None,
              resume: bool = True, negatives: int = 3, loss: str = "infonce", tau: float = 0.05,
              margin: float = 0.3, balance: str = "sets", negatives_from: str = "set", max_query_length: int = 64,
              max_doc_length: int = 128, max_validation: int | None = 500, max_validation_tools: int | None = 300,
              validate_start: bool = True, view: TextView | dict | None = None, trainable: str = "all",
              hard_negatives: int = 0, miner: str = "dense", mine_depth: int = 30) -> RunSummary:
    """Fine-tune a sentence-transformers model on `data.train` and write a model directory to `out`.

    `model`: base encoder name/path (default all-MiniLM-L6-v2) or an earlier `train embed` directory.
    `negatives`: random negative tools per pair. `loss`: 'infonce' (τ=`tau`) or 'triplet' (`margin`).
    `balance`: 'size' or 'sets' (see the module doc). `negatives_from`: 'set' draws a pair's random
    negatives from the tools of its own training set, 'all' from every training tool. Validation uses at
    most `max_validation` queries and `max_validation_tools` candidate tools per set (see
    `SetValidation`). `validate_start`: also validate the starting model (see `StartingModel`), so the
    summary shows the gain and a run that only got worse keeps the starting model. `trainable`: 'all',
    'layers' or 'top:N' (see `freeze_parameters`). `hard_negatives`: mined negatives per query (`miner`
    'dense' or 'bm25', among its top `mine_depth` within the query's own set; see `MinedNegatives`), added
    to the random ones.
    """
    from ..retrievers.dense import default_summary_weight, encoder_for
    from .loop import pick_device

    _check_embed_options(loss, balance, negatives_from, miner, hard_negatives, mine_depth)
    config = config or TrainConfig()
    view = TextView.from_dict(view) if isinstance(view, dict) else (view or TextView())
    device = pick_device(config.device)
    base = encoder_for(model, backend="torch", device=device)
    st_model = base.model
    base_name = base.name
    trained_names = freeze_parameters(st_model, trainable)

    queries = data.train
    setup = PairSetup.of(data, view)
    pairs, sets_of_tools, groups, documents = setup.pairs, setup.sets_of_tools, setup.pair_groups, setup.documents
    sampler = RandomNegatives(list(data.tools), groups=sets_of_tools if negatives_from == "set" else None)

    @lru_cache(maxsize=2)
    def epoch_batches(epoch: int):
        examples = epoch_examples(pairs, groups, balance, config.seed, epoch)
        return make_batches(examples, queries, sampler, negatives, config.batch_size, config.seed, epoch)

    validate = None
    if data.validation:
        validate = SetValidation(st_model, data, view, sets_of_tools, max_validation, max_validation_tools,
                                 config.seed, max_doc_length)
    mined = _mined_negatives(data, model, sets_of_tools, hard_negatives, miner, mine_depth)
    batch_loss = BatchLoss(st_model, queries, documents, loss=loss, tau=tau, margin=margin,
                           max_query_length=max_query_length, max_doc_length=max_doc_length, device=device,
                           mined=mined)
    made_with = run_settings(data, model, negatives=negatives, loss=loss, tau=tau, margin=margin, balance=balance,
                             negatives_from=negatives_from, max_query_length=max_query_length,
                             max_doc_length=max_doc_length, view=view, trainable=trainable,
                             hard_negatives=hard_negatives, miner=miner, mine_depth=mine_depth)
    trainer = Trainer("embed", st_model, batch_loss, epoch_batches, config, out, validate=validate,
                      made_with=made_with)

    trainer.will_resume(resume)  # a checkpoint made with other settings is refused before the start validation
    start = StartingModel.validated(st_model, validate if validate_start else None, default_summary_weight(model))
    summary = trainer.fit(resume=resume)
    kept_start = start.kept_if_better(st_model, summary)
    st_model.eval()
    summary.data = {**data.summary(), "pairs": len(pairs),
                    "examples_per_epoch": sum(len(b) for b in epoch_batches(0)), "balance": balance,
                    **_validation_record(validate, start)}
    summary.config = {**summary.config, "base_model": base_name, "loss": loss, "tau": tau, "margin": margin,
                      "negatives": negatives, "negatives_from": negatives_from, "balance": balance,
                      "max_query_length": max_query_length,
                      "max_doc_length": max_doc_length, "trainable": trainable,
                      "trainable_parameters": len(trained_names), "hard_negatives": hard_negatives,
                      "miner": miner if hard_negatives else None, "mine_depth": mine_depth}

    model_config = model_base("embed", base_model=base_name, encoder="encoder", view=view.to_dict(),
                              summary_weight=start.weight if kept_start else 0.0, loss=loss, trainable=trainable,
                              summary=summary.to_dict())
    with write_artifact(out, model_config) as folder, quiet_transformers():
        st_model.save(str(folder / "encoder"))
        write_json(folder / "summary.json", summary.to_dict())
    trainer.finish()
    return summary


def training_config(config: TrainConfig | None, **changes) -> TrainConfig:
    """A copy of `config` (or the defaults) with `changes` applied (None values ignored)."""
    return replace(config or TrainConfig(), **{k: v for k, v in changes.items() if v is not None})
