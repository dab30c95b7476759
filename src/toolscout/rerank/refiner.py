"""ToolRefiner (the Tool2Vec paper §4.3): rerank all of a query's candidates in one forward pass.

The input sequence is the query's word pieces followed by one extra position per candidate tool:

    [CLS] query tokens [SEP] | c_1 c_2 ... c_N
                               c_i = LayerNorm-ed( P · v_i ) + position(cap + i) + type(1)

plus z_i · s, with z_i the candidate's first-stage score standardised within the query's list and s a
learned vector. The output is a residual over the first stage: logit_i = head(h_i) + a · z_i + b, with the
head initialised to zero, so an untrained (or briefly trained) refiner ranks exactly as the first stage
did and training only has to learn corrections (without this, short CPU runs ranked slightly worse than
Tool2Vec alone: rotbench validation 88.08 vs 88.22 after one epoch).

`v_i` is the candidate's vector and `P` a learned projection into the transformer's embedding space. Every
position attends to every other, so a candidate is judged against the query *and* against its rivals.
A linear head gives one logit per candidate position; training is binary cross-entropy against "this
tool is needed". The transformer starts from the default encoder's weights (all-MiniLM-L6-v2; the paper
used DeBERTa-v3-xsmall, which is not available offline here).

Candidate positions use position ids `cap + i` (cap = the query length limit), so a candidate's slot
never depends on how long the query is, and the rank order of the first stage is visible to the model.

Where candidate vectors come from at search time (`vectors` setting, saved with the model):
  "tool2vec"    — the Tool2Vec vectors the refiner was trained with, whatever the first stage (the paper
                  reads precomputed Tool2Vec vectors behind MLC too): the model directory carries their
                  usage table (`usage.npz`) and prior, and a tool's vector is that usage blended with its
                  description embedding (the description encoder's), exactly as the Tool2Vec retriever makes
                  it; a tool with no usage is its description embedding, as in Tool2Vec. What
                  `train refiner` writes behind a tool2vec or mlc first stage. The usage is the one it
                  was trained with: usage a Tool2Vec retriever takes in later (`add_usage`) is not read.
  "first_stage" — the first stage's stored vectors (`retriever.store.get(ids)`), when it has them with the
                  dimension the refiner was trained on; otherwise the tool's description embedding (and a
                  warning, because the refiner was trained on other vectors). What `train refiner` writes
                  behind a dense first stage, and what refiners trained before "tool2vec" existed hold;
  "description" — always the description embedding.
"""

from __future__ import annotations

import threading
import warnings
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..artifacts import ArtifactError, read_config
from ..encoders import few_torch_threads, quiet_transformers
from ..errors import require
from ..models import model_config
from ..results import Results
from ..retrievers.base import Encoding
from ..tool import TextView, Tool, content_hash, tool_text
from .base import DEFAULT_DEPTH, FORMAT_VERSION, check_candidates, reordered, write_reranker_config

VECTOR_SOURCES = ("tool2vec", "first_stage", "description")
HEADS_FILE = "heads.pt"
USAGE_FILE = "usage.npz"  # the carried Tool2Vec usage table ("tool2vec" vectors)


def build_refiner_net(transformer, vector_dim: int, query_cap: int):
    """The torch module: `transformer` is a BERT-style HF model (word, position and type embeddings)."""
    from .refiner_net import RefinerNet

    return RefinerNet(transformer, vector_dim, query_cap)


