"""Tool-Rank as a small cross-encoder (the Tool-REX paper §2.5): score each (query, tool document) pair jointly.

The paper's Tool-Rank is Qwen3-Reranker-4B fine-tuned with LoRA; it reads a query and one tool document
and its score is P(relevant) = softmax over the logits of the answer tokens "true"/"false". Here the same
pointwise design runs on a CPU: a MiniLM-L6 encoder (the weights of the default dense encoder) reads
`[CLS] query [SEP] tool text [SEP]` and a one-logit classification head gives ℓ; the score is
sigmoid(ℓ) = P(relevant), the two-class softmax of the paper written with one logit (ℓ = ℓ_true − ℓ_false).
`toolscout train cross` fine-tunes it (see `toolscout.train.cross`) and picks on validation data how much
of the first stage's score to mix in (`first_stage_weight`; the paper's reranker replaces the first
stage's order outright, which a small CPU-trained model does not earn).

Unlike a bi-encoder, nothing can be precomputed per tool: every candidate costs one forward pass with the
query, which is why the reranker only sees the first stage's top `depth` candidates. The cost is plain
arithmetic: MiniLM-L6 does ~21 MFLOP per token, so 20 pairs of ~100–128 tokens are ~40–55 GFLOP, several
hundred ms on two CPU cores (measured on an idle 2-core machine at max_length 128: p50 354 ms for 20
candidates of the 43k-tool catalog, 423 ms for BFCL's longer tool texts; int8 dynamic quantisation gained
under 10% and changed the scores, so it is not offered). `depth`, `max_length` and `device` are the
latency knobs. What the code does to avoid waste on top of that:

- all pairs of a call (every query's candidates) are tokenised once by the Rust tokenizer, sorted by
  length and run in as few forward passes as `batch_size` and `MAX_BATCH_TOKENS` allow: padding only
  to the batch's longest pair (splitting 20 candidates into smaller batches measured slower, not faster);
- tool texts are cached by tool id and checked against the tool (an edited tool gets a fresh text);
- inference runs under `torch.inference_mode()`.

The model directory (kind `toolscout.model`, method `cross`) holds a plain Hugging Face model in
`model/` (`AutoModelForSequenceClassification`, also loadable by `sentence_transformers.CrossEncoder`),
the text view and `max_length` it was trained with, and the rerank depth it was validated at.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..artifacts import ArtifactError, read_config
from ..encoders import quiet_transformers
from ..models import model_config
from ..results import Results
from ..tool import TextView, Tool, tool_text
from .base import (
    DEFAULT_DEPTH,
    FORMAT_VERSION,
    RERANKER_KIND,
    check_candidates,
    fuse_with_first_stage,
    reordered,
    write_reranker_config,
)

METHOD = "cross"
DEFAULT_MAX_LENGTH = 192  # query + tool text tokens; API-Bank/ToolBench pairs rarely need more
MAX_BATCH_TOKENS = 8192  # padded tokens per forward pass: bounds memory for long pairs


# ------------------------------------------------------------------------------------- HF model


def load_pair_model(path: str | Path, device: str = "cpu"):
    """(tokenizer, model) of a sequence-classification model with one logit, from a folder or name.

    A plain encoder checkpoint (e.g. MiniLM) gets a freshly initialised head: call `torch.manual_seed`
    first for a reproducible start.
    """
    try:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer
    except ImportError:
        from ..errors import MissingDependency

        raise MissingDependency("transformers", "the cross-encoder reranker", extra="train") from None
    try:
        with quiet_transformers():
            tokenizer = AutoTokenizer.from_pretrained(str(path))
            model = AutoModelForSequenceClassification.from_pretrained(str(path), num_labels=1)
    except Exception as exc:  # many kinds (missing files, hub offline, bad config): one readable message
        raise OSError(f"could not load a cross-encoder from {str(path)!r}: {exc}") from exc
    if model.config.num_labels != 1:
        raise ValueError(f"{path}: a cross-encoder needs one output logit, this model has {model.config.num_labels}")
    model.to(device)
    model.eval()
    return tokenizer, model


def encode_pairs(tokenizer, queries: Sequence[str], documents: Sequence[str], max_length: int) -> dict:
    """Padded tensors for (query, document) pairs. 'longest_first' truncation trims whichever side is
    longer, so a long tool description cannot push the query out (nor a long dialogue the tool)."""
    return tokenizer(list(queries), list(documents), truncation="longest_first", max_length=max_length,
                     padding=True, return_tensors="pt")


class PairScorer:
    """Logits of a cross-encoder for many (query, document) pairs, length-sorted into batches.

    Shared by the reranker and by training-time validation so that both see exactly the same inputs.
    """

    def __init__(self, tokenizer, model, max_length: int = DEFAULT_MAX_LENGTH, batch_size: int = 32,
                 max_batch_tokens: int = MAX_BATCH_TOKENS):
        self.tokenizer, self.model = tokenizer, model
        self.max_length, self.batch_size = int(max_length), int(batch_size)
        self.max_batch_tokens = int(max_batch_tokens)
        self._lock = threading.Lock()  # torch modules are not safe to call from several threads at once

    def logits(self, queries: Sequence[str], documents: Sequence[str]) -> np.ndarray:
        import torch

        n = len(queries)
        if n != len(documents):
            raise ValueError(f"{n} queries but {len(documents)} documents")
        out = np.empty(n, dtype=np.float32)
        if n == 0:
            return out
        # Tokenise every pair once without padding; then pad per batch of similar lengths.
        encoded = self.tokenizer(list(queries), list(documents), truncation="longest_first",
                                 max_length=self.max_length)
        lengths = [len(ids) for ids in encoded["input_ids"]]
        order = np.argsort([-n for n in lengths], kind="stable")
        keys = list(encoded.keys())
        device = next(self.model.parameters()).device
        with self._lock, torch.inference_mode():
            was_training = self.model.training
            self.model.eval()
            try:
                start = 0
                while start < n:
                    width = max(1, lengths[order[start]])
                    size = max(1, min(self.batch_size, self.max_batch_tokens // width))
                    rows = order[start:start + size]
                    batch = self.tokenizer.pad({k: [encoded[k][i] for i in rows] for k in keys},
                                               padding=True, return_tensors="pt")
                    batch = {k: v.to(device) for k, v in batch.items()}
                    out[rows] = self.model(**batch).logits[:, 0].float().cpu().numpy()
                    start += size
            finally:
                if was_training:
                    self.model.train()
        return out

    def probabilities(self, queries: Sequence[str], documents: Sequence[str]) -> np.ndarray:
        return sigmoid(self.logits(queries, documents))


def sigmoid(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return (0.5 * (1.0 + np.tanh(0.5 * x))).astype(np.float32)  # overflow-free logistic


# ------------------------------------------------------------------------------------- reranker


def cross_model(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """(live folder, config) of a `toolscout train cross` directory; a clear ArtifactError otherwise."""
    if not Path(path).exists():
        raise ArtifactError(f"{path}: no such cross-encoder model directory (train one with `toolscout train cross`)")
    found = model_config(path)
    if found is None:
        raise ArtifactError(f"{path}: not a toolscout model directory; the cross reranker needs the output of "
                            "`toolscout train cross --out DIR`")
    folder, config = found
    if config.get("method") != METHOD:
        raise ArtifactError(f"{path}: is a {config.get('method')!r} model, not a {METHOD!r} model "
                            "(train one with `toolscout train cross`)")
    weights = folder / config.get("model", "model")
    if not (weights / "config.json").exists():
        raise ArtifactError(f"{path}: the cross-encoder weights are missing ({weights} has no config.json)")
    return folder, config


class CrossEncoderReranker:
    """Reranks candidates by P(relevant | query, tool text) from a `toolscout train cross` model directory.

    `model`: the model directory (recorded by absolute path; a later `train cross` into the same
    directory is picked up on the next load). `depth`: first-stage candidates per query (default: the
    depth the model was validated at, else 20). `view`: the tool text view (default: the one trained
    with). `max_length`: tokens per pair (default: the trained one). `device`: default cuda when
    available. `first_stage_weight` w: the returned score is (1 − w)·z(logit) + w·z(first-stage score)
    per query (`fuse_with_first_stage`); default: the weight `train cross` picked on validation data
    (0 for models trained before it did). With w = 0 the score is P(relevant).
    """

    name = METHOD
    settings = ("depth", "batch_size", "view", "max_length", "device", "first_stage_weight")

    def __init__(self, model: str | Path, depth: int | None = None, batch_size: int = 32,
                 view: TextView | dict | None = None, max_length: int | None = None, device: str | None = None,
                 first_stage_weight: float | None = None):
        from ..encoders import default_device

        if model is None:
            raise ValueError("CrossEncoderReranker needs model=DIR, a `toolscout train cross` directory")
        folder, config = cross_model(model)
        self.model_dir = str(Path(model).resolve())
        self.config = config
        self.depth = int(depth or config.get("depth") or DEFAULT_DEPTH)
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.batch_size = int(batch_size)
        self._view_override = TextView.from_dict(view) if isinstance(view, dict) else view
        self.view = self._view_override or TextView.from_dict(config.get("view"))
        self.max_length = int(max_length or config.get("max_length") or DEFAULT_MAX_LENGTH)
        self._max_length_override = max_length
        self.device = device or default_device()
        self._weight_override = first_stage_weight
        self.first_stage_weight = float(config.get("first_stage_weight", 0.0) if first_stage_weight is None
                                        else first_stage_weight)
        if not 0.0 <= self.first_stage_weight <= 1.0:
            raise ValueError(f"first_stage_weight must be in [0, 1], got {self.first_stage_weight}")
        tokenizer, net = load_pair_model(folder / config.get("model", "model"), device=self.device)
        self.scorer = PairScorer(tokenizer, net, max_length=self.max_length, batch_size=self.batch_size)
        self._texts: dict[str, tuple[Tool, str]] = {}  # id -> (the tool it was made from, its text)

    # texts -------------------------------------------------------------------------------
    def tool_text(self, tool: Tool) -> str:
        """The tool's text under the view, cached by id and checked against the tool's content (a tool
        edited under the same id gets a fresh text)."""
        hit = self._texts.get(tool.id)
        if hit is not None and (hit[0] is tool or hit[0] == tool):
            return hit[1]
        text = tool_text(tool, self.view)
        self._texts[tool.id] = (tool, text)
        return text

    # reranking ---------------------------------------------------------------------------
    def score(self, query: str, tools: Sequence[Tool]) -> np.ndarray:
        """P(relevant) of each tool for one query."""
        return self.scorer.probabilities([query] * len(tools), [self.tool_text(t) for t in tools])

    def rerank(self, queries: Sequence[str], candidates: Results, tools: Mapping[str, Tool],
               first_stage: Any = None) -> Results:
        if isinstance(queries, str):
            raise TypeError("rerank takes a list of queries; wrap a single query in a list")
        check_candidates(queries, candidates)
        pair_queries, pair_texts, spans = [], [], []
        for query, (ids, _scores) in zip(queries, candidates):
            start = len(pair_texts)
            for tid in ids:
                tool = tools.get(tid)
                if tool is None:
                    raise KeyError(f"candidate {tid!r} is not among the tools given to the reranker")
                pair_queries.append(query)
                pair_texts.append(self.tool_text(tool))
            spans.append((start, len(pair_texts)))
        # One call for the whole batch of queries: pairs of every query share length-sorted batches.
        logits = self.scorer.logits(pair_queries, pair_texts)
        w = self.first_stage_weight
        if w == 0.0:
            probs = sigmoid(logits)
            return reordered([(ids, probs[a:b]) for (ids, _s), (a, b) in zip(candidates, spans)])
        return reordered([(ids, fuse_with_first_stage(logits[a:b], scores, w))
                          for (ids, scores), (a, b) in zip(candidates, spans)])

    # persistence -------------------------------------------------------------------------
    def save(self, folder: Path) -> None:
        """A reranker folder that references the model directory (like a dense index references its
        encoder): the weights are not copied."""
        extra: dict[str, Any] = {}
        if self._view_override is not None:
            extra["view"] = self._view_override.to_dict()
        if self._max_length_override is not None:
            extra["max_length"] = int(self._max_length_override)
        if self._weight_override is not None:
            extra["first_stage_weight"] = float(self._weight_override)
        write_reranker_config(Path(folder), METHOD, model=self.model_dir, depth=self.depth,
                              batch_size=self.batch_size, **extra)

    @classmethod
    def load(cls, folder: str | Path, **options: Any) -> "CrossEncoderReranker":
        _folder, config = read_config(folder, kind=RERANKER_KIND, max_format=FORMAT_VERSION)
        if config.get("reranker") != METHOD:
            raise ArtifactError(f"{folder}: holds a {config.get('reranker')!r} reranker, not {METHOD!r}")
        keys = ("model", "depth", "batch_size", "view", "max_length", "first_stage_weight")
        settings = {key: config[key] for key in keys if config.get(key) is not None}
        settings.update(options)
        if "model" not in settings:
            raise ArtifactError(f"{folder}: the cross reranker config names no model directory")
        return cls(**settings)


__all__ = ["CrossEncoderReranker", "PairScorer", "load_pair_model", "encode_pairs", "cross_model", "sigmoid",
           "DEFAULT_MAX_LENGTH"]
