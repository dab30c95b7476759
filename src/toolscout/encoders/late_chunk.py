"""Late chunking: the vector of a part of a task from the task's own token vectors.

A multi-request task is searched whole and request by request (`toolscout.intents`); each request
remembers where it was cut from the task (`Query.part`). Encoding every request again costs another
forward pass per request (a split task cost 2.4 passes on average in the load test's traffic).
Instead, the task's forward pass keeps its token vectors, and a part's vector is their mean over the
part's characters, L2-normalised: what mean pooling does for a whole text, restricted to the part. The tokens still see the whole task, which did
not cost retrieval quality: on the validation carve of five dev sets (400 queries each, the default
pipeline, request weight 0.7) mean nDCG@10 / Completeness@10 62.63 / 63.69 encoding each request alone,
62.62 / 63.96 late-chunked (docs/default-model.md).

Only for models that pool by the mean of their tokens (the default and most sentence-transformers);
others, and a part whose characters the model truncated away, are encoded on their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class TokenRun:
    """One text's forward pass: its pooled vector, its token vectors and each token's character span
    ((0, 0) for special tokens such as [CLS] and [SEP])."""

    embedding: np.ndarray
    tokens: np.ndarray
    offsets: Sequence[tuple[int, int]]

    def span_vector(self, start: int, end: int) -> np.ndarray | None:
        """The unit mean of the tokens overlapping characters [start, end); None if none does."""
        rows = [i for i, (s, e) in enumerate(self.offsets[: len(self.tokens)]) if e > s and s < end and e > start]
        if not rows:
            return None
        mean = self.tokens[rows].mean(axis=0)
        norm = float(np.linalg.norm(mean))
        return (mean / norm).astype(np.float32) if norm > 0 else None


def onnx_token_runs(onnx, texts: Sequence[str]) -> list[TokenRun] | None:
    """Token runs by an `OnnxEncoder` whose export has token outputs and pools by the mean (else None)."""
    if "tokens" not in onnx.output_names or list(onnx.meta.get("pooling", [])) != ["mean"]:
        return None
    runs = []
    for encoding in onnx.tokenizer.encode_batch([str(t) for t in texts]):
        embedding, tokens = onnx.session_for(encoding).run(["embedding", "tokens"], onnx._feeds([encoding]))
        runs.append(TokenRun(embedding[0].astype(np.float32), tokens[0].astype(np.float32), encoding.offsets))
    return runs


def torch_token_runs(st_model, texts: Sequence[str]) -> list[TokenRun] | None:
    """Token runs by a SentenceTransformer that pools by the mean and has a fast tokenizer (else None)."""
    import torch

    from .onnx_export import OnnxUnavailable, pooling_spec

    try:
        if pooling_spec(st_model)["pooling"] != ["mean"]:
            return None
    except OnnxUnavailable:  # a pipeline of other modules: its pooling is not known
        return None
    runs = []
    device = next(st_model.parameters()).device
    for text in texts:
        features = st_model.tokenizer(str(text), return_offsets_mapping=True, truncation=True,
                                      max_length=st_model.max_seq_length, return_tensors="pt")
        offsets = [tuple(int(x) for x in pair) for pair in features.pop("offset_mapping")[0].tolist()]
        with torch.no_grad():
            out = st_model({k: v.to(device) for k, v in features.items()})
        pooled = out["sentence_embedding"][0].float().cpu().numpy()
        runs.append(TokenRun(pooled / max(float(np.linalg.norm(pooled)), 1e-12),
                             out["token_embeddings"][0].float().cpu().numpy(), offsets))
    return runs