def padded_candidates(vectors: Sequence[np.ndarray], scores: Sequence[np.ndarray],
                      dim: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(vectors [B, N, dim], mask [B, N], first-stage scores [B, N]) of B queries' candidates, padded to the
    most candidates N (at least 1); the mask is 0 on padded slots."""
    n = max(1, max((len(v) for v in vectors), default=0))
    batch_vectors = np.zeros((len(vectors), n, dim), dtype=np.float32)
    mask = np.zeros((len(vectors), n), dtype=np.int64)
    batch_scores = np.zeros((len(vectors), n), dtype=np.float32)
    for i, (v, sc) in enumerate(zip(vectors, scores)):
        batch_vectors[i, :len(v)] = v
        mask[i, :len(v)] = 1
        batch_scores[i, :len(v)] = sc
    return batch_vectors, mask, batch_scores


def load_transformer(path: str):
    """The HF transformer and tokenizer of a sentence-transformers folder (or a plain HF folder)."""
    from transformers import AutoModel, AutoTokenizer

    with quiet_transformers():  # no load report or progress bars: loading a known model is not news
        return AutoModel.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def carried_usage(folder: Path, config: Mapping[str, Any], dim: int):
    """(usage table, prior) of the Tool2Vec vectors a refiner directory carries ("tool2vec" vectors)."""
    from ..retrievers.tool2vec import UsageTable

    path = folder / USAGE_FILE
    if not path.exists():
        raise ArtifactError(f"{path}: missing; this refiner's vectors are 'tool2vec' only when its directory "
                            "carries their usage table (refiners trained before that read vectors='first_stage')")
    return UsageTable.load(path, dim), float(config["prior"])


def _chosen_before(config: Mapping[str, Any]) -> list[str]:
    """What a pipeline saved before `chosen` existed had chosen: it recorded the model's depth and vectors of
    that day too. Vectors could only be chosen away from the default then ('description'); a depth other
    than the model's was chosen. The rest is the model's own now (a refiner trained again in place has its
    own)."""
    trained = model_config(config["model"], method="refiner")
    own_depth = trained[1].get("depth", DEFAULT_DEPTH) if trained is not None else None
    return ((["depth"] if config.get("depth") not in (None, own_depth) else [])
            + (["vectors"] if config.get("vectors") == "description" else []))


class ToolRefinerReranker:
    """A trained ToolRefiner (`toolscout train refiner --out DIR`) as a pipeline's second stage.

    `depth`: candidates per query (default: the N it was trained with).
    """

    name = "refiner"
    settings = ("depth", "vectors", "batch_size", "device")

    def __init__(self, model: str, depth: int | None = None, vectors: str | None = None, batch_size: int = 16,
                 device: str = "cpu"):
        require("torch", "transformers", feature="the ToolRefiner reranker", extra="train")
        import torch

        trained = model_config(model, method="refiner")
        if trained is None:
            raise ArtifactError(f"{model}: not a ToolRefiner model directory (write one with `toolscout train refiner`)")
        folder, config = trained
        self.model_dir = str(Path(model).resolve())
        self.config = config
        self.depth = int(depth or config.get("depth", DEFAULT_DEPTH))
        self.vectors = vectors or config.get("vectors", "first_stage")
        # what a pipeline saves of them: only what was chosen, so that a refiner trained again in place
        # brings its own depth and vectors to the indexes that use it
        self.chosen = {"depth": depth, "vectors": vectors}
        if self.vectors not in VECTOR_SOURCES:
            raise ValueError(f"vectors must be one of {', '.join(VECTOR_SOURCES)}, got {self.vectors!r}")
        self.batch_size = batch_size
        self.device = device
        self.vector_dim = int(config["vector_dim"])
        self.query_cap = int(config["max_query_length"])
        self.view = TextView.from_dict(config.get("view"))
        self.description_encoder_name = config.get("description_encoder")
        self.usage, self.prior = (carried_usage(folder, config, self.vector_dim) if self.vectors == "tool2vec"
                                  else (None, 0.0))
        transformer, self.tokenizer = load_transformer(str(folder / "transformer"))
        self.net = build_refiner_net(transformer, self.vector_dim, self.query_cap)
        heads = torch.load(folder / HEADS_FILE, map_location="cpu", weights_only=True)
        missing, unexpected = self.net.load_state_dict(heads, strict=False)
        if unexpected or any(not k.startswith("transformer.") for k in missing):
            raise ArtifactError(f"{model}: {HEADS_FILE} does not match this version's ToolRefiner "
                                f"(unexpected {unexpected[:3]}, missing {[k for k in missing if not k.startswith('transformer.')][:3]})")
        self.net.to(device).eval()
        self._descriptions: dict[str, np.ndarray] = {}  # content hash -> description vector
        self._encoder = None
        self._warned = False
        self._lock = threading.Lock()  # one forward at a time (as PairScorer): torch modules are not thread-safe

    # vectors -----------------------------------------------------------------------------
    def candidate_vectors(self, ids: Sequence[str], tools: Mapping[str, Tool], first_stage: Any) -> np.ndarray:
        """[len(ids), D] vectors for the candidates (see the module doc for where they come from)."""
        if self.vectors == "tool2vec":
            return self.tool2vec_vectors([tools[i] for i in ids])
        if self.vectors == "first_stage":
            if isinstance(first_stage, Encoding) and first_stage.store.dim == self.vector_dim:
                return np.asarray(first_stage.store.get(list(ids)), dtype=np.float32)
            self._warn_fallback()
        return self.description_vectors([tools[i] for i in ids])

    def _warn_fallback(self) -> None:
        if self._warned:
            return
        self._warned = True
        retrain = (f" ({self.model_dir} was trained before refiners carried their Tool2Vec vectors: train it again "
                   "to rerank any first stage with them)" if self.config.get("first_stage") == "tool2vec" else "")
        warnings.warn("ToolRefiner: the first stage has no stored tool vectors of dimension "
                      f"{self.vector_dim}; using description embeddings, which it was not trained on{retrain}",
                      stacklevel=4)

    def tool2vec_vectors(self, tools: Sequence[Tool]) -> np.ndarray:
        """The carried Tool2Vec vectors of `tools`: their usage blended with their description embeddings."""
        descriptions = self.description_vectors(tools)
        return np.stack([self.usage.blended(t.id, d, self.prior) for t, d in zip(tools, descriptions)]) \
            if len(tools) else descriptions

    def description_vectors(self, tools: Sequence[Tool]) -> np.ndarray:
        texts = [tool_text(t, self.view) for t in tools]
        keys = [content_hash(text) for text in texts]
        missing = {key: text for key, text in zip(keys, texts) if key not in self._descriptions}
        if missing:
            if self._encoder is None:
                from ..retrievers.dense import encoder_for

                self._encoder = encoder_for(self.description_encoder_name)
            vectors = self._encoder.encode(list(missing.values()))
            self._descriptions.update(zip(missing, vectors))
        return np.stack([self._descriptions[key] for key in keys]) if keys else np.zeros((0, self.vector_dim), np.float32)

    # scoring -----------------------------------------------------------------------------
    def scores(self, queries: Sequence[str], vectors: Sequence[np.ndarray],
               prior: Sequence[np.ndarray]) -> list[np.ndarray]:
        """P(needed) for each query's candidates, from their vectors and first-stage scores (one array per query)."""
        # a few queries: one torch thread (measured: 27 ms vs 54-280 ms p50 for top-16 on 2 busy cores)
        with self._lock, few_torch_threads(len(queries)):
            return self._score_batches(queries, vectors, prior)

    def _score_batches(self, queries, vectors, prior) -> list[np.ndarray]:
        import torch

        out: list[np.ndarray] = []
        for start in range(0, len(queries), self.batch_size):
            chunk_q = list(queries[start:start + self.batch_size])
            chunk_v = vectors[start:start + self.batch_size]
            chunk_s = prior[start:start + self.batch_size]
            tokens = self.tokenizer(chunk_q, padding=True, truncation=True, max_length=self.query_cap,
                                    return_tensors="pt")
            batch_vectors, mask, batch_scores = padded_candidates(chunk_v, chunk_s, self.vector_dim)
            with torch.inference_mode():
                logits = self.net(tokens["input_ids"].to(self.device), tokens["attention_mask"].to(self.device),
                                  torch.from_numpy(batch_vectors).to(self.device), torch.from_numpy(mask).to(self.device),
                                  torch.from_numpy(batch_scores).to(self.device))
                probs = torch.sigmoid(logits).float().cpu().numpy()
            out.extend(probs[i, :len(v)] for i, v in enumerate(chunk_v))
        return out

    def rerank(self, queries: Sequence[str], candidates: Results, tools: Mapping[str, Tool],
               first_stage: Any = None) -> Results:
        check_candidates(queries, candidates)
        vectors = [self.candidate_vectors(list(ids), tools, first_stage) if len(ids) else
                   np.zeros((0, self.vector_dim), np.float32) for ids in candidates.ids]
        probs = self.scores(queries, vectors, list(candidates.scores))
        return reordered([(ids, p) for ids, p in zip(candidates.ids, probs)])

    # persistence -------------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        write_reranker_config(folder, self.name, model=self.model_dir, batch_size=self.batch_size,
                              chosen=sorted(k for k, v in self.chosen.items() if v is not None),
                              **{k: v for k, v in self.chosen.items() if v is not None})

    @classmethod
    def load(cls, folder: Path, **options: Any) -> "ToolRefinerReranker":
        _folder, config = read_config(folder, max_format=FORMAT_VERSION)
        chosen = config.get("chosen")
        if chosen is None:
            chosen = _chosen_before(config)
        settings = {"depth": config.get("depth") if "depth" in chosen else None,
                    "vectors": config.get("vectors") if "vectors" in chosen else None,
                    "batch_size": config.get("batch_size", 16), **options}
        return cls(config["model"], **settings)
